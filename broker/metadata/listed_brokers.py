"""Which brokers a broker lists in Metadata and DescribeCluster: a pure decision.

The registry in etcd, as the cluster view has it, and always the broker itself while it serves.
Its own registration goes missing from its view when its session lapsed (a freeze past the TTL:
etcd deleted everything bound to the session) until it has registered again on a new one, which
can take seconds on a loaded machine or through an etcd election. It then answered Metadata with
no brokers at all (the only one) or without itself: librdkafka drops a broker missing from the
list it is given (what was queued on it fails with ``_DESTROY_BROKER``), and a Kafka broker never
answers Metadata without listing itself.

Only the list changes. Leaders are still decided over the registered brokers alone, less this
one once etcd may no longer hold its session (``leaders.live_leaders``), so a lapsed broker
names itself leader of nothing: its ownership keys went with the session, and the partitions it
owned are another's to claim (or leaderless, -1, in a cluster of one until it is back). A stopping
broker (not ``serving``) is not added: it deregistered on purpose and clients should go
elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafscale.broker.metadata.cluster import BrokerInfo


def listed_brokers(
    registered: Mapping[int, BrokerInfo], me: BrokerInfo | None, serving: bool
) -> list[BrokerInfo]:
    """The brokers to list, by node id: ``registered`` plus ``me`` while ``serving``."""
    listed = dict(registered)
    if me is not None and serving:
        listed.setdefault(me.node_id, me)
    return [listed[node_id] for node_id in sorted(listed)]


def controller_id(listed: list[BrokerInfo]) -> int:
    """The node id Metadata names controller: the lowest listed (every broker does what a
    controller does, through etcd); -1 with none listed."""
    return min((b.node_id for b in listed), default=-1)
