"""OffsetDelete's decisions: may a group's committed offsets go, and which of them.

Kafka's rules (``GroupCoordinator.handleDeleteOffsets``, and ``validateOffsetDelete`` /
``isSubscribedToTopic`` of the new coordinator's groups), decision by decision:

* a group that does not exist (or is Dead) is GROUP_ID_NOT_FOUND;
* an Empty classic group (or one that only ever committed offsets) loses any of them;
* a classic group with members that does not speak the consumer protocol (protocol type other
  than "consumer", e.g. Connect) is NON_EMPTY_GROUP: nobody can tell what it consumes;
* a classic consumer group with members keeps the offsets of every topic its members subscribe
  to (GROUP_SUBSCRIBED_TO_TOPIC per partition), read from their JoinGroup metadata for the
  group's protocol; when that cannot be read, every topic counts as subscribed (Kafka's
  ``orElse(usesConsumerGroupProtocol)``): deleting the offsets of a partition still being
  consumed would make its consumer start over after the next rebalance;
* a consumer-protocol (KIP-848) group keeps the offsets of topics a member subscribes to, by
  name or by regular expression.

What a group's members subscribe to is read by ``subscriptions`` (as for offset retention).
Partitions that have no committed offset are answered NONE, as Kafka answers them. Pure: no
I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import GroupState
from kafscale.broker.groups.subscriptions import (
    CONSUMER_PROTOCOL_TYPE,
    classic_subscribed_topics,
    consumer_subscribed_topics,
)
from kafscale.broker.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class OffsetDeletion:
    """The answer for a group: a group-level error, or the topics whose offsets stay."""

    error: ErrorCode = ErrorCode.NONE
    subscribed: frozenset[str] = frozenset()
    """Requested topics the group consumes: their partitions get GROUP_SUBSCRIBED_TO_TOPIC."""

    def answers(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        """Each partition's answer when there is no group-level error: NONE (its offset goes)
        or GROUP_SUBSCRIBED_TO_TOPIC (it stays)."""
        subscribed = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        return {tp: subscribed if tp[0] in self.subscribed else ErrorCode.NONE for tp in partitions}


def decide_classic(
    state: GroupState | None,
    protocol_type: str | None,
    subscribed: frozenset[str] | None,
    topics: Iterable[str],
) -> OffsetDeletion:
    """A classic group in ``state`` (None: no such group) asked to drop offsets of ``topics``;
    ``subscribed`` as ``classic_subscribed_topics`` gives it."""
    if state is None or state is GroupState.DEAD:
        return OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND)
    if state is GroupState.EMPTY:
        return OffsetDeletion()
    if protocol_type != CONSUMER_PROTOCOL_TYPE:
        return OffsetDeletion(ErrorCode.NON_EMPTY_GROUP)
    if subscribed is None:  # a consumer group whose subscriptions cannot be read: all of them
        return OffsetDeletion(subscribed=frozenset(topics))
    return OffsetDeletion(subscribed=frozenset(t for t in topics if t in subscribed))


def decide_consumer(group: ConsumerGroup, topics: Iterable[str]) -> OffsetDeletion:
    """A consumer-protocol group: the topics some member subscribes to stay."""
    return OffsetDeletion(subscribed=consumer_subscribed_topics(group, topics))


def decide(
    group: Group | None, consumer: ConsumerGroup | None, topics: Iterable[str]
) -> OffsetDeletion:
    """The decision for the group as its coordinator holds it (at most one of the two)."""
    if consumer is not None:
        return decide_consumer(consumer, topics)
    if group is None:
        return decide_classic(None, None, None, topics)
    return decide_classic(
        group.state, group.protocol_type, classic_subscribed_topics(group), topics
    )
