"""Wire layouts of the request/response versions Kafka 3.9 serves and kio does not know.

kio follows Kafka 4, which dropped the oldest versions (KIP-896): Produce v0-v2, Fetch v0-v3,
ListOffsets v0, OffsetCommit v0-v1, OffsetFetch v0, WriteTxnMarkers v0. Clients from before
Kafka 2.1 still send them. These classes follow kio's generated ones field for field (order,
``kafka_type`` metadata, ``__flexible__``), so kio's reader and writer, the request guard and
the codec's dict-to-entity builder all handle them unchanged; :mod:`codec` looks here first.

Where a legacy version has exactly the layout of the oldest version kio knows, the kio class is
reused (OffsetFetch v0 is v1 on the wire; OffsetCommit responses v0-v2 are identical; Produce
v2's response is v3's). Field names follow the newest versions, so handlers read and write them
as they do for the versions kio has.
"""

# No `from __future__ import annotations`: kio reads the field types at run time.

import datetime
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4.request import FetchTopic
from kio.schema.offset_commit.v2.request import OffsetCommitRequestPartition
from kio.schema.offset_commit.v2.response import OffsetCommitResponse
from kio.schema.offset_fetch.v1.request import OffsetFetchRequest
from kio.schema.offset_fetch.v1.response import OffsetFetchResponse
from kio.schema.produce.v3.request import TopicProduceData
from kio.schema.produce.v3.response import ProduceResponse as ProduceResponseV2
from kio.schema.request_header.v1.header import RequestHeader
from kio.schema.response_header.v0.header import ResponseHeader
from kio.static.constants import EntityType
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

_ZERO_MS = i32Timedelta.parse(datetime.timedelta(milliseconds=0))

