"""The consumer group protocol's APIs (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Translation only: partitions travel as topic ids on the wire and as topic names in the
coordinator (``groups.consumer``), which decides. Requests are checked as Kafka checks them
(INVALID_REQUEST for a join without a subscription or rebalance timeout, a non-empty owned list
on a join, a v1+ request without a member id; INVALID_REGULAR_EXPRESSION for a regex Python
cannot compile; UNSUPPORTED_ASSIGNOR for an assignor this broker does not have).
"""

from __future__ import annotations

import uuid
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    missing_group,
)
from kafscale.broker.api.group_access import DESCRIBE, client_host, group_runtime
from kafscale.broker.groups import assignors
from kafscale.broker.groups.consumer import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    HeartbeatRequest,
    HeartbeatResult,
    regex_error,
)
from kafscale.broker.groups.reconcile import TopicPartition
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.protocol.codec import millis
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

CONSUMER_MEMBER_TYPE = 1
CLASSIC_MEMBER_TYPE = 0
"""A classic member inside a consumer group (online migration)."""


def _topic_uuid(info: TopicInfo) -> uuid.UUID:
    return uuid.UUID(hex=info.topic_id)


def _owned(request: Any, ctx: RequestContext) -> frozenset[TopicPartition] | None:
    """The member's owned partitions by name (ids of deleted topics dropped), or None."""
    if request.topic_partitions is None:
        return None
    by_id = ctx.broker.view.topics_by_id
    owned: set[TopicPartition] = set()
    for entry in request.topic_partitions:
        info = by_id.get(entry.topic_id.hex) if entry.topic_id is not None else None
        if info is not None:
            owned.update((info.name, int(p)) for p in entry.partitions)
    return frozenset(owned)


def _invalid(request: Any, version: int) -> str | None:
    """Kafka's checks of a heartbeat, before the group is looked at."""
    epoch = int(request.member_epoch)
    if not request.group_id:
        return "group id can't be empty"
    if version >= 1 and not request.member_id:
        return "member id can't be empty"
    if request.instance_id is not None and not request.instance_id:
        return "instance id can't be empty"
    if epoch == JOIN_EPOCH:
        if millis(request.rebalance_timeout) <= 0:
            return "rebalance timeout must be provided when joining"
        regex = getattr(request, "subscribed_topic_regex", None)
        if not request.subscribed_topic_names and not regex:
            return "subscribed topic names or a regex must be set when joining"
        if request.topic_partitions:
            return "owned partitions must be empty when joining"
    elif epoch == STATIC_LEAVE_EPOCH and request.instance_id is None:
        return "instance id must be set to leave with epoch -2"
    elif epoch < STATIC_LEAVE_EPOCH:
        return f"invalid member epoch {epoch}"
    return None


def _assignment_body(
    ctx: RequestContext, partitions: frozenset[TopicPartition], with_names: bool = False
) -> list[Body]:
    """Partitions by topic id (and name, for ConsumerGroupDescribe); gone topics left out."""
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(partitions):
        by_topic.setdefault(topic, []).append(p)
    topics = ctx.broker.view.topics
    entries: list[Body] = []
    for name, ps in by_topic.items():
        if name in topics:
            entry: Body = {"topic_id": _topic_uuid(topics[name]), "partitions": ps}
            if with_names:
                entry["topic_name"] = name
            entries.append(entry)
    return entries


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


async def handle_consumer_group_heartbeat(request: Any, ctx: RequestContext) -> Body:
    version = ctx.api_version
    if (problem := _invalid(request, version)) is not None:
        return _heartbeat_body(ctx, HeartbeatResult(ErrorCode.INVALID_REQUEST, problem))
    regex = getattr(request, "subscribed_topic_regex", None)
    if regex and (problem := regex_error(regex)) is not None:
        result = HeartbeatResult(ErrorCode.INVALID_REGULAR_EXPRESSION, problem)
        return _heartbeat_body(ctx, result)
    assignor = request.server_assignor
    if assignor is not None and assignor not in assignors.ASSIGNORS:
        message = f"assignor {assignor!r} is not one of {', '.join(assignors.ASSIGNORS)}"
        return _heartbeat_body(ctx, HeartbeatResult(ErrorCode.UNSUPPORTED_ASSIGNOR, message))
    try:
        runtime = await group_runtime(ctx, request.group_id, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    except KafkaError as exc:
        return _heartbeat_body(ctx, HeartbeatResult(exc.code, str(exc) or None))
    names = request.subscribed_topic_names
    heartbeat = HeartbeatRequest(
        member_id=str(request.member_id),
        member_epoch=int(request.member_epoch),
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=millis(request.rebalance_timeout),
        subscribed_topic_names=None if names is None else tuple(str(n) for n in names),
        subscribed_topic_regex=regex,
        server_assignor=assignor,
        owned=_owned(request, ctx),
        client_id=ctx.header.client_id or "",
        client_host=client_host(ctx),
        fresh_id=str(uuid.uuid4()),
    )
    topics = {
        name: info.partitions
        for name, info in ctx.broker.view.topics.items()
        if access.allowed(ctx, DESCRIBE, access.TOPIC, name)
    }
    result = await runtime.consumer_heartbeat(heartbeat, topics)
    if result.error is ErrorCode.NONE and heartbeat.member_epoch == LEAVE_EPOCH:
        result = HeartbeatResult(ErrorCode.NONE, member_id=result.member_id, member_epoch=-1)
    return _heartbeat_body(ctx, result)


# --- ConsumerGroupDescribe --------------------------------------------------------------------


async def handle_consumer_group_describe(request: Any, ctx: RequestContext) -> Body:
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
        consumer = runtime.consumer
        if consumer is None:
            message = f"group {group_id} is not a consumer group"
            if runtime.group is None:
                message = f"group {group_id} not found"
            described.append(
                missing_group(group_id, ErrorCode.GROUP_ID_NOT_FOUND, message, operations)
            )
            continue
        described.append(_described(ctx, group_id, consumer, operations))
    return {"throttle_time": 0, "groups": described}


def _described(ctx: RequestContext, group_id: str, group: ConsumerGroup, operations: int) -> Body:
    members = []
    for view in group.describe():
        member = view.member
        members.append(
            {
                "member_id": member.member_id,
                "instance_id": member.instance_id,
                "rack_id": member.rack_id,
                "member_epoch": member.current.epoch,
                "client_id": member.client_id,
                "client_host": member.client_host,
                "subscribed_topic_names": list(member.topic_names),
                "subscribed_topic_regex": member.topic_regex,
                "assignment": {
                    "topic_partitions": _assignment_body(ctx, member.current.assigned, True)
                },
                "target_assignment": {"topic_partitions": _assignment_body(ctx, view.target, True)},
                "member_type": (
                    CONSUMER_MEMBER_TYPE if member.classic is None else CLASSIC_MEMBER_TYPE
                ),
            }
        )
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "group_id": group_id,
        "group_state": group.state,
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "assignor_name": group.assignor,
        "members": members,
        "authorized_operations": operations,
    }
