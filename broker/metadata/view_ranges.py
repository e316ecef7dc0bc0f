"""The etcd key ranges a cluster view reads and watches: those of the keys it keeps, no more.

A cluster's prefix holds, besides what every broker must know (topics, brokers, partition
states, leases, the assignment, draining marks, group configs, ACLs, quotas, share groups),
everything written per request by one broker for itself: each committed consumer offset
(``groups/<g>/offsets/...``), share-partition states, transaction states, producer ids, group
and transaction leases, users, tokens. Watching the whole prefix sent every one of those writes
to every broker and proxy to be decoded and dropped (an idle broker spent ~0.3 ms of CPU per
offset commit of another broker), and the start-up read carried every group's offsets in one
answer (bench/view_watch_cost.py; figures in docs/architecture.md).

The ranges below cover the kept kinds; neighbouring kinds are joined into one range where
whatever lies between them is written rarely (broker ids, delegation tokens, deleted-topic
marks, transaction-coordinator leases), so fewer watches run and the related kinds of one range
(partition leases and partition states) arrive in one stream, in revision order. Pure.
"""

from __future__ import annotations

from kafscale.broker.metadata import keys

VIEW_RANGES: tuple[tuple[str, str], ...] = (
    # acls/, assignment, broker-ids/ (rare), brokers/, delegation-tokens/ (rare),
    # deleted-topics/ (rare), draining/, group-configs/: everything before groups/
    ("acls/", "group-configs0"),
    # leases/partitions/, leases/transactions/ (one write per coordinator move), partitions/.
    # Not leases/groups/ (``GroupLeases`` watches those) nor leases/assigner: the assigner's
    # key is bound to its session, so it goes with the holder's brokers/<id> (in the first
    # range), and the rebalancer reads it from etcd when the view changes.
    ("leases/partitions/", "partitions0"),
    ("quotas/", "quotas0"),
    ("share-groups/", "share-groups0"),
    ("topics/", "topics0"),
)
"""(first key, end key) relative to the cluster prefix, each end exclusive (``0`` is the byte
after ``/``), in key order, not overlapping."""


def view_ranges(cluster: str) -> list[tuple[str, str]]:
    """The absolute ``[start, end)`` ranges of ``cluster``'s keys a cluster view follows."""
    prefix = keys.cluster_prefix(cluster)
    return [(prefix + start, prefix + end) for start, end in VIEW_RANGES]


def in_view(cluster: str, key: str) -> bool:
    """Whether ``key`` lies in a range the cluster view follows."""
    return any(start <= key < end for start, end in view_ranges(cluster))
