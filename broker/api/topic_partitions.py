"""A topic's partitions as Metadata and DescribeTopicPartitions show them, and the pages of
DescribeTopicPartitions (KIP-966): pure, shared by the brokers and the proxy.

Replicas collapse to the lease owner: a partition's replicas and in-sync replicas are its
leader alone (none when no broker is alive), so both APIs report the same leader, replicas and
epoch to a client, whichever answers. The leader is given as a number by the caller: a broker
passes the lease owner (or the assigned owner that claims it on demand), the proxy the id its
clients know the owner by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol.errors import ErrorCode, KafkaError

Body = dict[str, Any]
TopicPartition = tuple[str, int]
LeaderOf = Callable[[TopicPartition], int]
"""The leader id clients are given for a partition (-1: none)."""
EpochOf = Callable[[TopicPartition], int]
"""The partition's current leader epoch."""
PartitionCount = Callable[[str], int | None]
"""A topic's partition count (None: no such topic)."""

MAX_PARTITIONS_PER_PAGE = 2000
"""Kafka's ``max.request.partition.size.limit`` default: the most partitions one
DescribeTopicPartitions answer carries, whatever the request's limit."""


def metadata_topics(topics: Sequence[Any] | None, api_version: int) -> Sequence[Any] | None:
    """The topics a Metadata request names; None when it asks for every topic.

    Metadata v0 has no null array: there an empty list is how a client asks for every topic
    (kafka-python pinned to 0.9 does so before it knows its subscription, and keeps what it is
    told until its next refresh, minutes later). From v1 null asks for all, empty for none.
    """
    if topics is None or (api_version == 0 and not topics):
        return None
    return topics


def partition_entry(name: str, index: int, leader_of: LeaderOf, epoch_of: EpochOf) -> Body:
    """Metadata's partition entry: LEADER_NOT_AVAILABLE while no broker can lead it."""
    tp = (name, index)
    leader = leader_of(tp)
    owned = leader >= 0
    return {
        "error_code": ErrorCode.NONE if owned else ErrorCode.LEADER_NOT_AVAILABLE,
        "partition_index": index,
        "leader_id": leader,
        "leader_epoch": max(epoch_of(tp), 0),
        "replica_nodes": [leader] if owned else [],
        "isr_nodes": [leader] if owned else [],
        "offline_replicas": [],
    }


def described_partition(name: str, index: int, leader_of: LeaderOf, epoch_of: EpochOf) -> Body:
    """DescribeTopicPartitions' partition entry: Metadata's, with no error code for a missing
    leader (Kafka gives leader -1 there and no error) and empty eligible leader replicas: with
    one replica, the leader is the only eligible one and there is no ELR to speak of."""
    entry = partition_entry(name, index, leader_of, epoch_of)
    return {
        **entry,
        "error_code": ErrorCode.NONE,
        "eligible_leader_replicas": [],
        "last_known_elr": [],
    }


@dataclass(frozen=True, slots=True)
class PageItem:
    """One topic of a page: its partitions ``start``..``stop`` (None: no such topic)."""

    name: str
    partitions: range | None


@dataclass(frozen=True, slots=True)
class Page:
    items: list[PageItem]
    next_cursor: tuple[str, int] | None


def plan_page(
    names: Sequence[str],
    partition_count: PartitionCount,
    cursor: tuple[str, int] | None,
    limit: int,
    list_unknown: bool,
) -> Page:
    """KIP-966's page over ``names`` (sorted, at or after the cursor's topic): whole topics
    while the limit lasts; a topic cut by it ends the page with a cursor at its next
    partition; a limit used up exactly at a topic's end points the cursor at the next topic's
    partition 0. Unknown topics cost nothing and are listed only if ``list_unknown``."""
    remaining = max(min(limit, MAX_PARTITIONS_PER_PAGE), 1)
    items: list[PageItem] = []
    for name in names:
        if remaining <= 0:
            return Page(items, (name, 0))
        count = partition_count(name)
        if count is None:
            if list_unknown:
                items.append(PageItem(name, None))
            continue
        start = cursor[1] if cursor is not None and name == cursor[0] else 0
        stop = min(count, start + remaining)
        items.append(PageItem(name, range(start, max(start, stop))))
        if stop < count:
            return Page(items, (name, stop))
        remaining -= max(stop - start, 0)
    return Page(items, None)


def check_cursor(requested: Sequence[str] | None, cursor: tuple[str, int] | None) -> str | None:
    """Why a cursor is invalid (None: it is fine), as Kafka's handler checks it."""
    if cursor is None:
        return None
    if requested and cursor[0] not in requested:
        return f"the topic list must contain the cursor's topic {cursor[0]!r}"
    if cursor[1] < 0:
        return f"the cursor's partition must not be negative: {cursor[1]}"
    return None


def pending_names(names: Sequence[str], cursor: tuple[str, int] | None) -> list[str]:
    """The topics a page is cut from: sorted, none before the cursor's topic, once each."""
    first = cursor[0] if cursor is not None else ""
    return sorted({name for name in names if name >= first})


@dataclass(frozen=True, slots=True)
class ClusterLook:
    """What a DescribeTopicPartitions answer is made from, as the answering side sees it."""

    all_topics: Sequence[str]
    partition_count: PartitionCount
    topic_id_of: Callable[[str], Any]  # the topic's uuid.UUID
    leader_of: LeaderOf
    epoch_of: EpochOf
    describable: Callable[[str], bool]
    operations_of: Callable[[str], int]  # the client's authorized_operations on the topic


def request_cursor(request: Any) -> tuple[str, int] | None:
    cursor = getattr(request, "cursor", None)
    if cursor is None:
        return None
    return str(cursor.topic_name), int(cursor.partition_index)


def describe_topic_partitions(request: Any, look: ClusterLook) -> Body:
    """The DescribeTopicPartitions answer (KIP-966, as Kafka's handler builds it): no topics
    named means every topic the client may describe; a named topic it may not describe gets
    TOPIC_AUTHORIZATION_FAILED (after the page, its existence not disclosed); an unknown one
    UNKNOWN_TOPIC_OR_PARTITION. Raises INVALID_REQUEST for a cursor Kafka refuses."""
    requested = [str(t.name) for t in request.topics]
    cursor = request_cursor(request)
    if reason := check_cursor(requested, cursor):
        raise KafkaError(reason, ErrorCode.INVALID_REQUEST)
    fetch_all = not requested
    names = pending_names(look.all_topics if fetch_all else requested, cursor)
    allowed = [name for name in names if look.describable(name)]
    denied = [] if fetch_all else [name for name in names if not look.describable(name)]
    page = plan_page(
        allowed, look.partition_count, cursor, int(request.response_partition_limit), not fetch_all
    )
    topics = [_described_topic(item, look) for item in page.items]
    topics += [
        {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": name, "partitions": []}
        for name in denied
    ]
    next_cursor = None
    if page.next_cursor is not None:
        next_cursor = {"topic_name": page.next_cursor[0], "partition_index": page.next_cursor[1]}
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


def _described_topic(item: PageItem, look: ClusterLook) -> Body:
    if item.partitions is None:
        return {
            "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "name": item.name,
            "partitions": [],
        }
    return {
        "error_code": ErrorCode.NONE,
        "name": item.name,
        "topic_id": look.topic_id_of(item.name),
        "is_internal": False,
        "partitions": [
            described_partition(item.name, p, look.leader_of, look.epoch_of)
            for p in item.partitions
        ],
        "topic_authorized_operations": look.operations_of(item.name),
    }