# --- ListOffsets v0 (api 2) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    timestamp: i64 = field(metadata={"kafka_type": "int64"})
    max_num_offsets: i32 = field(metadata={"kafka_type": "int32"}, default=i32(1))
    """How many offsets before the timestamp v0 asks for; clients ask for one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartitionV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsRequestV0:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    replica_id: i32 = field(metadata={"kafka_type": "int32"})
    topics: tuple[ListOffsetsTopicV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsPartitionResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    old_style_offsets: tuple[i64, ...] = field(metadata={"kafka_type": "int64"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsTopicResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[ListOffsetsPartitionResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ListOffsetsResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(2)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topics: tuple[ListOffsetsTopicResponseV0, ...]


# --- OffsetCommit v0-v1 (api 8) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitTopicV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(8)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetCommitRequestPartition, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestV0:
    """v0 commits without a generation: the simple (group-less) consumer's commit."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(8)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    group_id: str = field(metadata={"kafka_type": "string"})
    topics: tuple[OffsetCommitTopicV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitPartitionV1:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(8)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    committed_offset: i64 = field(metadata={"kafka_type": "int64"})
    commit_timestamp: i64 = field(metadata={"kafka_type": "int64"}, default=i64(-1))
    """Ignored, as Kafka 3.9 ignores it (the broker's clock stamps every commit)."""
    committed_metadata: str | None = field(metadata={"kafka_type": "string"})


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitTopicV1:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(8)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[OffsetCommitPartitionV1, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class OffsetCommitRequestV1:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(8)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    group_id: str = field(metadata={"kafka_type": "string"})
    generation_id_or_member_epoch: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
    member_id: str = field(metadata={"kafka_type": "string"})
    topics: tuple[OffsetCommitTopicV1, ...]


# --- Produce v0-v2 (api 0) --------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceRequestV0:
    """v0-v2: v3 without the transactional id; ``records`` hold a legacy message set."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    acks: i16 = field(metadata={"kafka_type": "int16"})
    timeout: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    topic_data: tuple[TopicProduceData, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    base_offset: i64 = field(metadata={"kafka_type": "int64"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicProduceResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    partition_responses: tuple[PartitionProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProduceResponseV1:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(0)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[TopicProduceResponseV0, ...]
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"}, default=_ZERO_MS)


# --- Fetch v0-v3 (api 1) ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequestV0:
    """v0-v2; v3 adds ``max_bytes`` (:class:`FetchRequestV3`)."""

    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    replica_id: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
    max_wait: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    min_bytes: i32 = field(metadata={"kafka_type": "int32"})
    topics: tuple[FetchTopic, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchRequestV3:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(3)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    replica_id: i32 = field(metadata={"kafka_type": "int32"}, default=i32(-1))
    max_wait: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    min_bytes: i32 = field(metadata={"kafka_type": "int32"})
    max_bytes: i32 = field(metadata={"kafka_type": "int32"}, default=i32(2147483647))
    topics: tuple[FetchTopic, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchPartitionDataV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})
    high_watermark: i64 = field(metadata={"kafka_type": "int64"})
    records: Records | None = field(metadata={"kafka_type": "records"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchTopicResponseV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    topic: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[FetchPartitionDataV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    responses: tuple[FetchTopicResponseV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchResponseV1:
    """v1-v3: v0 with the throttle time first."""

    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(1)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(1)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    throttle_time: i32Timedelta = field(metadata={"kafka_type": "timedelta_i32"})
    responses: tuple[FetchTopicResponseV0, ...]


# --- WriteTxnMarkers v0 (api 27) ---------------------------------------------------------------
# v1 on the wire without flexible encodings (Kafka 3.9 serves v0-v1; Kafka 4 only v1).


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerTopicV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    name: str = field(metadata={"kafka_type": "string"})
    partition_indexes: tuple[i32, ...] = field(metadata={"kafka_type": "int32"}, default=())


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    producer_id: i64 = field(metadata={"kafka_type": "int64"})
    producer_epoch: i16 = field(metadata={"kafka_type": "int16"})
    transaction_result: bool = field(metadata={"kafka_type": "bool"})
    topics: tuple[WritableTxnMarkerTopicV0, ...]
    coordinator_epoch: i32 = field(metadata={"kafka_type": "int32"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersRequestV0:
    __type__: ClassVar = EntityType.request
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[RequestHeader]] = RequestHeader
    markers: tuple[WritableTxnMarkerV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerPartitionResultV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    partition_index: i32 = field(metadata={"kafka_type": "int32"})
    error_code: ErrorCode = field(metadata={"kafka_type": "error_code"})


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerTopicResultV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    name: str = field(metadata={"kafka_type": "string"})
    partitions: tuple[WritableTxnMarkerPartitionResultV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WritableTxnMarkerResultV0:
    __type__: ClassVar = EntityType.nested
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    producer_id: i64 = field(metadata={"kafka_type": "int64"})
    topics: tuple[WritableTxnMarkerTopicResultV0, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteTxnMarkersResponseV0:
    __type__: ClassVar = EntityType.response
    __version__: ClassVar[i16] = i16(0)
    __flexible__: ClassVar[bool] = False
    __api_key__: ClassVar[i16] = i16(27)
    __header_schema__: ClassVar[type[ResponseHeader]] = ResponseHeader
    markers: tuple[WritableTxnMarkerResultV0, ...]


REQUESTS: dict[tuple[int, int], type[Any]] = {
    (0, 0): ProduceRequestV0,
    (0, 1): ProduceRequestV0,
    (0, 2): ProduceRequestV0,
    (1, 0): FetchRequestV0,
    (1, 1): FetchRequestV0,
    (1, 2): FetchRequestV0,
    (1, 3): FetchRequestV3,
    (2, 0): ListOffsetsRequestV0,
    (8, 0): OffsetCommitRequestV0,
    (8, 1): OffsetCommitRequestV1,
    (9, 0): OffsetFetchRequest,
    (27, 0): WriteTxnMarkersRequestV0,
}

RESPONSES: dict[tuple[int, int], type[Any]] = {
    (0, 0): ProduceResponseV0,
    (0, 1): ProduceResponseV1,
    (0, 2): ProduceResponseV2,
    (1, 0): FetchResponseV0,
    (1, 1): FetchResponseV1,
    (1, 2): FetchResponseV1,
    (1, 3): FetchResponseV1,
    (2, 0): ListOffsetsResponseV0,
    (8, 0): OffsetCommitResponse,
    (8, 1): OffsetCommitResponse,
    (9, 0): OffsetFetchResponse,
    (27, 0): WriteTxnMarkersResponseV0,
}
