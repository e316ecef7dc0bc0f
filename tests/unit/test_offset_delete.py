"""OffsetDelete's pure decisions (``groups.offset_delete``): Kafka's group rules."""

from __future__ import annotations

import pytest
from harness.subscribed_groups import consumer_group, stable_group, subscription

from kafscale.broker.groups.consumer import ConsumerConfig, ConsumerGroup
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import GroupConfig, GroupState
from kafscale.broker.groups.offset_delete import (
    OffsetDeletion,
    classic_subscribed_topics,
    decide,
    decide_classic,
)
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

NOT_FOUND = OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND)


def test_a_group_that_is_not_there_or_dead_is_not_found() -> None:
    assert decide(None, None, ["t"]) == NOT_FOUND
    assert decide_classic(None, None, None, ["t"]) == NOT_FOUND
    assert decide_classic(GroupState.DEAD, "consumer", frozenset(), ["t"]) == NOT_FOUND


def test_an_empty_group_loses_any_offset() -> None:
    empty = Group("g", GroupConfig(), 0)  # e.g. one that only ever committed offsets
    assert empty.state is GroupState.EMPTY
    assert decide(empty, None, ["a", "b"]) == OffsetDeletion()
    assert decide_classic(GroupState.EMPTY, "connect", None, ["a"]) == OffsetDeletion()


@pytest.mark.parametrize(
    "state", [GroupState.STABLE, GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE]
)
def test_a_non_consumer_group_with_members_is_non_empty(state: GroupState) -> None:
    assert decide_classic(state, "connect", None, ["a"]) == OffsetDeletion(
        ErrorCode.NON_EMPTY_GROUP
    )


def test_members_keep_the_offsets_of_the_topics_they_subscribe_to() -> None:
    group = stable_group("consumer", subscription(["a"]), subscription(["b", "c"]))
    assert classic_subscribed_topics(group) == {"a", "b", "c"}
    assert decide(group, None, ["a", "c", "d"]) == OffsetDeletion(subscribed=frozenset("ac"))


def test_unreadable_subscriptions_count_as_subscribed_to_everything() -> None:
    """Kafka's ``isSubscribedToTopic`` falls back to ``usesConsumerGroupProtocol``: a consumer
    group whose members' metadata cannot be read keeps every offset."""
    group = stable_group("consumer", subscription(["a"]), b"\xff")
    assert classic_subscribed_topics(group) is None
    assert decide(group, None, ["a", "z"]) == OffsetDeletion(subscribed=frozenset("az"))
    assert classic_subscribed_topics(stable_group("connect", b"")) is None


def test_a_consumer_protocol_group_keeps_topics_named_or_matched() -> None:
    members = (("m1", ("orders",), None), ("m2", (), "logs-.*"))
    group = consumer_group(members, {"orders": 1, "logs-a": 1})
    topics = ["orders", "logs-a", "logs", "other"]
    assert decide(None, group, topics) == OffsetDeletion(subscribed=frozenset({"orders", "logs-a"}))
    assert decide(None, ConsumerGroup("g", ConsumerConfig()), topics) == OffsetDeletion()


def test_partitions_of_subscribed_topics_stay_the_others_go() -> None:
    deletion = OffsetDeletion(subscribed=frozenset({"a"}))
    assert deletion.answers([("a", 0), ("b", 0), ("a", 1)]) == {
        ("a", 0): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
        ("b", 0): ErrorCode.NONE,
        ("a", 1): ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC,
    }
