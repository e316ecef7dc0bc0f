"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, configs.

There is no controller: any broker applies an admin change as a compare-and-swap in etcd, and
every broker's view follows through its watch. Durability comes from object storage, not from
replicas: any replication factor is accepted and reported as 1, and an explicit replica
assignment is checked as Kafka checks it (partitions 0..n-1, live brokers, no broker twice in
one partition) and then collapses to the partition's lease owner, as the factor does.
"""

from __future__ import annotations

import logging
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.config_sources import (
    broker_synonyms,
    source_of,
    synonym_bodies,
    topic_synonyms,
)
from kafscale.broker.api.configs import (
    TOPIC_CONFIG_TYPES,
    BrokerConfig,
    ConfigType,
    broker_configs,
    topic_config_type,
)
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.group_configs import GROUP_RESOURCE, alter_group, describe_group
from kafscale.broker.api.metadata import topic_uuid
from kafscale.broker.api.replica_lists import check_replica_list
from kafscale.broker.authz.model import Operation
from kafscale.broker.metadata import topics
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
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
        if not access.may_create_topic(ctx, topic.name):
            raise KafkaError("not authorized to create", ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        if topic.assignments:
            if int(topic.num_partitions) != -1 or int(topic.replication_factor) != -1:
                raise KafkaError(
                    "both numPartitions or replicationFactor and replicasAssignments were set",
                    ErrorCode.INVALID_REQUEST,
                )
            count = _check_assignment(
                [int(a.partition_index) for a in topic.assignments],
                [list(a.broker_ids) for a in topic.assignments],
                set(broker.view.brokers),
            )
            result["num_partitions"] = count
        check_config_names(configs)
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
            configs=[
                {key: entry[key] for key in CREATED_TOPIC_CONFIG_KEYS}
                for entry in _config_entries(
                    topics.effective_configs(info, broker.settings.topic_defaults()),
                    info.configs,
                    _broker_configs(ctx),
                    None,
                    include_synonyms=False,
                )
            ],
        )
    except KafkaError as exc:
        result.update(
            error_code=exc.code, error_message=str(exc), num_partitions=-1, replication_factor=-1
        )
    return result


def check_config_names(configs: Any) -> None:
    """Kafka refuses a topic config it does not know (a typo would otherwise pass silently),
    in Kafka's words: clients match the message (Quix Streams' TopicAdmin does)."""
    for name in configs:
        if name not in TOPIC_CONFIG_TYPES:
            raise KafkaError(f"Unknown topic config name: {name}", ErrorCode.INVALID_CONFIG)


def _check_assignment(partitions: list[int], replicas: list[list[int]], live: set[int]) -> int:
    """The partition count of a valid manual assignment, else Kafka's error for it."""
    if sorted(partitions) != list(range(len(partitions))):
        raise KafkaError(
            "partitions of a manual assignment must be 0..n-1, each once",
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        )
    _check_replica_lists(replicas, live)
    return len(partitions)


