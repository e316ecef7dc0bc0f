"""Which topics a group's members subscribe to: what OffsetDelete (``offset_delete``) and
offset retention (``expiry``) both ask before an offset may go.

Kafka answers it per group type (``ClassicGroup.computeSubscribedTopics``,
``ConsumerGroup.isSubscribedToTopic``), and so does this module, once for both callers:

- a classic group of protocol type "consumer": each member's ConsumerProtocolSubscription,
  read from its JoinGroup metadata for the group's chosen protocol; unknown (None) when the
  group speaks another protocol type (e.g. Connect), has not chosen a protocol yet, or a
  member's metadata does not read;
- a consumer-protocol (KIP-848) group: the topics a member names, or that its regular
  expression matches.

What each caller does with an unknown answer differs (OffsetDelete keeps every offset,
retention expires nothing), so that stays with them. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.group import Group
from kafscale.broker.protocol.codec import decode_consumer_subscription

CONSUMER_PROTOCOL_TYPE = "consumer"
"""The classic protocol type whose member metadata is a ConsumerProtocolSubscription."""


def classic_subscribed_topics(group: Group) -> frozenset[str] | None:
    """The topics a classic group's members subscribe to (Kafka's ``computeSubscribedTopics``):
    empty for a group without members, None when unknown (not the consumer protocol, no
    protocol chosen yet, or metadata that is not a ConsumerProtocolSubscription)."""
    if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return None
    if not group.members:
        return frozenset()
    if not group.protocol_name:
        return None
    topics: set[str] = set()
    for member in group.members.values():
        subscription = decode_consumer_subscription(member.metadata(group.protocol_name))
        if subscription is None:
            return None
        topics.update(subscription.topics)
    return frozenset(topics)


def consumer_subscribed_topics(group: ConsumerGroup, topics: Iterable[str]) -> frozenset[str]:
    """Those of ``topics`` some member of a consumer-protocol group subscribes to, by name or
    by regular expression (a regex protects every topic it matches, as the topics it resolved
    to protect them in Kafka)."""
    members = list(group.members.values())
    return frozenset(t for t in topics if any(m.subscribes(t) for m in members))
