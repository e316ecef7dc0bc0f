"""The share group APIs on the coordinator (KIP-932): ShareGroupHeartbeat and ShareGroupDescribe.

Translation only: partitions travel as topic ids on the wire and as names in the coordinator
(``groups.share``), which decides. Requests are checked as Kafka checks them: INVALID_REQUEST
for an empty group or member id, a join without subscribed topics, an epoch below -1.
"""

from __future__ import annotations

from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.consumer_groups import (
    _assignment_body,
)
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    missing_group,
)
from kafscale.broker.api.group_access import DESCRIBE, client_host, group_runtime
from kafscale.broker.groups.consumer import HeartbeatResult
from kafscale.broker.groups.share import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    SIMPLE_ASSIGNOR,
    ShareGroup,
    ShareHeartbeat,
)
from kafscale.broker.protocol.errors import ErrorCode, KafkaError


def _invalid(request: Any) -> str | None:
    """Kafka's ``throwIfShareGroupHeartbeatRequestIsInvalid``."""
    epoch = int(request.member_epoch)
    if not request.group_id:
        return "GroupId can't be empty."
    if not request.member_id:
        return "MemberId can't be empty."
    if epoch == JOIN_EPOCH and not request.subscribed_topic_names:
        return "SubscribedTopicNames must be set in first request."
    if epoch < LEAVE_EPOCH:
        return f"MemberEpoch is {epoch}, but must be greater than or equal to -1."
    return None


def _heartbeat_body(ctx: RequestContext, result: HeartbeatResult) -> Body:
    assignment = None
    if result.assignment is not None:
        assignment = {"topic_partitions": _assignment_body(ctx, result.assignment)}
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "error_message": result.message,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


def share_group_refusal(ctx: RequestContext, request: Any) -> str | None:
    """Why a join may not create its share group (``groups.share_max_groups``), asked before
    the group's lease is taken; None when it may or the coordinator is not running (the
    heartbeat then gets that answer)."""
    groups = ctx.broker.groups
    return None if groups is None else groups.share_group_refusal(str(request.group_id))


async def handle_share_group_heartbeat(request: Any, ctx: RequestContext) -> Body:
    if (problem := _invalid(request)) is not None:
        return _heartbeat_body(ctx, HeartbeatResult(ErrorCode.INVALID_REQUEST, problem))
    if int(request.member_epoch) == JOIN_EPOCH and (full := share_group_refusal(ctx, request)):
        return _heartbeat_body(ctx, HeartbeatResult(ErrorCode.GROUP_MAX_SIZE_REACHED, full))
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return _heartbeat_body(ctx, HeartbeatResult(exc.code, str(exc) or None))
    names = request.subscribed_topic_names
    heartbeat = ShareHeartbeat(
        member_id=str(request.member_id),
        member_epoch=int(request.member_epoch),
        rack_id=request.rack_id,
        subscribed_topic_names=None if names is None else tuple(str(n) for n in names),
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
    )
    topics = {
        name: info.partitions
        for name, info in ctx.broker.view.topics.items()
        if access.allowed(ctx, DESCRIBE, access.TOPIC, name)
    }
    try:
        ids = {name: ctx.broker.view.topics[name].topic_id for name in topics}
        result = await runtime.share_heartbeat(heartbeat, topics, ids)
    except KafkaError as exc:
        result = HeartbeatResult(exc.code, str(exc) or None)
    return _heartbeat_body(ctx, result)


# --- ShareGroupDescribe -----------------------------------------------------------------------


async def handle_share_group_describe(request: Any, ctx: RequestContext) -> Body:
    include = bool(request.include_authorized_operations)
    described = []
    for group_id in request.group_ids:
        operations = access.operations_if_asked(ctx, include, access.GROUP, group_id)
        try:
            runtime = await group_runtime(
                ctx, group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE, DESCRIBE
            )
        except KafkaError as exc:
            described.append(missing_group(group_id, exc.code, str(exc) or None, operations))
            continue
        share = runtime.share
        if share is None:
            exists = runtime.group is not None or runtime.consumer is not None
            message = f"Group {group_id} is not a share group." if exists else None
            message = message or f"Group {group_id} not found."
            described.append(
                missing_group(group_id, ErrorCode.GROUP_ID_NOT_FOUND, message, operations)
            )
            continue
        described.append(_described(ctx, group_id, share, operations))
    return {"throttle_time": 0, "groups": described}


def _described(ctx: RequestContext, group_id: str, group: ShareGroup, operations: int) -> Body:
    members = [
        {
            "member_id": m.member_id,
            "rack_id": m.rack_id,
            "member_epoch": m.epoch,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "subscribed_topic_names": list(m.topic_names),
            "assignment": {"topic_partitions": _assignment_body(ctx, m.assigned, True)},
        }
        for m in group.members.values()
    ]
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "group_id": group_id,
        "group_state": group.state,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor_name": SIMPLE_ASSIGNOR,
        "members": members,
        "authorized_operations": operations,
    }
