"""Which broker Metadata names as a partition's leader: a pure decision.

The lease holder if it is alive; else the desired owner from the assignment if it is alive and
not draining; else a stable pick among the live, non-draining brokers, the same on every
broker, so that clients of every broker send a leaderless partition's produce to one place,
which then claims the lease on demand.

A broker whose etcd may no longer hold its session lease (lost, or woken from a freeze past its
TTL before the view has heard that etcd deleted its ownership keys) counts as not alive for this
(``live_leaders``). One whose session is only suspended (keepalives unanswered, but sent in time
to keep the lease) still counts: etcd holds its ownership keys, so the other brokers name it.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence

TopicPartition = tuple[str, int]


def leader_for(
    tp: TopicPartition,
    owners: Mapping[TopicPartition, int],
    desired: Mapping[TopicPartition, int],
    live: Collection[int],
    draining: Collection[int],
) -> int:
    """The leader id, or -1 when no broker is alive."""
    owner = owners.get(tp)
    if owner is not None and owner in live:
        return owner
    candidates = sorted(b for b in live if b not in draining) or sorted(live)
    if not candidates:
        return -1
    wanted = desired.get(tp)
    if wanted is not None and wanted in candidates:
        return wanted
    return stable_pick(tp, candidates)


def live_leaders(
    registered: Collection[int], me: int | None, lease_may_be_held: bool
) -> Collection[int]:
    """The brokers ``leader_for`` may name: the registered ones, less this broker (``me``) once
    etcd may no longer hold its session lease (``SessionLease.may_be_held``). Its ownership
    keys went with the session, though its view may still show them for a moment after a
    freeze: naming itself would send clients to a broker that can only answer
    NOT_LEADER_OR_FOLLOWER while the other brokers name another.

    While the lease may be held (a suspended session still sending keepalives) it names itself
    where its view says so, as every other broker does from etcd; it refuses Produce and Fetch
    for those partitions with NOT_LEADER_OR_FOLLOWER until it resumes or gives the session up,
    so a client refreshes its metadata, is sent back to it by every broker and retries there.
    Naming another broker instead sent the client to one that refused it (etcd says this one
    owns the partition) and named this one again: clients went back and forth between two
    brokers."""
    if lease_may_be_held or me is None:
        return registered
    return [b for b in registered if b != me]


def owner_refusal(tp: TopicPartition, accepting: bool, session_valid: bool) -> str | None:
    """Why a partition this broker owns may not take a write (Produce, a transaction marker,
    DeleteRecords) now, or None: while it is handed over, and while the broker's session is
    not valid. A suspended session's lease may still be in etcd, so Metadata still names this
    broker (``live_leaders``), but nothing it appended could be acked before etcd answers
    again; a refusal (NOT_LEADER_OR_FOLLOWER, retriable, nothing written) sends the client
    through a metadata refresh back here, where it is served once the session resumes."""
    if not accepting:
        return f"{tp[0]}-{tp[1]} is being handed over"
    if not session_valid:
        return f"{tp[0]}-{tp[1]}: this broker's etcd session is suspended or lost; retry"
    return None


def stable_pick(tp: TopicPartition, candidates: Sequence[int]) -> int:
    """The broker a partition without owner or assignment goes to, from sorted ``candidates``.

    Shared with ``decide_assignment``, which gives a new partition to this same broker when it
    has room, so the broker that claimed the partition on demand keeps it (no handoff). A
    topic's consecutive partitions land on consecutive brokers, so a new topic spreads out.
    """
    spread = zlib.crc32(tp[0].encode()) + tp[1]
    return candidates[spread % len(candidates)]
