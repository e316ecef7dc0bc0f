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
broker (not ``serving``) is not added as live: it deregistered on purpose and clients should go
elsewhere (once its view saw its registration go, it lists itself as departed, as the others
list it).

A broker that deregistered (stopped, or its session expired) stays listed for a grace period
(``with_departed``): librdkafka ≥ 2.10 destroys the handle of any broker missing from a single
Metadata answer, and a transactional producer whose group coordinator's handle is destroyed
between AddOffsetsToTxn and TxnOffsetCommit waits on it forever, past the call's own timeout
(librdkafka #5511). Kept listed, the handle lives: its connection fails, and librdkafka asks
for a new coordinator a second later. A departed broker is never a leader, a coordinator or
the controller: only the list of brokers carries it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kafscale.broker.metadata.cluster import BrokerInfo, Departure


def listed_brokers(
    registered: Mapping[int, BrokerInfo], me: BrokerInfo | None, serving: bool
) -> list[BrokerInfo]:
    """The live brokers to list, by node id: ``registered`` plus ``me`` while ``serving``."""
    listed = dict(registered)
    if me is not None and serving:
        listed.setdefault(me.node_id, me)
    return [listed[node_id] for node_id in sorted(listed)]


def with_departed(
    live: list[BrokerInfo], departed: Mapping[int, Departure], now: float, grace_s: float
) -> list[BrokerInfo]:
    """``live`` plus the departed brokers younger than ``grace_s``, by node id.

    Not one whose address a live broker now advertises: that is a new process (a restart on
    the same port, a new pod given the dead pod's IP), and a client must not reach it under
    the dead id (``Broker._retire_predecessors``: a produce answered there could be retried
    once the client drops that id, and stored twice). A live id is never replaced."""
    listed = {b.node_id: b for b in live}
    taken = {address for b in live for address in addresses(b)}
    for node_id, departure in departed.items():
        if node_id in listed or now - departure.at >= grace_s:
            continue
        if taken.isdisjoint(addresses(departure.info)):
            listed[node_id] = departure.info
    return [listed[node_id] for node_id in sorted(listed)]


def addresses(info: BrokerInfo) -> Iterable[tuple[str, int]]:
    """Every address a registration advertises: its main one and each listener's."""
    yield info.host, info.port
    for _name, host, port in info.listeners:
        yield host, port


def controller_id(listed: list[BrokerInfo]) -> int:
    """The node id Metadata names controller: the lowest listed (every broker does what a
    controller does, through etcd); -1 with none listed. Given the live brokers only: the
    Java Admin sends CreateTopics and the like to the controller, and a departed one refuses
    connections."""
    return min((b.node_id for b in listed), default=-1)
