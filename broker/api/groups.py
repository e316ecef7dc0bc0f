"""Classic consumer group APIs: JoinGroup, SyncGroup, Heartbeat, LeaveGroup (membership) and
DescribeGroups, ListGroups, DeleteGroups (the groups as a whole).

Handlers translate between the wire (every version's fields) and the coordinator
(``kafscale.broker.groups``); the protocol's decisions live there. Version gates follow Kafka:
MEMBER_ID_REQUIRED from JoinGroup v4, group.instance.id from JoinGroup v5 / SyncGroup and
Heartbeat v3, batch LeaveGroup from v3. FindCoordinator is in ``api.coordinators``, OffsetCommit
and OffsetFetch in ``api.group_offsets``.

When etcd cannot be reached the group is never served from a guess: these APIs answer
COORDINATOR_NOT_AVAILABLE (the code their clients retry on after looking the coordinator up
again).
"""

from __future__ import annotations

import uuid
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    join_group_body,
    sync_group_body,
)
from kafscale.broker.api.group_access import (
    DELETE,
    DESCRIBE,
    client_host,
    coordinator,
    group_runtime,
)
from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.model import (
    GroupDescription,
    GroupState,
    JoinRequest,
    JoinResult,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, UnreadableRecord

# --- JoinGroup, SyncGroup, Heartbeat, LeaveGroup ----------------------------------------------


async def handle_join_group(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    member_id = str(request.member_id)
    if not request.group_id:
        return join_group_body(JoinResult(ErrorCode.INVALID_GROUP_ID, member_id))
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return join_group_body(JoinResult(exc.code, member_id))
    session_timeout_ms = millis(request.session_timeout)
    rebalance_timeout = getattr(request, "rebalance_timeout", None)
    join = JoinRequest(
        member_id=member_id,
        group_instance_id=getattr(request, "group_instance_id", None) if version >= 5 else None,
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
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
    return join_group_body(await runtime.join(join, topics))


async def handle_sync_group(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    protocol_type = getattr(request, "protocol_type", None)
    protocol_name = getattr(request, "protocol_name", None)
    if not request.group_id:
        return sync_group_body(SyncResult(ErrorCode.INVALID_GROUP_ID))
    if version >= 5 and (protocol_type is None or protocol_name is None):
        return sync_group_body(SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return sync_group_body(SyncResult(exc.code))
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
    return sync_group_body(await runtime.sync(sync))


async def handle_heartbeat(request: Any, ctx: RequestContext) -> Body:
    if not request.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_GROUP_ID}
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
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
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
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


# --- DescribeGroups, ListGroups, DeleteGroups -------------------------------------------------


async def handle_describe_groups(request: Any, ctx: RequestContext) -> Body:
    include_operations = bool(getattr(request, "include_authorized_operations", False))
    described = []
    for group_id in request.groups:
        operations = access.operations_if_asked(ctx, include_operations, access.GROUP, group_id)
        try:
            runtime = await group_runtime(
                ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DESCRIBE
            )
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


async def handle_list_groups(request: Any, ctx: RequestContext) -> Body:
    states = {s.lower() for s in getattr(request, "states_filter", ()) or ()}
    types = {t.lower() for t in getattr(request, "types_filter", ()) or ()}
    try:
        listed = await coordinator(ctx).list_groups()
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
            error = await _delete_group(ctx, group_id)
        except KafkaError as exc:
            error = exc.code
        results.append({"group_id": group_id, "error_code": error})
    return {"throttle_time": 0, "results": results}


async def _delete_group(ctx: RequestContext, group_id: str) -> ErrorCode:
    """One group's DeleteGroups answer. A group whose stored record does not decode (which
    every other request is refused for) is deleted whole: that is how it is repaired with
    Kafka's tools."""
    try:
        runtime = await group_runtime(ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DELETE)
    except UnreadableRecord:
        try:
            error = await coordinator(ctx).delete_unreadable(group_id)
        except MetadataUnavailable as exc:
            raise KafkaError(str(exc), ErrorCode.COORDINATOR_NOT_AVAILABLE) from exc
        was_share = True  # unknown: its record did not decode; forgetting costs nothing
    else:
        was_share = runtime.share is not None
        error = await runtime.delete()
    if was_share and error is ErrorCode.NONE and ctx.broker.share is not None:
        ctx.broker.share.forget_group(group_id)  # etcd's copy went with the group
    return error
