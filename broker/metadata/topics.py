"""Topic records in etcd: create, delete, add partitions, change configs.

Every change is a compare-and-swap on the topic key, so two brokers handling admin requests at
once cannot lose each other's updates. Deleting a topic removes its partition states and leases
in the same transaction, and leaves its record as a tombstone (``deleted-topics/<name>/<id>``)
until its objects are deleted (see ``storage.topic_purge``). A re-created topic gets a new topic
id, and with it a new object prefix, so old records can never reappear.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    create_revision_is,
    delete_op,
    delete_prefix_op,
    mod_revision_is,
    put_op,
)
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, MetadataTimeout

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAX_PARTITIONS = 10_000
NO_LIMIT_MS = 2**63 - 1  # Kafka's Long.MAX_VALUE for "no limit"
MIN_SEGMENT_BYTES = 1024  # as the broker's log.segment_bytes: a segment per batch below that

# Topic configs we understand, with Kafka's defaults; others are stored and echoed back.
DEFAULT_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.bytes": "4194304",
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
    "message.timestamp.after.max.ms": "3600000",  # Kafka 4.0's default: an hour ahead at most
    "message.timestamp.before.max.ms": str(NO_LIMIT_MS),
    "compression.type": "producer",
    "min.insync.replicas": "1",
}
READ_ONLY_CONFIGS = frozenset({"compression.type", "min.insync.replicas"})
# Integer configs, with the least value each may take (None: any).
INTEGER_CONFIGS: dict[str, int | None] = {
    "retention.ms": None,
    "retention.bytes": None,
    "segment.bytes": MIN_SEGMENT_BYTES,
    "max.message.bytes": 0,
    "message.timestamp.after.max.ms": 0,
    "message.timestamp.before.max.ms": 0,
}


def is_valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")


def validate_topic_name(name: str) -> None:
    if not is_valid_topic_name(name):
        raise KafkaError(f"invalid topic name {name!r}", ErrorCode.INVALID_TOPIC_EXCEPTION)


def missing_topic_error(name: str) -> ErrorCode:
    """Metadata's code for a topic that does not exist: INVALID_TOPIC_EXCEPTION when the name
    could never exist (as Kafka answers, so clients fail at once: a retriable
    UNKNOWN_TOPIC_OR_PARTITION made KafkaJS and librdkafka retry until their timeouts)."""
    if is_valid_topic_name(name):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.INVALID_TOPIC_EXCEPTION


def validate_configs(configs: Mapping[str, str | None]) -> None:
    for name, least in INTEGER_CONFIGS.items():
        value = configs.get(name)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError as exc:
            raise KafkaError(f"{name} must be an integer", ErrorCode.INVALID_CONFIG) from exc
        if least is not None and number < least:
            raise KafkaError(f"{name} must be at least {least}", ErrorCode.INVALID_CONFIG)
    timestamp_type = configs.get("message.timestamp.type")
    if timestamp_type is not None and timestamp_type not in ("CreateTime", "LogAppendTime"):
        raise KafkaError(
            f"invalid message.timestamp.type {timestamp_type}", ErrorCode.INVALID_CONFIG
        )
    policy = configs.get("cleanup.policy")
    if policy is not None and policy.strip():  # empty: neither (Kafka 3.x allows it)
        policies = [p.strip() for p in policy.split(",")]
        if not set(policies) <= {"delete", "compact"} or "" in policies:
            raise KafkaError(f"invalid cleanup.policy {policy}", ErrorCode.INVALID_CONFIG)


async def create_topic(
    etcd: Etcd, cluster: str, name: str, partitions: int, configs: Mapping[str, str]
) -> TopicInfo:
    validate_topic_name(name)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise KafkaError(f"partitions must be 1..{MAX_PARTITIONS}", ErrorCode.INVALID_PARTITIONS)
    validate_configs(configs)
    info = TopicInfo(name, uuid.uuid4().hex, partitions, dict(configs))
    key = keys.topic_key(cluster, name)
    try:
        created = await etcd.create_if_absent(key, info.to_json())
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    if not created:
        raise KafkaError(f"topic {name} already exists", ErrorCode.TOPIC_ALREADY_EXISTS)
    return info


async def topic_exists(etcd: Etcd, cluster: str, name: str, topic_id: str) -> bool:
    """Whether the topic ``name`` still is the one with ``topic_id`` (not deleted, or deleted
    and created anew). Raises MetadataUnavailable when etcd does not answer."""
    current = await etcd.get(keys.topic_key(cluster, name))
    return current is not None and TopicInfo.from_json(name, current.value).topic_id == topic_id


async def delete_topic(etcd: Etcd, cluster: str, name: str) -> TopicInfo:
    key = keys.topic_key(cluster, name)
    try:
        current = await etcd.get(key)
        if current is None:
            raise KafkaError(f"unknown topic {name}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        info = TopicInfo.from_json(name, current.value)
        tombstone = put_op(keys.deleted_topic_key(cluster, name, info.topic_id), current.value)
        deletes = [
            delete_op(key),
            delete_prefix_op(keys.partition_states_prefix(cluster, name)),
            delete_prefix_op(keys.partition_leases_prefix(cluster, name)),
        ]
        result = await etcd.txn([mod_revision_is(key, current.mod_revision)], [*deletes, tombstone])
        if not result.succeeded:
            raise KafkaError(f"topic {name} changed meanwhile", ErrorCode.REQUEST_TIMED_OUT)
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    return info


async def add_partitions(etcd: Etcd, cluster: str, name: str, count: int) -> TopicInfo:
    def grow(info: TopicInfo) -> TopicInfo:
        if count <= info.partitions:
            raise KafkaError(
                f"topic {name} has {info.partitions} partitions; cannot set {count}",
                ErrorCode.INVALID_PARTITIONS,
            )
        if count > MAX_PARTITIONS:
            raise KafkaError(f"at most {MAX_PARTITIONS} partitions", ErrorCode.INVALID_PARTITIONS)
        return TopicInfo(info.name, info.topic_id, count, info.configs)

    return await _update(etcd, cluster, name, grow)


async def alter_configs(
    etcd: Etcd, cluster: str, name: str, changes: Mapping[str, str | None]
) -> TopicInfo:
    """Set (value) or remove (None) topic configs."""
    validate_configs(changes)

    def apply(info: TopicInfo) -> TopicInfo:
        configs = dict(info.configs)
        for config_name, value in changes.items():
            if value is None:
                configs.pop(config_name, None)
            else:
                configs[config_name] = value
        return TopicInfo(info.name, info.topic_id, info.partitions, configs)

    return await _update(etcd, cluster, name, apply)


async def _update(etcd: Etcd, cluster: str, name: str, change: object) -> TopicInfo:
    key = keys.topic_key(cluster, name)
    assert callable(change)
    try:
        for _ in range(5):
            current = await etcd.get(key)
            if current is None:
                raise KafkaError(f"unknown topic {name}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            updated: TopicInfo = change(TopicInfo.from_json(name, current.value))
            result = await etcd.txn(
                [
                    mod_revision_is(key, current.mod_revision),
                    create_revision_is(key, current.create_revision),
                ],
                [put_op(key, updated.to_json())],
            )
            if result.succeeded:
                return updated
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    raise KafkaError(f"topic {name} kept changing", ErrorCode.REQUEST_TIMED_OUT)


def segment_bytes(info: TopicInfo | None, default: int) -> int:
    """The topic's ``segment.bytes`` (the size at which its partitions flush and cut segments),
    else the broker's ``log.segment_bytes``."""
    value = info.configs.get("segment.bytes") if info is not None else None
    return int(value) if value is not None else default


def effective_configs(
    info: TopicInfo, broker_defaults: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Kafka's defaults, overridden by the broker's, overridden by the topic's own configs."""
    return {**DEFAULT_CONFIGS, **(broker_defaults or {}), **info.configs}
