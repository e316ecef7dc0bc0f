"""Consumer group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and DeleteGroups.

Handlers translate between the wire (every version's fields) and the coordinator
(``kafscale.broker.groups``); the protocol's decisions live there. Version gates follow Kafka:
MEMBER_ID_REQUIRED from JoinGroup v4, group.instance.id from JoinGroup v5 / SyncGroup and
Heartbeat v3 / OffsetCommit v7, batch LeaveGroup from v3, OffsetFetch of several groups from v8.

When etcd cannot be reached the group is never served from a guess: OffsetCommit answers
REQUEST_TIMED_OUT, the membership and read APIs COORDINATOR_NOT_AVAILABLE (the code their
clients retry on after looking the coordinator up again).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.model import (
    GroupDescription,
    GroupState,
    JoinRequest,
    JoinResult,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.store import CommittedOffset, TopicPartition
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
OFFSET_METADATA_MAX_BYTES = 4096
"""Kafka's ``offset.metadata.max.bytes``."""
AUTHORIZED_OPERATIONS_OMITTED = -2147483648


def _coordinator(ctx: RequestContext) -> GroupCoordinator:
    coordinator = ctx.broker.groups
    if coordinator is None:
        raise KafkaError(
            "the group coordinator is not running", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )
    return coordinator


READ, DESCRIBE, DELETE = Operation.READ, Operation.DESCRIBE, Operation.DELETE


async def _runtime(
    ctx: RequestContext, group_id: str, unavailable: ErrorCode, operation: Operation = READ
) -> GroupRuntime:
    """The group as coordinated here; KafkaError (GROUP_AUTHORIZATION_FAILED unless the
    principal may do ``operation`` to the group, NOT_COORDINATOR, ``unavailable``) if not."""
    access.require(ctx, operation, access.GROUP, group_id)
    try:
        return await _coordinator(ctx).runtime(group_id)
    except MetadataUnavailable as exc:
        raise KafkaError(str(exc), unavailable) from exc


group_runtime = _runtime
"""For TxnOffsetCommit (``api.transactions``), which runs on the group's coordinator too."""


def _client_host(ctx: RequestContext) -> str:
    host = ctx.connection.peer.rpartition(":")[0] or ctx.connection.peer
    return "/" + host.strip("[]")


# --- FindCoordinator --------------------------------------------------------------------------


async def handle_find_coordinator(request: Any, ctx: RequestContext) -> Body:
    key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE))
    if ctx.api_version >= 4:
        entries = [_coordinator_entry(ctx, key, key_type) for key in request.coordinator_keys]
        return {"throttle_time": 0, "coordinators": entries}
    entry = _coordinator_entry(ctx, request.key, key_type)
    return {"throttle_time": 0, **{k: v for k, v in entry.items() if k != "key"}}


def _coordinator_entry(ctx: RequestContext, key: str, key_type: int) -> Body:
    entry: Body = {"key": key, "node_id": -1, "host": "", "port": -1}
    if key_type == GROUP_KEY_TYPE and not access.allowed(ctx, DESCRIBE, access.GROUP, key):
        return {**entry, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "error_message": None}
    if key_type == TRANSACTION_KEY_TYPE and not access.allowed(
        ctx, DESCRIBE, access.TRANSACTIONAL_ID, key
    ):
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return {**entry, "error_code": code, "error_message": None}
    if key_type == TRANSACTION_KEY_TYPE:
        transactions = ctx.broker.transactions
        broker = transactions.coordinator_for(key) if transactions is not None else None
    elif key_type == GROUP_KEY_TYPE:
        broker = _coordinator(ctx).coordinator_for(key)
    else:
        message = f"key type {key_type} is not supported"
        return {**entry, "error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
    if broker is None:
        message = "no live broker"
        return {
            **entry,
            "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
            "error_message": message,
        }
    host, port = broker.endpoint(ctx.connection.listener)
    return {
        "key": key,
        "node_id": broker.node_id,
        "host": host,
        "port": port,
        "error_code": ErrorCode.NONE,
        "error_message": None,
    }


def find_coordinator_error_body(request: Any, code: ErrorCode) -> Body:
    keys = list(getattr(request, "coordinator_keys", ()) or ())
    coordinators = [
        {"key": k, "node_id": -1, "host": "", "port": -1, "error_code": code} for k in keys
    ]
    return {
        "throttle_time": 0,
        "error_code": code,
        "node_id": -1,
        "host": "",
        "port": -1,
        "coordinators": coordinators,
    }


# --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------


async def handle_join_group(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    member_id = str(request.member_id)
    if not request.group_id:
        return _join_body(JoinResult(ErrorCode.INVALID_GROUP_ID, member_id))
    try:
        runtime = await _runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return _join_body(JoinResult(exc.code, member_id))
    session_timeout_ms = millis(request.session_timeout)
    rebalance_timeout = getattr(request, "rebalance_timeout", None)
    join = JoinRequest(
        member_id=member_id,
        group_instance_id=getattr(request, "group_instance_id", None) if version >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=_client_host(ctx),
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=(
            millis(rebalance_timeout) if rebalance_timeout is not None else session_timeout_ms
        ),
        protocol_type=str(request.protocol_type),
        protocols=tuple((str(p.name), bytes(p.metadata)) for p in request.protocols),
        require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9,
        fresh_id=str(uuid.uuid4()),
        reason=getattr(request, "reason", None),
    )
    topics = {
        name: info.partitions
        for name, info in ctx.broker.view.topics.items()
        if access.allowed(ctx, DESCRIBE, access.TOPIC, name)
    }
    return _join_body(await runtime.join(join, topics))


def _join_body(result: JoinResult) -> Body:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "leader": result.leader_id,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "metadata": m.metadata,
            }
            for m in result.members
        ],
    }


