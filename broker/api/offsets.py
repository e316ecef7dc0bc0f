"""ListOffsets, OffsetForLeaderEpoch, DeleteRecords and InitProducerId."""

from __future__ import annotations

from typing import Any

from kafscale.broker.api import access, transactions
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_state import end_offset_for_epoch
from kafscale.broker.metadata.partition_txns import last_stable_offset
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, MetadataTimeout

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
READ_COMMITTED = 1
MAX_PRODUCER_EPOCH = 2**15 - 1  # producer epochs are i16 on the wire


async def handle_list_offsets(request: Any, ctx: RequestContext) -> Body:
    topics = []
    for topic in request.topics:
        partitions = [await _list_one(request, topic.name, p, ctx) for p in topic.partitions]
        if ctx.api_version == 0:
            partitions = [old_style(p) for p in partitions]
        topics.append({"name": topic.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


def old_style(partition: Body) -> Body:
    """A v1+ answer in v0's shape: a list of offsets (one, or none when nothing matched).

    v0 asked for up to ``max_num_offsets`` segment start offsets before a timestamp; clients
    ask for one, and Kafka 3.9 answers latest/earliest with the one offset, as here."""
    offset = int(partition["offset"])
    offsets = [offset] if offset >= 0 else []
    return {
        "partition_index": partition["partition_index"],
        "error_code": partition["error_code"],
        "old_style_offsets": offsets,
    }


async def _list_one(request: Any, topic: str, partition: Any, ctx: RequestContext) -> Body:
    """One partition's answer; with isolation_level read_committed (v2+) the latest offset is
    the last stable offset, as consumers reading committed data start from it."""
    broker = ctx.broker
    index = int(partition.partition_index)
    base: Body = {"partition_index": index, "timestamp": -1, "offset": -1, "leader_epoch": -1}
    if denied := access.topic_denied(ctx, Operation.DESCRIBE, topic):
        return {**base, "error_code": denied}
    info = broker.view.topics.get(topic)
    if info is None or not 0 <= index < info.partitions:
        return {**base, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    try:
        state = await broker.fresh_state((topic, index))
        timestamp = int(partition.timestamp)
        epoch = max(state.leader_epoch, 0)
        if timestamp == EARLIEST:
            return {
                **base,
                "error_code": ErrorCode.NONE,
                "offset": state.log_start_offset,
                "leader_epoch": epoch,
            }
        if timestamp == MAX_TIMESTAMP and ctx.api_version >= 7:
            found = await broker.reader.offset_for_max_timestamp(topic, info.topic_id, index, state)
            if found is not None:
                return {
                    **base,
                    "error_code": ErrorCode.NONE,
                    "offset": found[0],
                    "timestamp": found[1],
                    "leader_epoch": epoch,
                }
            return {**base, "error_code": ErrorCode.NONE}
        if timestamp in (LATEST, MAX_TIMESTAMP) or timestamp < 0:
            committed = int(getattr(request, "isolation_level", 0)) == READ_COMMITTED
            return {
                **base,
                "error_code": ErrorCode.NONE,
                "offset": last_stable_offset(state) if committed else state.high_watermark,
                "leader_epoch": epoch,
            }
        found = await broker.reader.offset_for_timestamp(
            topic, info.topic_id, index, state, timestamp
        )
    except MetadataUnavailable as exc:
        return {**base, "error_code": MetadataTimeout(str(exc)).code}
    except KafkaError as exc:
        return {**base, "error_code": exc.code}
    if found is None:
        return {**base, "error_code": ErrorCode.NONE}
    offset, found_timestamp = found
    return {
        **base,
        "error_code": ErrorCode.NONE,
        "offset": offset,
        "timestamp": found_timestamp,
        "leader_epoch": epoch,
    }


async def handle_offset_for_leader_epoch(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    topics = []
    for topic in request.topics:
        results = []
        for p in topic.partitions:
            index = int(p.partition)
            info = broker.view.topics.get(topic.topic)
            denied = access.topic_denied(ctx, Operation.DESCRIBE, topic.topic)
            if denied or info is None or not 0 <= index < info.partitions:
                results.append(
                    {
                        "partition": index,
                        "leader_epoch": -1,
                        "end_offset": -1,
                        "error_code": denied or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    }
                )
                continue
            try:
                state = await broker.fresh_state((topic.topic, index))
            except MetadataUnavailable as exc:  # a non-owner's read of etcd: retriable
                code = MetadataTimeout(str(exc)).code
                results.append(
                    {"partition": index, "leader_epoch": -1, "end_offset": -1, "error_code": code}
                )
                continue
            epoch, end_offset = end_offset_for_epoch(state, int(p.leader_epoch))
            results.append(
                {
                    "partition": index,
                    "leader_epoch": epoch,
                    "end_offset": end_offset,
                    "error_code": ErrorCode.NONE,
                }
            )
        topics.append({"topic": topic.topic, "partitions": results})
    return {"throttle_time": 0, "topics": topics}


async def handle_delete_records(request: Any, ctx: RequestContext) -> Body:
    manager = ctx.broker.log_manager
    topics = []
    for topic in request.topics:
        results = []
        for p in topic.partitions:
            index = int(p.partition_index)
            try:
                access.require(ctx, Operation.DELETE, access.TOPIC, topic.name)
                await _check_delete_offset(topic.name, index, int(p.offset), ctx)
                low = await manager.delete_records((topic.name, index), int(p.offset))
                results.append(
                    {"partition_index": index, "low_watermark": low, "error_code": ErrorCode.NONE}
                )
            except KafkaError as exc:
                results.append(
                    {"partition_index": index, "low_watermark": -1, "error_code": exc.code}
                )
        topics.append({"name": topic.name, "partitions": results})
    return {"throttle_time": 0, "topics": topics}


async def _check_delete_offset(
    topic: str, partition: int, offset: int, ctx: RequestContext
) -> None:
    """An offset beyond the high watermark is OFFSET_OUT_OF_RANGE (Kafka's answer) from any
    broker, before ownership is asked: a broker that does not own the partition would answer
    NOT_LEADER_OR_FOLLOWER, and the client would retry an impossible request elsewhere."""
    info = ctx.broker.view.topics.get(topic)
    if info is None or not 0 <= partition < info.partitions:
        raise KafkaError(
            f"unknown partition {topic}-{partition}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
    if offset == -1:
        return
    try:
        state = await ctx.broker.fresh_state((topic, partition))
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    if offset < 0 or offset > state.high_watermark:
        raise KafkaError(
            f"offset {offset} is beyond the high watermark {state.high_watermark}",
            ErrorCode.OFFSET_OUT_OF_RANGE,
        )


async def handle_init_producer_id(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    if request.transactional_id:
        return await transactions.handle_init_transactional(request, ctx)
    if not idempotent_write_allowed(ctx):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    existing = int(getattr(request, "producer_id", -1))
    existing_epoch = int(getattr(request, "producer_epoch", -1))
    try:
        if existing >= 0 and 0 <= existing_epoch < MAX_PRODUCER_EPOCH:
            # KIP-360: an idempotent producer bumps its own epoch to reset sequences. At the
            # last epoch an i16 holds it gets a new producer id instead, as in Kafka.
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.NONE,
                "producer_id": existing,
                "producer_epoch": existing_epoch + 1,
            }
        producer_id = await broker.etcd.increment(keys.producer_id_counter_key(broker.cluster))
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "producer_id": producer_id,
        "producer_epoch": 0,
    }


def idempotent_write_allowed(ctx: RequestContext) -> bool:
    """An idempotent producer may start with IDEMPOTENT_WRITE on the cluster or, since Kafka
    2.8 (KIP-679), with WRITE on any topic."""
    return access.allowed_on_cluster(ctx, Operation.IDEMPOTENT_WRITE) or access.allowed_on_any(
        ctx, Operation.WRITE, access.TOPIC
    )
