"""What DescribeConfigs says of a broker and of a topic's configs: values and types.

Clients and tools (kafka-configs, librdkafka's admin API, UIs) read the broker resource for
settings such as ``advertised.listeners`` and use ``config_type`` (DescribeConfigs v3+) to parse
values. Pure tables and functions: the handler in ``admin`` supplies the settings and address.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kafscale.broker.config import BrokerSettings

FETCH_MAX_BYTES = 55 * 1024 * 1024
"""The most a fetch response carries, whatever the request asks (Kafka's broker default of
``fetch.max.bytes``): what one fetch holds in memory."""


class ConfigType(IntEnum):
    """Kafka's ``ConfigEntry.ConfigType`` codes on the wire."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


TOPIC_CONFIG_TYPES: dict[str, ConfigType] = {
    "cleanup.policy": ConfigType.LIST,
    "compression.type": ConfigType.STRING,
    "compression.gzip.level": ConfigType.INT,
    "compression.lz4.level": ConfigType.INT,
    "compression.zstd.level": ConfigType.INT,
    "delete.retention.ms": ConfigType.LONG,
    "file.delete.delay.ms": ConfigType.LONG,
    "flush.messages": ConfigType.LONG,
    "flush.ms": ConfigType.LONG,
    "follower.replication.throttled.replicas": ConfigType.LIST,
    "index.interval.bytes": ConfigType.INT,
    "leader.replication.throttled.replicas": ConfigType.LIST,
    "local.retention.bytes": ConfigType.LONG,
    "local.retention.ms": ConfigType.LONG,
    "max.compaction.lag.ms": ConfigType.LONG,
    "max.message.bytes": ConfigType.INT,
    "message.downconversion.enable": ConfigType.BOOLEAN,
    "message.format.version": ConfigType.STRING,
    "message.timestamp.after.max.ms": ConfigType.LONG,
    "message.timestamp.before.max.ms": ConfigType.LONG,
    "message.timestamp.difference.max.ms": ConfigType.LONG,
    "message.timestamp.type": ConfigType.STRING,
    "min.cleanable.dirty.ratio": ConfigType.DOUBLE,
    "min.compaction.lag.ms": ConfigType.LONG,
    "min.insync.replicas": ConfigType.INT,
    "preallocate": ConfigType.BOOLEAN,
    "remote.log.copy.disable": ConfigType.BOOLEAN,
    "remote.log.delete.on.disable": ConfigType.BOOLEAN,
    "remote.storage.enable": ConfigType.BOOLEAN,
    "retention.bytes": ConfigType.LONG,
    "retention.ms": ConfigType.LONG,
    "segment.bytes": ConfigType.INT,
    "segment.index.bytes": ConfigType.INT,
    "segment.jitter.ms": ConfigType.LONG,
    "segment.ms": ConfigType.LONG,
    "unclean.leader.election.enable": ConfigType.BOOLEAN,
}
"""Every topic config Kafka knows, with its type: CreateTopics and AlterConfigs accept these
names (stored and echoed back where KafScale does not act on them) and refuse others with
INVALID_CONFIG, as Kafka does."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    name: str
    value: str
    type: ConfigType


def topic_config_type(name: str) -> ConfigType:
    return TOPIC_CONFIG_TYPES.get(name, ConfigType.UNKNOWN)


def broker_configs(
    settings: BrokerSettings, node_id: int, host: str, port: int
) -> list[BrokerConfig]:
    """The broker's configs under Kafka's names, from the settings it runs with: all static
    (read-only) here, set at start-up through the environment or flags."""
    topics, log, limits = settings.topics, settings.log, settings.limits
    bind_host = "" if settings.listener.host in ("0.0.0.0", "::") else settings.listener.host
    listener = f"PLAINTEXT://{host}:{port}"
    values: list[tuple[str, object, ConfigType]] = [
        ("advertised.listeners", listener, ConfigType.LIST),
        ("listeners", f"PLAINTEXT://{bind_host}:{port}", ConfigType.LIST),
        ("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT", ConfigType.LIST),
        ("inter.broker.listener.name", "PLAINTEXT", ConfigType.STRING),
        ("broker.id", node_id, ConfigType.INT),
        ("node.id", node_id, ConfigType.INT),
        ("broker.rack", settings.listener.rack or "", ConfigType.STRING),
        ("auto.create.topics.enable", topics.auto_create_topics, ConfigType.BOOLEAN),
        ("num.partitions", topics.num_partitions, ConfigType.INT),
        ("default.replication.factor", 1, ConfigType.SHORT),
        ("offsets.topic.replication.factor", 1, ConfigType.SHORT),
        ("min.insync.replicas", 1, ConfigType.INT),
        ("delete.topic.enable", True, ConfigType.BOOLEAN),
        ("log.retention.ms", topics.retention_ms, ConfigType.LONG),
        ("log.retention.bytes", topics.retention_bytes, ConfigType.LONG),
        ("log.segment.bytes", log.segment_bytes, ConfigType.INT),
        ("log.flush.interval.ms", log.flush_interval_ms, ConfigType.LONG),
        ("log.index.interval.bytes", log.index_interval_bytes, ConfigType.INT),
        (
            "log.retention.check.interval.ms",
            int(log.retention_check_interval_s * 1000),
            ConfigType.LONG,
        ),
        ("log.cleanup.policy", "delete", ConfigType.LIST),
        ("log.message.timestamp.type", "CreateTime", ConfigType.STRING),
        ("message.max.bytes", topics.max_message_bytes, ConfigType.INT),
        ("compression.type", "producer", ConfigType.STRING),
        ("socket.request.max.bytes", limits.max_frame_bytes, ConfigType.INT),
        ("max.connections", limits.max_connections, ConfigType.INT),
        ("max.incremental.fetch.session.cache.slots", limits.fetch_sessions, ConfigType.INT),
        ("fetch.max.bytes", FETCH_MAX_BYTES, ConfigType.INT),
        (
            "group.initial.rebalance.delay.ms",
            settings.groups.initial_rebalance_delay_ms,
            ConfigType.INT,
        ),
        ("group.min.session.timeout.ms", settings.groups.min_session_timeout_ms, ConfigType.INT),
        ("group.max.session.timeout.ms", settings.groups.max_session_timeout_ms, ConfigType.INT),
        ("unclean.leader.election.enable", False, ConfigType.BOOLEAN),
    ]
    return [BrokerConfig(name, _text(value), kind) for name, value, kind in values]


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
