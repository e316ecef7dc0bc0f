"""Which committed offsets of a group have expired: Kafka's ``offsets.retention.minutes``
(KIP-211, Kafka 2.1+), as a pure decision.

Throwaway group ids (console consumers, one-off jobs) each leave offsets and a group record in
etcd, whose size is bounded by a quota: an old cluster that never forgot them would fill it and
stop taking writes. Kafka's rules (``GroupMetadata.removeExpiredOffsets``):

- a group that uses group management (it has, or had, members: a protocol type, or a
  consumer-protocol group) keeps every offset while it has members; once Empty, an offset
  expires ``retention`` after the group became Empty;
- except (Kafka 2.5+) offsets of topics that no member subscribes to: in a Stable classic
  group of protocol type "consumer" whose members' subscriptions can all be read, and in a
  consumer-protocol group with members (Kafka's new coordinator: any state), such an offset
  expires ``retention`` after its commit. A group that moved from topic A to topic B does
  not keep A's offsets forever. Where a subscription cannot be read, or the classic group is
  rebalancing, nothing expires;
- a standalone group (offsets committed outside group management, ``assign()`` + commit) has
  its offsets expire ``retention`` after each one's commit;
- an offset committed with an explicit retention (OffsetCommit v2-v4 ``retention_time``)
  expires at its own expire timestamp, once the group is Empty (or standalone);
- an offset pending in an open transaction does not expire.

Never earlier than Kafka: an expired offset loses a consumer's position. So an Empty group's
offsets are counted from the later of the group's empty time and their commit, and where the
empty time is unknown (a record written before this was stored, or a group loaded with
members) the coordinator passes the time it loaded or saw the group Empty (``retention_runtime``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import GroupState
from kafscale.broker.groups.store import CommittedOffset, TopicPartition
from kafscale.broker.groups.subscriptions import (
    classic_subscribed_topics,
    consumer_subscribed_topics,
)


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
    subscribed_topics: frozenset[str] | None = None
    """While the group has members: the topics they subscribe to (``subscribed_topics``), when
    the offsets of the other topics may expire; None: every offset stays."""


def subscribed_topics(
    group: Group | None, consumer: ConsumerGroup | None, topics: Iterable[str]
) -> frozenset[str] | None:
    """Which of ``topics`` (those the group has offsets of) the members of a group with members
    subscribe to, or None where the others must not expire (Kafka's ``subscribedTopics``):

    - a consumer-protocol group: the topics a member names or its regular expression matches
      (as the regex's resolved topics protect them in Kafka);
    - a classic group: only when Stable, of protocol type "consumer" and every member's
      ConsumerProtocolSubscription reads (else None: nobody can tell what it consumes)."""
    if consumer is not None:
        return consumer_subscribed_topics(consumer, topics)
    if group is None or group.state is not GroupState.STABLE:
        return None
    return classic_subscribed_topics(group)


def offset_expired(
    committed: CommittedOffset, activity: GroupActivity, retention_ms: int, now_ms: int
) -> bool:
    """Whether one offset has expired at ``now_ms``, in a group without members or (an offset
    of a topic nobody subscribes to) with members: then counted from its commit alone."""
    if committed.expire_timestamp_ms >= 0:
        return now_ms >= committed.expire_timestamp_ms
    base_ms = committed.commit_timestamp_ms
    if base_ms < 0:
        base_ms = activity.loaded_at_ms  # stored before commit times were: never earlier
    if activity.managed and activity.empty_since_ms is not None:
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
    kept: frozenset[str] = frozenset()
    if activity.managed and activity.empty_since_ms is None:
        if activity.subscribed_topics is None:
            return []  # members whose subscriptions are unknown: every offset stays
        kept = activity.subscribed_topics
    return sorted(
        tp
        for tp, committed in offsets.items()
        if tp[0] not in kept
        and tp not in pending
        and offset_expired(committed, activity, retention_ms, now_ms)
    )
