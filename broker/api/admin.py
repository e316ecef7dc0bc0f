"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, configs.

There is no controller: any broker applies an admin change as a compare-and-swap in etcd, and
every broker's view follows through its watch. Replication factors are accepted as -1 or 1
only; durability comes from object storage, not from replicas.
"""

from __future__ import annotations

import logging
from typing import Any

from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.metadata import topic_uuid
from kafscale.broker.metadata import topics
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_DEFAULT = 5
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def handle_create_topics(request: Any, ctx: RequestContext) -> Body:
    results = []
    for topic in request.topics:
        results.append(await _create_one(topic, bool(request.validate_only), ctx))
    return {"throttle_time": 0, "topics": results}


async def _create_one(topic: Any, validate_only: bool, ctx: RequestContext) -> Body:
    broker = ctx.broker
    count = int(topic.num_partitions)
    if count == -1:
        count = broker.settings.topics.num_partitions
    configs = {c.name: c.value for c in topic.configs if c.value is not None}
    result: Body = {"name": topic.name, "num_partitions": count, "replication_factor": 1}
    try:
        if int(topic.replication_factor) not in (-1, 1) and not topic.assignments:
            # Durability comes from object storage; accept the common factors and report 1.
            pass
        if topic.assignments:
            raise KafkaError(
                "manual replica assignment is not supported", ErrorCode.INVALID_REPLICA_ASSIGNMENT
            )
        if validate_only:
            topics.validate_topic_name(topic.name)
            topics.validate_configs(configs)
            if topic.name in broker.view.topics:
                raise KafkaError("topic exists", ErrorCode.TOPIC_ALREADY_EXISTS)
            result.update(error_code=ErrorCode.NONE)
            return result
        info = await topics.create_topic(broker.etcd, broker.cluster, topic.name, count, configs)
        broker.view.topics[info.name] = info
        result.update(
            error_code=ErrorCode.NONE,
            topic_id=topic_uuid(info),
            configs=_config_entries(
                topics.effective_configs(info, broker.settings.topic_defaults()),
                info.configs,
                None,
            ),
        )
    except KafkaError as exc:
        result.update(
            error_code=exc.code, error_message=str(exc), num_partitions=-1, replication_factor=-1
        )
    return result


async def handle_delete_topics(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    names = list(getattr(request, "topic_names", None) or [])
    by_id = broker.view.topics_by_id
    for state in getattr(request, "topics", None) or []:
        if state.name:
            names.append(state.name)
        elif state.topic_id is not None and state.topic_id.hex in by_id:
            names.append(by_id[state.topic_id.hex].name)
    responses = []
    for name in names:
        try:
            info = await topics.delete_topic(broker.etcd, broker.cluster, name)
            broker.view.topics.pop(name, None)
            broker.log_manager.abandon_topic(name)
            broker.reader.forget(name)
            broker.spawn(broker.purger.purge_with_retries(name, info.topic_id), f"delete-{name}")
            responses.append(
                {"name": name, "topic_id": topic_uuid(info), "error_code": ErrorCode.NONE}
            )
        except KafkaError as exc:
            responses.append({"name": name, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "responses": responses}


async def handle_create_partitions(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    results = []
    for topic in request.topics:
        try:
            if topic.assignments:
                raise KafkaError(
                    "manual assignment is not supported", ErrorCode.INVALID_REPLICA_ASSIGNMENT
                )
            if not request.validate_only:
                info = await topics.add_partitions(
                    broker.etcd, broker.cluster, topic.name, int(topic.count)
                )
                broker.view.topics[info.name] = info
            results.append({"name": topic.name, "error_code": ErrorCode.NONE})
        except KafkaError as exc:
            results.append({"name": topic.name, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "results": results}


async def handle_describe_configs(request: Any, ctx: RequestContext) -> Body:
    results = []
    for resource in request.resources:
        results.append(_describe_one(resource, ctx))
    return {"throttle_time": 0, "results": results}


def _describe_one(resource: Any, ctx: RequestContext) -> Body:
    base: Body = {"resource_type": resource.resource_type, "resource_name": resource.resource_name}
    wanted = resource.configuration_keys
    if resource.resource_type == BROKER_RESOURCE:
        configs = {"log.segment.bytes": str(ctx.broker.settings.log.segment_bytes)}
        return {
            **base,
            "error_code": ErrorCode.NONE,
            "configs": _config_entries(configs, {}, wanted),
        }
    if resource.resource_type != TOPIC_RESOURCE:
        return {
            **base,
            "error_code": ErrorCode.INVALID_REQUEST,
            "configs": [],
            "error_message": "only topic and broker resources are supported",
        }
    info = ctx.broker.view.topics.get(resource.resource_name)
    if info is None:
        return {**base, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "configs": []}
    defaults = ctx.broker.settings.topic_defaults()
    entries = _config_entries(topics.effective_configs(info, defaults), info.configs, wanted)
    return {**base, "error_code": ErrorCode.NONE, "configs": entries}


def _config_entries(effective: dict[str, str], explicit: dict[str, str], wanted: Any) -> list[Body]:
    names = sorted(effective) if not wanted else [n for n in wanted if n in effective]
    return [
        {
            "name": name,
            "value": effective[name],
            "read_only": name in topics.READ_ONLY_CONFIGS,
            "config_source": CONFIG_SOURCE_TOPIC if name in explicit else CONFIG_SOURCE_DEFAULT,
            "is_sensitive": False,
        }
        for name in names
    ]


async def handle_incremental_alter_configs(request: Any, ctx: RequestContext) -> Body:
    responses = []
    for resource in request.resources:
        base: Body = {
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
        }
        try:
            if resource.resource_type != TOPIC_RESOURCE:
                raise KafkaError("only topic configs can be altered", ErrorCode.INVALID_REQUEST)
            changes = _changes(resource.configs)
            if not request.validate_only:
                info = await topics.alter_configs(
                    ctx.broker.etcd, ctx.broker.cluster, resource.resource_name, changes
                )
                ctx.broker.view.topics[info.name] = info
            elif resource.resource_name not in ctx.broker.view.topics:
                raise KafkaError("unknown topic", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                topics.validate_configs(changes)
            responses.append({**base, "error_code": ErrorCode.NONE})
        except KafkaError as exc:
            responses.append({**base, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "responses": responses}


def _changes(configs: Any) -> dict[str, str | None]:
    changes: dict[str, str | None] = {}
    for config in configs:
        if config.config_operation == SET:
            changes[config.name] = config.value
        elif config.config_operation == DELETE:
            changes[config.name] = None
        else:
            raise KafkaError(
                "APPEND/SUBTRACT apply to list configs, which topics do not have",
                ErrorCode.INVALID_CONFIG,
            )
    return changes
