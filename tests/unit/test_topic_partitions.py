"""DescribeTopicPartitions' pages (KIP-966) and the partition entries Metadata shares with it."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.api.topic_partitions import (
    ClusterLook,
    Page,
    PageItem,
    describe_topic_partitions,
    partition_entry,
    plan_page,
)
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

COUNTS = {"a": 3, "b": 2, "c": 4}


def page(
    names: list[str], cursor: tuple[str, int] | None, limit: int, unknown: bool = True
) -> Page:
    return plan_page(names, COUNTS.get, cursor, limit, unknown)


def test_whole_topics_fit_and_no_cursor() -> None:
    assert page(["a", "b", "c"], None, 100) == Page(
        [PageItem("a", range(0, 3)), PageItem("b", range(0, 2)), PageItem("c", range(0, 4))], None
    )


def test_a_topic_cut_by_the_limit_ends_the_page_at_its_next_partition() -> None:
    assert page(["a", "b", "c"], None, 4) == Page(
        [PageItem("a", range(0, 3)), PageItem("b", range(0, 1))], ("b", 1)
    )


def test_a_limit_used_up_at_a_topic_end_points_at_the_next_topic() -> None:
    assert page(["a", "b", "c"], None, 5) == Page(
        [PageItem("a", range(0, 3)), PageItem("b", range(0, 2))], ("c", 0)
    )


def test_the_cursor_starts_its_topic_at_its_partition() -> None:
    assert page(["b", "c"], ("b", 1), 3) == Page(
        [PageItem("b", range(1, 2)), PageItem("c", range(0, 2))], ("c", 2)
    )


def test_paging_through_with_limit_one_visits_every_partition_once() -> None:
    seen: list[tuple[str, int]] = []
    cursor: tuple[str, int] | None = None
    for _ in range(20):
        names = sorted(n for n in COUNTS if cursor is None or n >= cursor[0])
        result = page(names, cursor, 1)
        seen += [(item.name, p) for item in result.items for p in item.partitions or ()]
        cursor = result.next_cursor
        if cursor is None:
            break
    assert seen == [(name, p) for name in sorted(COUNTS) for p in range(COUNTS[name])]


def test_unknown_topics_cost_nothing_and_are_listed_only_when_named() -> None:
    assert page(["a", "x"], None, 4) == Page(
        [PageItem("a", range(0, 3)), PageItem("x", None)], None
    )
    assert page(["a", "x"], None, 4, unknown=False) == Page([PageItem("a", range(0, 3))], None)


def test_the_limit_is_capped_and_at_least_one() -> None:
    assert page(["a"], None, 0).items == [PageItem("a", range(0, 1))]
    big = plan_page(["t"], lambda _n: 5000, None, 10_000, True)
    assert big.items == [PageItem("t", range(0, 2000))] and big.next_cursor == ("t", 2000)


def test_a_partition_without_leader_has_no_replicas() -> None:
    entry = partition_entry("t", 0, lambda _tp: -1, lambda _tp: 3)
    assert entry["error_code"] == ErrorCode.LEADER_NOT_AVAILABLE
    assert entry["replica_nodes"] == [] and entry["leader_epoch"] == 3
    led = partition_entry("t", 1, lambda _tp: 7, lambda _tp: -1)
    assert (led["leader_id"], led["replica_nodes"], led["isr_nodes"]) == (7, [7], [7])
    assert led["leader_epoch"] == 0


def _look(describable: set[str] | None = None) -> ClusterLook:
    return ClusterLook(
        all_topics=list(COUNTS),
        partition_count=COUNTS.get,
        topic_id_of=lambda _name: uuid.UUID(int=1),
        leader_of=lambda _tp: 5,
        epoch_of=lambda _tp: 2,
        describable=lambda name: describable is None or name in describable,
        operations_of=lambda _name: 8,
    )


def _request(names: list[str], limit: int = 2000, cursor: tuple[str, int] | None = None) -> Any:
    return SimpleNamespace(
        topics=[SimpleNamespace(name=n) for n in names],
        response_partition_limit=limit,
        cursor=None
        if cursor is None
        else SimpleNamespace(topic_name=cursor[0], partition_index=cursor[1]),
    )


def test_all_topics_means_those_the_client_may_describe() -> None:
    body = describe_topic_partitions(_request([]), _look({"a", "c"}))
    assert [t["name"] for t in body["topics"]] == ["a", "c"]
    assert body["next_cursor"] is None
    first = body["topics"][0]["partitions"][0]
    assert first["eligible_leader_replicas"] == [] and first["error_code"] == ErrorCode.NONE


def test_named_topics_denied_come_last_and_unknown_get_their_error() -> None:
    body = describe_topic_partitions(_request(["c", "zz", "a"]), _look({"a", "zz"}))
    assert [(t["name"], t["error_code"]) for t in body["topics"]] == [
        ("a", ErrorCode.NONE),
        ("zz", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("c", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    ]


def test_a_cursor_outside_the_named_topics_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as raised:
        describe_topic_partitions(_request(["a"], cursor=("b", 0)), _look())
    assert raised.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(KafkaError):
        describe_topic_partitions(_request([], cursor=("a", -1)), _look())