def join_group_error_body(request: Any, code: ErrorCode) -> Body:
    return _join_body(JoinResult(code, str(getattr(request, "member_id", ""))))


async def handle_sync_group(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    protocol_type = getattr(request, "protocol_type", None)
    protocol_name = getattr(request, "protocol_name", None)
    if not request.group_id:
        return _sync_body(SyncResult(ErrorCode.INVALID_GROUP_ID))
    if version >= 5 and (protocol_type is None or protocol_name is None):
        return _sync_body(SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
    try:
        runtime = await _runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return _sync_body(SyncResult(exc.code))
    assignments: dict[str, bytes] = {}
    for entry in request.assignments:
        assignments[str(entry.member_id)] = bytes(entry.assignment)
    sync = SyncRequest(
        member_id=str(request.member_id),
        generation_id=int(request.generation_id),
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=protocol_type,
        protocol_name=protocol_name,
        assignments=assignments,
    )
    return _sync_body(await runtime.sync(sync))


def _sync_body(result: SyncResult) -> Body:
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }


def sync_group_error_body(_request: Any, code: ErrorCode) -> Body:
    return _sync_body(SyncResult(code))


async def handle_heartbeat(request: Any, ctx: RequestContext) -> Body:
    if not request.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_GROUP_ID}
    try:
        runtime = await _runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return {"throttle_time": 0, "error_code": exc.code}
    error = runtime.heartbeat(
        str(request.member_id),
        getattr(request, "group_instance_id", None),
        int(request.generation_id),
    )
    return {"throttle_time": 0, "error_code": error}


