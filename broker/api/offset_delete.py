"""OffsetDelete (API 47): ``kafka-consumer-groups.sh --delete-offsets``, the Java Admin's
``deleteConsumerGroupOffsets``, kafka-python's ``delete_group_offsets``.

As Kafka's ``KafkaApis`` answers it: DELETE on the group or GROUP_AUTHORIZATION_FAILED for the
whole request; then per topic READ (TOPIC_AUTHORIZATION_FAILED for its partitions) and
existence (UNKNOWN_TOPIC_OR_PARTITION for an unknown topic or partition index); the rest goes to
the group's coordinator (NOT_COORDINATOR anywhere else), whose decision is
``groups.offset_delete``, taken and carried out atomically with the group's commits
(``GroupRuntime.delete_offsets``). A group-level error is the whole answer (no topics), as
Kafka gives it. The committed offsets leave etcd in fenced transactions, like commits;
OffsetFetch then answers -1 for them and a consumer that starts follows its
``auto.offset.reset``.
"""

from __future__ import annotations

from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import offset_delete_group_error
from kafscale.broker.authz.model import Operation
from kafscale.broker.groups.store import TopicPartition
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.errors import ErrorCode, KafkaError


async def handle_offset_delete(request: Any, ctx: RequestContext) -> Body:
    group_id = str(request.group_id or "")
    access.require(ctx, Operation.DELETE, access.GROUP, group_id)
    requested = [
        (str(topic.name), [int(p.partition_index) for p in topic.partitions])
        for topic in request.topics
    ]
    errors = _checked_partitions(ctx, requested)
    if not group_id:
        return offset_delete_group_error(ErrorCode.INVALID_GROUP_ID)
    valid = [(t, p) for t, ps in requested for p in ps if (t, p) not in errors]
    try:
        errors.update(await _delete_at_coordinator(ctx, group_id, valid))
    except KafkaError as exc:
        return offset_delete_group_error(exc.code)
    return {"error_code": ErrorCode.NONE, "throttle_time": 0, "topics": _topics(requested, errors)}


def _checked_partitions(
    ctx: RequestContext, requested: list[tuple[str, list[int]]]
) -> dict[TopicPartition, ErrorCode]:
    """The partitions answered before the coordinator is asked: not readable, not known."""
    errors: dict[TopicPartition, ErrorCode] = {}
    topics = ctx.broker.view.topics
    for name, partitions in requested:
        info = topics.get(name)
        denied = access.topic_denied(ctx, Operation.READ, name)
        for p in partitions:
            if denied is not None:
                errors[(name, p)] = denied
            elif info is None or not 0 <= p < info.partitions:
                errors[(name, p)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return errors


async def _delete_at_coordinator(
    ctx: RequestContext, group_id: str, partitions: list[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """Per-partition answers of the coordinator; KafkaError for a group-level one."""
    coordinator = ctx.broker.groups
    if coordinator is None:
        raise KafkaError(
            "the group coordinator is not running", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )
    try:
        runtime = await coordinator.runtime(group_id)
    except MetadataUnavailable as exc:
        raise KafkaError(str(exc), ErrorCode.COORDINATOR_NOT_AVAILABLE) from exc
    error, answers = await runtime.delete_offsets(partitions)
    if error is not ErrorCode.NONE:
        raise KafkaError(f"group {group_id}: offsets not deleted", error)
    return answers


def _topics(
    requested: list[tuple[str, list[int]]], errors: dict[TopicPartition, ErrorCode]
) -> list[Body]:
    """Per topic of the request, in its order, each partition's answer."""
    return [
        {
            "name": name,
            "partitions": [
                {"partition_index": p, "error_code": errors.get((name, p), ErrorCode.NONE)}
                for p in partitions
            ],
        }
        for name, partitions in requested
    ]
