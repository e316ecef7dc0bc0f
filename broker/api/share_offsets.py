"""DescribeShareGroupOffsets (KIP-932) on the group's coordinator: each share-partition's start
offset (SPSO) and, from v1, its lag (records from the start to the high watermark not yet
acknowledged or archived), as ``kafka-share-groups.sh --describe`` and the Java Admin's
``listShareGroupOffsets`` show them.

The share-partition states are read from etcd (``share-state/<group>/``), where their owners
write them in flush rounds; a share-partition this broker owns is answered from memory.
"""

from __future__ import annotations

import uuid
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    alter_share_group_offsets_error_body,
    delete_share_group_offsets_error_body,
    share_offsets_group_error,
)
from kafscale.broker.api.group_access import DESCRIBE, group_runtime
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.share.partition import RecordState, SharePartition

Stored = dict[tuple[str, int], tuple[str, SharePartition]]


def lag(state: SharePartition, high_watermark: int) -> int:
    """Records from the start offset to the high watermark still to be done."""
    done = sum(
        1
        for record in state.records.values()
        if record.state in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
    )
    return max(high_watermark - state.start_offset - done, 0)


async def handle_describe_share_group_offsets(request: Any, ctx: RequestContext) -> Body:
    groups = [await _group(ctx, group) for group in request.groups]
    return {"throttle_time": 0, "groups": groups}


async def _group(ctx: RequestContext, group: Any) -> Body:
    group_id = str(group.group_id)
    try:
        runtime = await group_runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DESCRIBE)
        if runtime.share is None:
            raise KafkaError(
                f"Group {group_id} is not a share group.", ErrorCode.GROUP_ID_NOT_FOUND
            )
        manager = ctx.broker.share
        if manager is None:
            raise KafkaError("share groups are not served yet", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        stored = await manager.start_offsets(group_id)
    except KafkaError as exc:
        return share_offsets_group_error(group_id, exc.code, str(exc))
    except MetadataUnavailable as exc:
        return share_offsets_group_error(group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc))
    wanted = _wanted(ctx, group.topics, stored)
    topics = []
    for name, partitions in wanted.items():
        if not access.allowed(ctx, DESCRIBE, access.TOPIC, name):
            continue
        info = ctx.broker.view.topics.get(name)
        topic_id = uuid.UUID(hex=info.topic_id) if info is not None else None
        entries = [_partition(ctx, name, p, info is not None, stored) for p in partitions]
        topics.append({"topic_name": name, "topic_id": topic_id, "partitions": entries})
    return {"group_id": group_id, "topics": topics, "error_code": ErrorCode.NONE}


def _wanted(ctx: RequestContext, requested: Any, stored: Stored) -> dict[str, list[int]]:
    """The partitions asked for, or (topics null) every one with state of a live topic."""
    if requested is not None:
        return {str(t.topic_name): [int(p) for p in t.partitions] for t in requested}
    wanted: dict[str, list[int]] = {}
    topics = ctx.broker.view.topics
    for (name, partition), (topic_id, _) in sorted(stored.items()):
        if name in topics and topics[name].topic_id == topic_id:
            wanted.setdefault(name, []).append(partition)
    return wanted


