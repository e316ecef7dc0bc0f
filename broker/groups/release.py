"""Whether a coordinator may let go of a group it coordinates now: a pure decision.

Groups are coordinated on demand, and each costs a runtime (two tasks) and a lease in etcd. A
broker that kept every group it ever coordinated, or that a retention check took on
(``adoption``), would hold one per stored group: a cluster of throwaway group ids (CI jobs,
``kcat -G``, notebooks) makes that thousands, growing with the groups stored, not those in use.
So a group nobody is in and nobody asked for lately is let go (its runtime unloaded, its lease
released) and reloaded from etcd when asked for again, or by the next retention check.

Letting go must change nothing a client can see, nor when offsets expire:

- Only a group etcd holds whole is let go: nobody in it (no member, static or waiting for its
  id, no rebalance), no request waiting, no write queued or on its way, no offset pending in
  an open transaction. Its committed offsets are in etcd already.
- A reload must count offset retention from no earlier than this coordinator does (KIP-211:
  never earlier than Kafka). A reload takes the Empty time from the stored record, and from its
  own load where the record has none: so a group with offsets is let go only once etcd's record
  carries an Empty time no earlier than the one held here (else that time is written first);
  a group that uses group management but has no record stored is kept, as is one with an
  offset stored without a commit time (counted from each load, it would never expire).
- A group that does not exist or holds nothing (``vacant``) goes sooner (``vacant_after_s``):
  nothing is lost by forgetting it.

Share groups are never let go: they are few (``groups.share_max_groups``) and their runtime
holds delivery state of share-partitions that etcd does not.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Release(enum.Enum):
    KEEP = "keep"
    LET_GO = "let go"
    STORE_EMPTY_TIME = "store the Empty time first"
    """Idle long enough, but etcd's record lacks the Empty time held here: write it; the group
    may go at a later look, once etcd has it."""


@dataclass(frozen=True, slots=True)
class GroupUse:
    """What the decision needs of one coordinated group."""

    unused_s: float
    """Seconds since a request last asked for the group (or a retention check took it on)."""
    busy: bool
    """A request waits on the group, a write is queued or on its way to etcd, or an offset is
    pending in an open transaction: the runtime holds something etcd does not."""
    memberless: bool
    """No member of either protocol (static ones included), none joining, no rebalance."""
    share: bool
    """A share group (KIP-932)."""
    holds_offsets: bool
    """The group has committed offsets."""
    offsets_timed: bool
    """Every committed offset carries its commit time or its own expire time."""
    managed: bool
    """The group uses group management (a protocol type, or a consumer-protocol group)."""
    record_stored: bool
    """etcd holds the group's metadata record (a group that only committed offsets has none)."""
    stored_members: bool
    """That record lists members."""
    stored_empty_since_ms: int | None
    """That record's Empty time (None: it has none)."""
    empty_since_ms: int | None
    """The Empty time this coordinator counts retention from."""


def may_be_due(unused_s: float, vacant_after_s: float, idle_after_s: float) -> bool:
    """Whether a group unused for ``unused_s`` can be anything but kept (``decide`` keeps every
    group used more recently than both times): the release loop looks at no more of a group in
    use, whose ``GroupUse`` costs a pass over its committed offsets."""
    return unused_s >= min(vacant_after_s, idle_after_s)


def decide(use: GroupUse, vacant_after_s: float, idle_after_s: float) -> Release:
    """Keep the group, let it go, or first store its Empty time."""
    if use.busy or use.share or not use.memberless:
        return Release.KEEP
    if not use.holds_offsets:
        return Release.LET_GO if use.unused_s >= vacant_after_s else Release.KEEP
    if use.unused_s < idle_after_s or not use.offsets_timed:
        return Release.KEEP
    if not use.record_stored:
        return Release.KEEP if use.managed else Release.LET_GO
    if use.stored_members:
        return Release.KEEP  # etcd still lists members: a reload would count from its load
    if reload_counts_no_earlier(use.stored_empty_since_ms, use.empty_since_ms):
        return Release.LET_GO
    return Release.STORE_EMPTY_TIME


def reload_counts_no_earlier(stored_ms: int | None, held_ms: int | None) -> bool:
    """Whether a coordinator loading the stored Empty time counts retention from no earlier
    than the time held here (with none held, any stored time will do)."""
    if stored_ms is None:
        return False
    return held_ms is None or stored_ms >= held_ms
