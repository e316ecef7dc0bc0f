"""The etcd key ranges a cluster view reads and watches: those of the keys it keeps, no more.

A cluster's prefix holds, besides what every broker must know (topics, brokers, partition
states, leases, the assignment, draining marks, group configs, ACLs, quotas, share groups),
what one broker writes per request for itself: each committed consumer offset
(``groups/<g>/offsets/...``), group metadata, transaction states, group leases, users.
Watching the whole prefix sent every one of those writes
to every broker and proxy to be decoded and dropped (an idle broker spent ~0.3 ms of CPU per
offset commit of another broker), and the start-up read carried every group's offsets in one
answer (bench/view_watch_cost.py; figures in docs/architecture.md).

Three ranges (one of them a single key) cover the kept kinds. Each watch costs a creation on the
client's one gRPC watch stream, and every creation is retried whenever etcd restarts or stalls
(aetcd queues at most ten requests on that stream), so the kinds are joined into as few ranges
as leave the per-request writers out: ``groups/`` (every offset commit) and ``transactions/``
(every transaction's state changes) lie outside them all. Inside the last range, besides what the
view keeps, are producer ids (one write per InitProducerId) and share-partition states (at most
one write per share-partition per flush round of its owner): bounded by clients and partitions,
not by requests. Topics, partition states and partition leases come in one stream, in revision
order. Pure.
"""

from __future__ import annotations

from kafscale.broker.metadata import keys

VIEW_RANGES: tuple[tuple[str, str], ...] = (
    # acls/, assignment, broker-ids/ (rare), brokers/, delegation-tokens/ (rare),
    # deleted-topics/ (rare), draining/, group-configs/: everything before groups/
    ("acls/", "group-configs0"),
    # The assigner role (``rebalancer``): a change wakes the brokers to campaign for it.
    ("leases/assigner", "leases/assigner\0"),
    # leases/partitions/, leases/transactions/ (one write per coordinator move), partitions/,
    # producer-ids/, producers/, quotas/, share-groups/, share-state/, topics/. Not
    # leases/groups/ (``GroupLeases`` watches those where they are needed).
    ("leases/partitions/", "topics0"),
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