async def handle_leave_group(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    if version >= 3:
        leaving = [(str(m.member_id), m.group_instance_id) for m in request.members]
    else:
        leaving = [(str(request.member_id), None)]
    if not request.group_id:
        return _leave_body(version, ErrorCode.INVALID_GROUP_ID, [], [])
    try:
        runtime = await _runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return _leave_body(version, exc.code, [], [])
    group_error, errors = runtime.leave(leaving)
    return _leave_body(version, group_error, leaving, errors)


def _leave_body(
    version: int,
    group_error: ErrorCode,
    leaving: list[tuple[str, str | None]],
    errors: list[ErrorCode],
) -> Body:
    if version < 3 and group_error is ErrorCode.NONE and errors:
        group_error = errors[0]  # v0-2 carry the one member's error at the top
    members = [
        {"member_id": member_id, "group_instance_id": instance_id, "error_code": error}
        for (member_id, instance_id), error in zip(leaving, errors, strict=True)
    ]
    return {"throttle_time": 0, "error_code": group_error, "members": members}


# --- OffsetCommit, OffsetFetch ----------------------------------------------------------------


async def handle_offset_commit(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, READ, access.GROUP, request.group_id or "")
    view = ctx.broker.view
    now_ms = int(time.time() * 1000)
    results: dict[TopicPartition, ErrorCode] = {}
    valid: dict[TopicPartition, CommittedOffset] = {}
    order: list[tuple[str, list[int]]] = []
    for topic in request.topics:
        indexes = []
        info = view.topics.get(topic.name)
        for p in topic.partitions:
            tp = (str(topic.name), int(p.partition_index))
            indexes.append(tp[1])
            metadata = p.committed_metadata or ""
            if denied := access.topic_denied(ctx, READ, topic.name):
                results[tp] = denied
            elif info is None or not 0 <= tp[1] < info.partitions:
                results[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata.encode()) > OFFSET_METADATA_MAX_BYTES:
                results[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = CommittedOffset(
                    offset=int(p.committed_offset),
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    metadata=metadata,
                    commit_timestamp_ms=now_ms,
                    topic_id=info.topic_id,
                )
        order.append((str(topic.name), indexes))
    error = await _commit(request, ctx, valid)
    for tp in valid:
        results[tp] = error
    topics = [
        {
            "name": name,
            "partitions": [{"partition_index": p, "error_code": results[(name, p)]} for p in ps],
        }
        for name, ps in order
    ]
    return {"throttle_time": 0, "topics": topics}


async def _commit(
    request: Any, ctx: RequestContext, offsets: dict[TopicPartition, CommittedOffset]
) -> ErrorCode:
    if request.group_id is None:
        return ErrorCode.INVALID_GROUP_ID
    generation = int(getattr(request, "generation_id_or_member_epoch", -1))
    try:
        runtime = await _runtime(ctx, request.group_id, ErrorCode.REQUEST_TIMED_OUT)
    except KafkaError as exc:
        return exc.code
    return await runtime.commit(
        str(getattr(request, "member_id", "") or ""),
        getattr(request, "group_instance_id", None),
        generation,
        offsets,
        ctx.api_version,
    )


def offset_commit_error_body(request: Any, code: ErrorCode) -> Body:
    topics = [
        {
            "name": t.name,
            "partitions": [
                {"partition_index": p.partition_index, "error_code": code} for p in t.partitions
            ],
        }
        for t in getattr(request, "topics", ())
    ]
    return {"throttle_time": 0, "topics": topics}


async def handle_offset_fetch(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    stable = bool(getattr(request, "require_stable", False))
    if version >= 8:
        groups = [
            await _fetch_group(
                ctx,
                str(g.group_id),
                g.topics,
                version,
                (getattr(g, "member_id", None), int(getattr(g, "member_epoch", -1))),
                stable,
            )
            for g in request.groups
        ]
        return {"throttle_time": 0, "groups": groups}
    fetched = await _fetch_group(
        ctx, str(request.group_id), request.topics, version, require_stable=stable
    )
    return {"throttle_time": 0, "topics": fetched["topics"], "error_code": fetched["error_code"]}


async def _settle_pending(
    runtime: GroupRuntime, requested: list[TopicPartition] | None
) -> set[TopicPartition]:
    try:
        return await runtime.settle_pending(requested)
    except MetadataUnavailable as exc:
        raise KafkaError(str(exc), ErrorCode.COORDINATOR_NOT_AVAILABLE) from exc


async def _fetch_group(
    ctx: RequestContext,
    group_id: str,
    topics: Any,
    version: int,
    member: tuple[str | None, int] = (None, -1),
    require_stable: bool = False,
) -> Body:
    """One group's committed offsets; ``member``: (member id, epoch) from v9 (KIP-848);
    ``require_stable``: partitions with an offset pending in a transaction are answered
    UNSTABLE_OFFSET_COMMIT (KIP-447)."""
    requested: list[TopicPartition] | None = None
    denied: dict[TopicPartition, CommittedOffset | None] = {}
    if topics is not None:
        requested = [(str(t.name), int(p)) for t in topics for p in t.partition_indexes]
        denied = dict.fromkeys(tp for tp in requested if not _may_describe(ctx, tp[0]))
        requested = [tp for tp in requested if tp not in denied]
    try:
        runtime = await _runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DESCRIBE)
        if (member_error := runtime.validate_fetch(*member)) is not ErrorCode.NONE:
            return {"group_id": group_id, "error_code": member_error, "topics": []}
        unstable = await _settle_pending(runtime, requested)
        committed = runtime.committed(requested)
    except KafkaError as exc:
        if version < 2:
            # v0-1 have no group-level error: every partition carries it.
            partitions = dict.fromkeys(requested or [], None)
            return {
                "group_id": group_id,
                "error_code": exc.code,
                "topics": _fetched_topics(partitions, exc.code),
            }
        return {"group_id": group_id, "error_code": exc.code, "topics": []}
    current = {name: info.topic_id for name, info in ctx.broker.view.topics.items()}
    valid = {
        tp: offset if offset is None or offset.still_valid(current.get(tp[0])) else None
        for tp, offset in committed.items()
    }
    if requested is None:  # all of the group's offsets but of gone or undescribable topics
        valid = {
            tp: offset
            for tp, offset in valid.items()
            if offset is not None and _may_describe(ctx, tp[0])
        }
    # KIP-447: a consumer that asks for stable offsets (read_committed) is told to retry while
    # a transaction that committed an offset for the partition is still open.
    if not require_stable:
        unstable = set()
    unstable_topics = dict.fromkeys(tp for tp in valid if tp in unstable)
    valid = {tp: offset for tp, offset in valid.items() if tp not in unstable}
    return {
        "group_id": group_id,
        "error_code": ErrorCode.NONE,
        "topics": _fetched_topics(valid, ErrorCode.NONE)
        + _fetched_topics(unstable_topics, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        + _fetched_topics(denied, ErrorCode.TOPIC_AUTHORIZATION_FAILED),
    }


def _may_describe(ctx: RequestContext, topic: str) -> bool:
    return access.allowed(ctx, DESCRIBE, access.TOPIC, topic)


def _fetched_topics(
    committed: dict[TopicPartition, CommittedOffset | None], error: ErrorCode
) -> list[Body]:
    by_topic: dict[str, list[Body]] = {}
    for (topic, partition), offset in committed.items():
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": partition,
                "committed_offset": offset.offset if offset is not None else -1,
                "committed_leader_epoch": offset.leader_epoch if offset is not None else -1,
                "metadata": offset.metadata if offset is not None else "",
                "error_code": error,
            }
        )
    return [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]


def offset_fetch_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [
        {"group_id": g.group_id, "error_code": code, "topics": []}
        for g in getattr(request, "groups", ())
    ]
    return {"throttle_time": 0, "error_code": code, "topics": [], "groups": groups}


# --- DescribeGroups, ListGroups, DeleteGroups -------------------------------------------------


async def handle_describe_groups(request: Any, ctx: RequestContext) -> Body:
    include_operations = bool(getattr(request, "include_authorized_operations", False))
    described = []
    for group_id in request.groups:
        operations = access.operations_if_asked(ctx, include_operations, access.GROUP, group_id)
        try:
            runtime = await _runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DESCRIBE)
            description = runtime.describe()
            if runtime.consumer is not None:
                described.append(_described_consumer(group_id, runtime.consumer, operations))
                continue
        except KafkaError as exc:
            empty = GroupDescription(GroupState.DEAD, "", "", ())
            described.append(_described(group_id, exc.code, empty, "", operations))
            continue
        described.append(
            _described(group_id, ErrorCode.NONE, description, description.state.value, operations)
        )
    return {"throttle_time": 0, "groups": described}


