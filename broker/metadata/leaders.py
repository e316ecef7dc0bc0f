"""Which broker Metadata names as a partition's leader: a pure decision.

The lease holder if it is alive; else the desired owner from the assignment if it is alive and
not draining; else a stable pick among the live, non-draining brokers, the same on every
broker, so that clients of every broker send a leaderless partition's produce to one place,
which then claims the lease on demand.

A broker whose own session is not valid (woken from a freeze past its TTL, before the view has
heard that etcd deleted its ownership keys) counts as not alive for this (``live_leaders``).
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
    registered: Collection[int], me: int | None, session_valid: bool
) -> Collection[int]:
    """The brokers ``leader_for`` may name: the registered ones, less this broker (``me``) while
    its session is not valid. Its ownership keys went with the session, though its view may
    still show them for a moment after a freeze: naming itself would send clients to a broker
    that can only answer NOT_LEADER_OR_FOLLOWER."""
    if session_valid or me is None:
        return registered
    return [b for b in registered if b != me]


def stable_pick(tp: TopicPartition, candidates: Sequence[int]) -> int:
    """The broker a partition without owner or assignment goes to, from sorted ``candidates``.

    Shared with ``decide_assignment``, which gives a new partition to this same broker when it
    has room, so the broker that claimed the partition on demand keeps it (no handoff). A
    topic's consecutive partitions land on consecutive brokers, so a new topic spreads out.
    """
    spread = zlib.crc32(tp[0].encode()) + tp[1]
    return candidates[spread % len(candidates)]