def _check_replica_lists(replicas: list[list[int]], live: set[int]) -> None:
    for brokers in replicas:
        check_replica_list(brokers, live)
    if len({len(brokers) for brokers in replicas}) > 1:
        raise KafkaError(
            "all partitions of an assignment must have the same number of replicas",
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        )


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
            access.require(ctx, Operation.DELETE, access.TOPIC, name)
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
            access.require(ctx, Operation.ALTER, access.TOPIC, topic.name)
            if topic.assignments:
                info = broker.view.topics.get(topic.name)
                added = int(topic.count) - (info.partitions if info is not None else 0)
                if info is not None and len(topic.assignments) != added:
                    raise KafkaError(
                        f"{len(topic.assignments)} assignments for {added} new partitions",
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    )
                _check_replica_lists(
                    [list(a.broker_ids) for a in topic.assignments], set(broker.view.brokers)
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
    include = bool(getattr(request, "include_synonyms", False))
    results = []
    for resource in request.resources:
        results.append(_describe_one(resource, include, ctx))
    return {"throttle_time": 0, "results": results}


def _describe_one(resource: Any, include_synonyms: bool, ctx: RequestContext) -> Body:
    base: Body = {"resource_type": resource.resource_type, "resource_name": resource.resource_name}
    wanted = resource.configuration_keys
    try:
        access.require_config(
            ctx, Operation.DESCRIBE_CONFIGS, resource.resource_type, resource.resource_name
        )
    except KafkaError as exc:
        return {**base, "error_code": exc.code, "error_message": str(exc), "configs": []}
    if resource.resource_type == BROKER_RESOURCE:
        return {
            **base,
            **_describe_broker(resource.resource_name, wanted, include_synonyms, ctx),
        }
    if resource.resource_type == GROUP_RESOURCE:
        return {
            **base,
            **describe_group(resource.resource_name, wanted, include_synonyms, ctx),
        }
    if resource.resource_type != TOPIC_RESOURCE:
        return {
            **base,
            "error_code": ErrorCode.INVALID_REQUEST,
            "configs": [],
            "error_message": "only topic, broker and group resources are supported",
        }
    info = ctx.broker.view.topics.get(resource.resource_name)
    if info is None:
        return {**base, "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "configs": []}
    defaults = ctx.broker.settings.topic_defaults()
    entries = _config_entries(
        topics.effective_configs(info, defaults),
        info.configs,
        _broker_configs(ctx),
        wanted,
        include_synonyms,
    )
    return {**base, "error_code": ErrorCode.NONE, "configs": entries}


def _describe_broker(name: str, wanted: Any, include_synonyms: bool, ctx: RequestContext) -> Body:
    """This broker's configs (a broker describes only itself; "" names the cluster default,
    which has no dynamic settings here: every value there is reported as a default)."""
    broker = ctx.broker
    if name not in ("", str(broker.node_id)):
        return {
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": f"this is broker {broker.node_id}, not {name}",
            "configs": [],
        }
    configs = _broker_configs(ctx).values()
    chosen = [c for c in configs if not wanted or c.name in wanted]
    entries = [_broker_entry(config, bool(name), include_synonyms) for config in chosen]
    return {"error_code": ErrorCode.NONE, "configs": entries}


def _broker_configs(ctx: RequestContext) -> dict[str, BrokerConfig]:
    broker = ctx.broker
    advertised = broker.info.listeners if broker.info is not None else ()
    bound = broker.server.ports if broker.server is not None else {}
    configs = broker_configs(broker.settings, broker.node_id, advertised, bound)
    return {config.name: config for config in configs}


def _broker_entry(config: BrokerConfig, own: bool, include_synonyms: bool) -> Body:
    synonyms = broker_synonyms(config) if own else []
    bodies = synonym_bodies(synonyms, include_synonyms)
    if config.sensitive:  # a secret (delegation.token.secret.key): null, as from Kafka
        bodies = [{**body, "value": None} for body in bodies]
    return {
        "name": config.name,
        "value": None if config.sensitive else config.value,
        "read_only": True,
        "config_source": int(source_of(synonyms)),
        "is_sensitive": config.sensitive,
        "synonyms": bodies,
        "config_type": int(config.type),
        "documentation": None,
    }


# CreateTopics answers each config with fewer fields than DescribeConfigs does.
CREATED_TOPIC_CONFIG_KEYS = ("name", "value", "read_only", "config_source", "is_sensitive")


def _config_entries(
    effective: dict[str, str],
    explicit: dict[str, str],
    broker: dict[str, BrokerConfig],
    wanted: Any,
    include_synonyms: bool,
) -> list[Body]:
    names = sorted(effective) if not wanted else [n for n in wanted if n in effective]
    return [
        _topic_entry(name, effective[name], explicit, broker, include_synonyms) for name in names
    ]


def _topic_entry(
    name: str,
    value: str,
    explicit: dict[str, str],
    broker: dict[str, BrokerConfig],
    include_synonyms: bool,
) -> Body:
    synonyms = topic_synonyms(name, explicit, broker)
    return {
        "name": name,
        "value": value,
        "read_only": name in topics.READ_ONLY_CONFIGS,
        "config_source": int(source_of(synonyms)),
        "is_sensitive": False,
        "synonyms": synonym_bodies(synonyms, include_synonyms),
        "config_type": int(topic_config_type(name)),
        "documentation": None,
    }


async def handle_incremental_alter_configs(request: Any, ctx: RequestContext) -> Body:
    responses = []
    for resource in request.resources:
        base: Body = {
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
        }
        try:
            access.require_config(
                ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
            )
            if resource.resource_type == GROUP_RESOURCE:
                changes = incremental_changes(resource.configs, {})
                await alter_group(resource.resource_name, changes, bool(request.validate_only), ctx)
                responses.append({**base, "error_code": ErrorCode.NONE})
                continue
            if resource.resource_type != TOPIC_RESOURCE:
                raise KafkaError(
                    "only topic and group configs can be altered", ErrorCode.INVALID_REQUEST
                )
            known = ctx.broker.view.topics.get(resource.resource_name)
            changes = incremental_changes(resource.configs, known.configs if known else {})
            check_config_names(changes)
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


def incremental_changes(configs: Any, current: dict[str, str]) -> dict[str, str | None]:
    """IncrementalAlterConfigs' operations as changes to a topic's explicit ``current``
    configs (None: back to the default). APPEND and SUBTRACT edit a list config's value (its
    default when unset), as in Kafka (``cleanup.policy`` APPEND compact: "delete,compact");
    on any other config they are INVALID_CONFIG."""
    changes: dict[str, str | None] = {}
    for config in configs:
        if config.config_operation == SET:
            changes[config.name] = config.value
        elif config.config_operation == DELETE:
            changes[config.name] = None
        elif topic_config_type(config.name) != ConfigType.LIST:
            raise KafkaError(
                f"APPEND/SUBTRACT apply to list configs only, not {config.name}",
                ErrorCode.INVALID_CONFIG,
            )
        else:
            before = changes.get(config.name, current.get(config.name))
            if before is None:
                before = topics.DEFAULT_CONFIGS.get(config.name, "")
            changes[config.name] = edit_list(
                before, config.value or "", append=config.config_operation == APPEND
            )
    return changes


def edit_list(value: str, items: str, append: bool) -> str:
    """A comma-separated list ``value`` with ``items`` (comma-separated) appended (those not
    in it yet) or subtracted."""
    listed = [v.strip() for v in value.split(",") if v.strip()]
    given = [v.strip() for v in items.split(",") if v.strip()]
    if append:
        return ",".join(listed + [v for v in dict.fromkeys(given) if v not in listed])
    return ",".join(v for v in listed if v not in given)


async def handle_alter_configs(request: Any, ctx: RequestContext) -> Body:
    """AlterConfigs (the non-incremental API many admin tools still use): a topic's configs
    become exactly the ones given; those left out return to their defaults."""
    responses = []
    for resource in request.resources:
        base: Body = {
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
        }
        try:
            access.require_config(
                ctx, Operation.ALTER_CONFIGS, resource.resource_type, resource.resource_name
            )
            if resource.resource_type == GROUP_RESOURCE:
                given = {c.name: c.value for c in resource.configs}
                await alter_group(
                    resource.resource_name, given, bool(request.validate_only), ctx, True
                )
                responses.append({**base, "error_code": ErrorCode.NONE})
                continue
            if resource.resource_type != TOPIC_RESOURCE:
                raise KafkaError(
                    "only topic and group configs can be altered (broker configs are static)",
                    ErrorCode.INVALID_REQUEST,
                )
            info = ctx.broker.view.topics.get(resource.resource_name)
            if info is None:
                raise KafkaError("unknown topic", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            given = {c.name: c.value for c in resource.configs}
            check_config_names(given)
            changes = replacing_changes(info.configs, given)
            if request.validate_only:
                topics.validate_configs(changes)
            else:
                altered = await topics.alter_configs(
                    ctx.broker.etcd, ctx.broker.cluster, resource.resource_name, changes
                )
                ctx.broker.view.topics[altered.name] = altered
            responses.append({**base, "error_code": ErrorCode.NONE})
        except KafkaError as exc:
            responses.append({**base, "error_code": exc.code, "error_message": str(exc)})
    return {"throttle_time": 0, "responses": responses}


def replacing_changes(
    current: dict[str, str], given: dict[str, str | None]
) -> dict[str, str | None]:
    """The changes that make a topic's explicit configs exactly ``given`` (None: removed)."""
    return {**{name: None for name in current if name not in given}, **given}