def _described(
    group_id: str, error: ErrorCode, description: GroupDescription, state: str, operations: int
) -> Body:
    return {
        "error_code": error,
        "group_id": group_id,
        "group_state": state,
        "protocol_type": description.protocol_type,
        "protocol_data": description.protocol,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata,
                "member_assignment": m.assignment,
            }
            for m in description.members
        ],
        "authorized_operations": operations,
    }


def _described_consumer(group_id: str, group: ConsumerGroup, operations: int) -> Body:
    """A consumer-protocol group through the classic DescribeGroups: its type shows as
    protocol type "consumer" with Kafka's consumer group states; no protocol metadata."""
    return {
        "error_code": ErrorCode.NONE,
        "group_id": group_id,
        "group_state": group.state,
        "protocol_type": "consumer",
        "protocol_data": "",
        "members": [
            {
                "member_id": view.member.member_id,
                "group_instance_id": view.member.instance_id,
                "client_id": view.member.client_id,
                "client_host": view.member.client_host,
                "member_metadata": b"",
                "member_assignment": b"",
            }
            for view in group.describe()
        ],
        "authorized_operations": operations,
    }


def describe_groups_error_body(request: Any, code: ErrorCode) -> Body:
    groups = [
        {
            "error_code": code,
            "group_id": g,
            "group_state": "",
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }
        for g in getattr(request, "groups", ())
    ]
    return {"throttle_time": 0, "groups": groups}


async def handle_list_groups(request: Any, ctx: RequestContext) -> Body:
    states = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    try:
        listed = await _coordinator(ctx).list_groups()
    except MetadataUnavailable:
        return {"throttle_time": 0, "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE, "groups": []}
    everything = access.allowed_on_cluster(ctx, DESCRIBE)
    groups = [
        {
            "group_id": g.group_id,
            "protocol_type": g.protocol_type,
            "group_state": g.state,
            "group_type": g.group_type,
        }
        for g in listed
        if (not states or g.state.lower() in states)
        and (not types or g.group_type in types)
        and (everything or access.allowed(ctx, DESCRIBE, access.GROUP, g.group_id))
    ]
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "groups": groups}


async def handle_delete_groups(request: Any, ctx: RequestContext) -> Body:
    results = []
    for group_id in request.groups_names:
        try:
            runtime = await _runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DELETE)
            error = await runtime.delete()
        except KafkaError as exc:
            error = exc.code
        results.append({"group_id": group_id, "error_code": error})
    return {"throttle_time": 0, "results": results}


def delete_groups_error_body(request: Any, code: ErrorCode) -> Body:
    names = getattr(request, "groups_names", ())
    return {"throttle_time": 0, "results": [{"group_id": g, "error_code": code} for g in names]}
