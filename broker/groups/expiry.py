"""Which committed offsets of a group have expired: Kafka's ``offsets.retention.minutes``
(KIP-211, Kafka 2.1+), as a pure decision.

Throwaway group ids (console consumers, one-off jobs) each leave offsets and a group record in
etcd, whose size is bounded by a quota: an old cluster that never forgot them would fill it and
stop taking writes. Kafka's rules (``GroupMetadata.removeExpiredOffsets``):

- a group that uses group management (it has, or had, members: a protocol type, or a
  consumer-protocol group) keeps every offset while it has members; once Empty, an offset
  expires ``retention`` after the group became Empty;
- a standalone group (offsets committed outside group management, ``assign()`` + commit) has
  its offsets expire ``retention`` after each one's commit;
- an offset committed with an explicit retention (OffsetCommit v2-v4 ``retention_time``)
  expires at its own expire timestamp, once the group is Empty (or standalone);
- an offset pending in an open transaction does not expire.

Never earlier than Kafka: an expired offset loses a consumer's position. So an Empty group's
offsets are counted from the later of the group's empty time and their commit, and where the
empty time is unknown (a record written before this was stored, or a group loaded with
members) the coordinator passes the time it loaded or saw the group Empty (``runtime``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kafscale.broker.groups.store import CommittedOffset, TopicPartition


@dataclass(frozen=True, slots=True)
class GroupActivity:
    """What the decision needs of a group besides its offsets."""

    managed: bool
    """The group uses group management (a protocol type, or a consumer-protocol group)."""
    empty_since_ms: int | None
    """Wall-clock ms since which the group has had no members; None while it has some (or is
    rebalancing)."""
    loaded_at_ms: int
    """When this coordinator loaded the group: the base of an offset without a commit time."""


def offset_expired(
    committed: CommittedOffset, activity: GroupActivity, retention_ms: int, now_ms: int
) -> bool:
    """Whether one offset of a group without members has expired at ``now_ms``."""
    if committed.expire_timestamp_ms >= 0:
        return now_ms >= committed.expire_timestamp_ms
    base_ms = committed.commit_timestamp_ms
    if base_ms < 0:
        base_ms = activity.loaded_at_ms  # stored before commit times were: never earlier
    if activity.managed:
        assert activity.empty_since_ms is not None
        base_ms = max(base_ms, activity.empty_since_ms)
    return now_ms - base_ms >= retention_ms


def expired_offsets(
    activity: GroupActivity,
    offsets: Mapping[TopicPartition, CommittedOffset],
    pending: Collection[TopicPartition],
    retention_ms: int,
    now_ms: int,
) -> list[TopicPartition]:
    """The partitions whose committed offsets have expired at ``now_ms``, in order."""
    if activity.managed and activity.empty_since_ms is None:
        return []  # a group with members keeps every offset
    return sorted(
        tp
        for tp, committed in offsets.items()
        if tp not in pending and offset_expired(committed, activity, retention_ms, now_ms)
    )
