"""Splitting a partitioned request by owning broker and merging the answers: pure functions.

Produce, ListOffsets, OffsetForLeaderEpoch and DeleteRecords all carry a list of topics, each
with a list of partitions, and answer in the same shape. ``PartitionedApi`` names the fields of
one API; the functions below cut a request into one per broker (same version, same top-level
fields, record batches untouched) and put the per-partition answers back together in the order
the client asked. Entities stay kio's: nothing is decoded beyond what routing needs.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol import guard
from kafscale.broker.protocol.record_batch import read_uvarint

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class PartitionedApi:
    topics: str
    topic_name: str
    partitions: str
    partition: str
    response_topics: str
    response_topic_name: str
    response_partitions: str
    response_partition: str


PRODUCE = PartitionedApi(
    "topic_data",
    "name",
    "partition_data",
    "index",
    "responses",
    "name",
    "partition_responses",
    "index",
)
LIST_OFFSETS = PartitionedApi(
    "topics",
    "name",
    "partitions",
    "partition_index",
    "topics",
    "name",
    "partitions",
    "partition_index",
)
OFFSET_FOR_LEADER_EPOCH = PartitionedApi(
    "topics", "topic", "partitions", "partition", "topics", "topic", "partitions", "partition"
)
DELETE_RECORDS = PartitionedApi(
    "topics",
    "name",
    "partitions",
    "partition_index",
    "topics",
    "name",
    "partitions",
    "partition_index",
)


DESCRIBE_PRODUCERS = PartitionedApi(
    "topics",
    "name",
    "partition_indexes",
    "",  # plain partition numbers
    "topics",
    "name",
    "partitions",
    "partition_index",
)


def _partition_number(api: PartitionedApi, item: Any) -> int:
    """A request's partition: an entity's field, or the number itself (``api.partition`` "")."""
    return int(getattr(item, api.partition) if api.partition else item)


def requested_partitions(request: Any, api: PartitionedApi) -> list[TopicPartition]:
    """Every (topic, partition) of the request, in the client's order."""
    return [
        (str(getattr(topic, api.topic_name)), _partition_number(api, p))
        for topic in getattr(request, api.topics)
        for p in getattr(topic, api.partitions)
    ]


def split_request(
    request: Any,
    api: PartitionedApi,
    route: Callable[[TopicPartition], int],
    only: Iterable[TopicPartition] | None = None,
) -> dict[int, Any]:
    """One request per broker that ``route`` names, holding that broker's partitions (of
    ``only``, when given), in the request's order. Partitions routed to -1 (no broker) are
    gathered under -1."""
    keep = None if only is None else set(only)
    by_broker: dict[int, dict[int, list[Any]]] = {}  # broker -> topic index -> partitions
    topics = getattr(request, api.topics)
    for index, topic in enumerate(topics):
        name = str(getattr(topic, api.topic_name))
        for p in getattr(topic, api.partitions):
            tp = (name, _partition_number(api, p))
            if keep is not None and tp not in keep:
                continue
            by_broker.setdefault(route(tp), {}).setdefault(index, []).append(p)
    return {
        broker: dataclasses.replace(
            request,
            **{
                api.topics: tuple(
                    dataclasses.replace(topics[index], **{api.partitions: tuple(parts)})
                    for index, parts in sorted(per_topic.items())
                )
            },
        )
        for broker, per_topic in by_broker.items()
    }


def response_partitions(response: Any, api: PartitionedApi) -> Iterator[tuple[TopicPartition, Any]]:
    for topic in getattr(response, api.response_topics):
        name = str(getattr(topic, api.response_topic_name))
        for p in getattr(topic, api.response_partitions):
            yield (name, int(getattr(p, api.response_partition))), p


def merge_response(
    api: PartitionedApi,
    order: list[TopicPartition],
    results: Mapping[TopicPartition, Any],
    throttle_ms: int = 0,
) -> dict[str, Any]:
    """The response body: one topic entry per topic in the client's order, each partition's
    answer (a kio entity, or a dict for one the proxy made up) in the client's order."""
    topics: dict[str, list[Any]] = {}
    for tp in order:
        topics.setdefault(tp[0], []).append(results[tp])
    return {
        "throttle_time": throttle_ms,
        api.response_topics: [
            {api.response_topic_name: name, api.response_partitions: partitions}
            for name, partitions in topics.items()
        ],
    }


def partition_error(api: PartitionedApi, partition: int, code: int) -> dict[str, Any]:
    """A made-up partition answer carrying ``code`` (other fields as Kafka leaves them unset)."""
    return {
        api.response_partition: partition,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": -1,
        "log_start_offset": -1,
        "offset": -1,
        "timestamp": -1,
        "leader_epoch": -1,
        "end_offset": -1,
        "low_watermark": -1,
    }


def error_codes(entity: Any) -> Iterator[int]:
    """Every ``error_code`` (and ``partition_error_code``) in a parsed response, however
    deeply nested."""
    if dataclasses.is_dataclass(entity) and not isinstance(entity, type):
        for field in dataclasses.fields(entity):
            value = getattr(entity, field.name)
            if field.name.endswith("error_code"):  # AddPartitionsToTxn: partition_error_code
                yield int(value)
            elif isinstance(value, tuple) or dataclasses.is_dataclass(value):
                yield from error_codes(value)
    elif isinstance(entity, tuple):
        for item in entity:
            yield from error_codes(item)


def entity_fields(entity: Any) -> dict[str, Any]:
    """A kio entity's top-level fields as a dict (nested entities stay entities)."""
    return {f.name: getattr(entity, f.name) for f in dataclasses.fields(entity)}


def fetch_topic_key(topic: Any) -> Any:
    """How a Fetch request or response names a topic: its name (v4-v12) or its id (v13+; kio
    reads the all-zero id as None)."""
    if hasattr(topic, "topic"):
        return topic.topic
    return topic.topic_id or uuid.UUID(int=0)


def concat_flexible_lists(bodies: list[bytes]) -> bytes:
    """One response of several flexible ones whose body is ``throttle_time`` and one list
    (DescribeTransactions): the first's header and throttle time, every list's items in turn.
    Each body is a response header v1 (correlation id, no tagged fields), an i32, a compact
    array and no tagged fields, as the brokers write them."""
    head = bodies[0][:9]  # correlation id, empty tagged fields, throttle time
    count = 0
    items = bytearray()
    for body in bodies:
        length, at = read_uvarint(body, 9)
        count += max(length - 1, 0)
        items += body[at:-1]  # up to the top-level tagged fields (empty: one zero byte)
    return bytes(head) + guard.encode_uvarint(count + 1) + bytes(items) + b"\x00"