def _partition(
    ctx: RequestContext, name: str, partition: int, exists: bool, stored: Stored
) -> Body:
    body: Body = {"partition_index": partition, "start_offset": -1, "leader_epoch": -1, "lag": -1}
    info = ctx.broker.view.topics.get(name)
    if not exists or info is None or not 0 <= partition < info.partitions:
        return {**body, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    found = stored.get((name, partition))
    if found is None or found[0] != info.topic_id:
        return {**body, "error_code": ErrorCode.NONE}
    state = found[1]
    high_watermark = ctx.broker.committed_state((name, partition)).high_watermark
    return {
        **body,
        "start_offset": state.start_offset,
        "lag": lag(state, high_watermark),
        "error_code": ErrorCode.NONE,
    }


# --- AlterShareGroupOffsets / DeleteShareGroupOffsets -----------------------------------------


async def _empty_share_group(ctx: RequestContext, group_id: str) -> Any:
    """The group's runtime, if it is (or now is) an empty share group; else KafkaError."""
    groups = ctx.broker.groups
    if groups is not None and (full := groups.share_group_refusal(group_id)):
        raise KafkaError(full, ErrorCode.GROUP_MAX_SIZE_REACHED)
    runtime = await group_runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    error = await runtime.empty_share_group()
    if error is ErrorCode.NON_EMPTY_GROUP:
        raise KafkaError(f"Group {group_id} is not empty.", error)
    if error is not ErrorCode.NONE:
        raise KafkaError(f"Group {group_id} is not a share group.", error)
    if ctx.broker.share is None:
        raise KafkaError("share groups are not served yet", ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return runtime


def _topic_id(ctx: RequestContext, name: str) -> uuid.UUID | None:
    info = ctx.broker.view.topics.get(name)
    return uuid.UUID(hex=info.topic_id) if info is not None else None


async def handle_alter_share_group_offsets(request: Any, ctx: RequestContext) -> Body:
    """Each named share-partition restarts at the given start offset, nothing in flight; only
    while the group is empty (as Kafka: NON_EMPTY_GROUP otherwise)."""
    group_id = str(request.group_id)
    try:
        runtime = await _empty_share_group(ctx, group_id)
    except KafkaError as exc:
        return alter_share_group_offsets_error_body(request, exc.code, str(exc))
    starts: dict[tuple[str, int], tuple[str, int]] = {}
    answers: dict[str, list[Body]] = {}
    for topic in request.topics:
        name = str(topic.topic_name)
        info = ctx.broker.view.topics.get(name)
        for p in topic.partitions:
            index, start = int(p.partition_index), int(p.start_offset)
            code = ErrorCode.NONE
            if denied := access.topic_denied(ctx, Operation.READ, name):
                code = denied
            elif info is None or not 0 <= index < info.partitions:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif start < 0:
                code = ErrorCode.INVALID_REQUEST
            else:
                starts[(name, index)] = (info.topic_id, start)
            answers.setdefault(name, []).append({"partition_index": index, "error_code": code})
    error = await _replace(ctx, runtime, group_id, starts, [])
    if error is not ErrorCode.NONE:
        return alter_share_group_offsets_error_body(request, error, None)
    responses = [
        {"topic_name": name, "topic_id": _topic_id(ctx, name), "partitions": partitions}
        for name, partitions in answers.items()
    ]
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "responses": responses}


async def handle_delete_share_group_offsets(request: Any, ctx: RequestContext) -> Body:
    """Every share-partition of the named topics forgets its state (the next member starts at
    ``share.auto.offset.reset``); only while the group is empty."""
    group_id = str(request.group_id)
    try:
        runtime = await _empty_share_group(ctx, group_id)
    except KafkaError as exc:
        return delete_share_group_offsets_error_body(request, exc.code, str(exc))
    doomed: list[str] = []
    responses = []
    for topic in request.topics:
        name = str(topic.topic_name)
        code = ErrorCode.NONE
        if denied := access.topic_denied(ctx, Operation.READ, name):
            code = denied
        elif name not in ctx.broker.view.topics:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            doomed.append(name)
        responses.append({"topic_name": name, "topic_id": _topic_id(ctx, name), "error_code": code})
    error = await _replace(ctx, runtime, group_id, {}, doomed)
    if error is not ErrorCode.NONE:
        return delete_share_group_offsets_error_body(request, error, None)
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "responses": responses}


async def _replace(
    ctx: RequestContext,
    runtime: Any,
    group_id: str,
    starts: dict[tuple[str, int], tuple[str, int]],
    doomed: list[str],
) -> ErrorCode:
    manager = ctx.broker.share
    if manager is None or (not starts and not doomed):
        return ErrorCode.NONE
    try:
        done = await manager.replace_states(runtime.fence.compares(), group_id, starts, doomed)
    except MetadataUnavailable:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    return ErrorCode.NONE if done else ErrorCode.NOT_COORDINATOR
