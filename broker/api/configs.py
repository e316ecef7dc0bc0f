"""What DescribeConfigs says of a broker and of a topic's configs: values and types.

Clients and tools (kafka-configs, librdkafka's admin API, UIs) read the broker resource for
settings such as ``advertised.listeners`` and use ``config_type`` (DescribeConfigs v3+) to parse
values. Pure tables and functions: the handler in ``admin`` supplies the settings and address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

from pydantic import BaseModel

from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.topics import DEFAULT_CONFIGS as DEFAULT_TOPIC_CONFIGS
from kafscale.broker.security.listeners import ALL_INTERFACES, Listener, internal_listener

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
    """One broker config: ``given`` when set for this broker at start-up (Kafka's
    STATIC_BROKER_CONFIG), ``default`` the value it has when not set (DEFAULT_CONFIG; None:
    none, a value derived from the broker's id or address)."""

    name: str
    value: str
    type: ConfigType
    given: bool = True
    default: str | None = None
    sensitive: bool = False  # a secret: answered as null with is_sensitive, as Kafka does


def topic_config_type(name: str) -> ConfigType:
    return TOPIC_CONFIG_TYPES.get(name, ConfigType.UNKNOWN)


def broker_configs(
    settings: BrokerSettings,
    node_id: int,
    advertised: Sequence[tuple[str, str, int]],
    bound_ports: Mapping[str, int],
) -> list[BrokerConfig]:
    """The broker's configs under Kafka's names, from the settings it runs with: all static
    (read-only) here, set at start-up through the environment or flags. ``advertised`` is
    each listener's advertised (name, host, port), as registered; ``bound_ports`` the ports
    its listeners bound (a port 0 in the settings is the one the kernel chose)."""
    topics, log, limits, groups = settings.topics, settings.log, settings.limits, settings.groups
    return [
        *listener_configs(settings, advertised, bound_ports),
        _derived("broker.id", node_id, ConfigType.INT),
        _derived("node.id", node_id, ConfigType.INT),
        _setting("broker.rack", settings.listener, "rack", ConfigType.STRING),
        _setting("auto.create.topics.enable", topics, "auto_create_topics", ConfigType.BOOLEAN),
        _setting("num.partitions", topics, "num_partitions", ConfigType.INT),
        _fixed("default.replication.factor", 1, ConfigType.SHORT),
        _fixed("offsets.topic.replication.factor", 1, ConfigType.SHORT),
        _fixed("min.insync.replicas", 1, ConfigType.INT),
        _fixed("delete.topic.enable", True, ConfigType.BOOLEAN),
        _setting("log.retention.ms", topics, "retention_ms", ConfigType.LONG),
        _setting("log.retention.bytes", topics, "retention_bytes", ConfigType.LONG),
        _setting("log.segment.bytes", log, "segment_bytes", ConfigType.INT),
        _setting("log.flush.interval.ms", log, "flush_interval_ms", ConfigType.LONG),
        _setting("log.index.interval.bytes", log, "index_interval_bytes", ConfigType.INT),
        _setting(
            "log.retention.check.interval.ms",
            log,
            "retention_check_interval_s",
            ConfigType.LONG,
            scale=1000,
        ),
        _fixed("log.cleanup.policy", "delete", ConfigType.LIST),
        _fixed("log.message.timestamp.type", "CreateTime", ConfigType.STRING),
        _fixed(
            "log.message.timestamp.after.max.ms",
            DEFAULT_TOPIC_CONFIGS["message.timestamp.after.max.ms"],
            ConfigType.LONG,
        ),
        _fixed(
            "log.message.timestamp.before.max.ms",
            DEFAULT_TOPIC_CONFIGS["message.timestamp.before.max.ms"],
            ConfigType.LONG,
        ),
        _setting("message.max.bytes", topics, "max_message_bytes", ConfigType.INT),
        _fixed("compression.type", "producer", ConfigType.STRING),
        _setting("socket.request.max.bytes", limits, "max_frame_bytes", ConfigType.INT),
        _setting("max.connections", limits, "max_connections", ConfigType.INT),
        _setting(
            "max.incremental.fetch.session.cache.slots", limits, "fetch_sessions", ConfigType.INT
        ),
        _fixed("fetch.max.bytes", FETCH_MAX_BYTES, ConfigType.INT),
        _setting(
            "group.initial.rebalance.delay.ms",
            groups,
            "initial_rebalance_delay_ms",
            ConfigType.INT,
        ),
        _setting("group.min.session.timeout.ms", groups, "min_session_timeout_ms", ConfigType.INT),
        _setting("group.max.session.timeout.ms", groups, "max_session_timeout_ms", ConfigType.INT),
        _setting("group.max.size", groups, "max_size", ConfigType.INT),
        _setting("group.consumer.max.size", groups, "consumer_max_size", ConfigType.INT),
        _setting(
            "group.consumer.session.timeout.ms",
            groups,
            "consumer_session_timeout_ms",
            ConfigType.INT,
        ),
        _setting(
            "group.consumer.heartbeat.interval.ms",
            groups,
            "consumer_heartbeat_interval_ms",
            ConfigType.INT,
        ),
        _setting(
            "group.consumer.min.session.timeout.ms",
            groups,
            "consumer_min_session_timeout_ms",
            ConfigType.INT,
        ),
        _setting(
            "group.consumer.max.session.timeout.ms",
            groups,
            "consumer_max_session_timeout_ms",
            ConfigType.INT,
        ),
        _setting(
            "group.consumer.min.heartbeat.interval.ms",
            groups,
            "consumer_min_heartbeat_interval_ms",
            ConfigType.INT,
        ),
        _setting(
            "group.consumer.max.heartbeat.interval.ms",
            groups,
            "consumer_max_heartbeat_interval_ms",
            ConfigType.INT,
        ),
        _setting("offsets.retention.minutes", groups, "offsets_retention_minutes", ConfigType.INT),
        _setting(
            "offsets.retention.check.interval.ms",
            groups,
            "offsets_retention_check_interval_ms",
            ConfigType.LONG,
        ),
        _fixed("unclean.leader.election.enable", False, ConfigType.BOOLEAN),
        *delegation_token_configs(settings),
    ]


def delegation_token_configs(settings: BrokerSettings) -> list[BrokerConfig]:
    """Kafka's ``delegation.token.*``; the secret key is sensitive: its value never leaves."""
    tokens = settings.delegation_token
    return [
        BrokerConfig(
            "delegation.token.secret.key",
            "",
            ConfigType.PASSWORD,
            given=tokens.secret_key is not None,
            sensitive=True,
        ),
        _setting("delegation.token.max.lifetime.ms", tokens, "max_lifetime_ms", ConfigType.LONG),
        _setting("delegation.token.expiry.time.ms", tokens, "expiry_time_ms", ConfigType.LONG),
        _setting(
            "delegation.token.expiry.check.interval.ms",
            tokens,
            "expiry_check_interval_ms",
            ConfigType.LONG,
        ),
    ]


def listener_configs(
    settings: BrokerSettings,
    advertised: Sequence[tuple[str, str, int]],
    bound_ports: Mapping[str, int],
) -> list[BrokerConfig]:
    plan = settings.listener_plan()
    internal = internal_listener(plan, settings.internal_listener_name).name
    values = listener_values(plan, internal, advertised, bound_ports)
    return [_derived(name, value, LISTENER_CONFIG_TYPES[name]) for name, value in values.items()]


LISTENER_CONFIG_TYPES = {
    "advertised.listeners": ConfigType.LIST,
    "listeners": ConfigType.LIST,
    "listener.security.protocol.map": ConfigType.LIST,
    "inter.broker.listener.name": ConfigType.STRING,
}


def listener_values(
    plan: Sequence[Listener],
    internal: str,
    advertised: Sequence[tuple[str, str, int]],
    bound_ports: Mapping[str, int],
) -> dict[str, str]:
    """Kafka's four listener configs, from every listener a broker (or the proxy) opens: names,
    binds, protocols, and the internal one (what Kafka calls the inter-broker listener)."""
    return {
        "advertised.listeners": ",".join(f"{n}://{h}:{p}" for n, h, p in advertised),
        "listeners": ",".join(_bind_address(listener, bound_ports) for listener in plan),
        "listener.security.protocol.map": ",".join(
            f"{listener.name}:{listener.protocol.value}" for listener in plan
        ),
        "inter.broker.listener.name": internal,
    }


def _bind_address(listener: Listener, bound_ports: Mapping[str, int]) -> str:
    """As Kafka's ``listeners`` writes it: an all-interfaces bind has an empty host."""
    host = "" if listener.host in ALL_INTERFACES else listener.host
    return f"{listener.name}://{host}:{bound_ports.get(listener.name, listener.port)}"


def _derived(name: str, value: object, kind: ConfigType) -> BrokerConfig:
    """A config that follows from this broker's own id or address: set for it, no default."""
    return BrokerConfig(name, _text(value), kind)


def _fixed(name: str, value: object, kind: ConfigType) -> BrokerConfig:
    """A config KafScale does not let one change: always its default."""
    return BrokerConfig(name, _text(value), kind, given=False, default=_text(value))


def _setting(
    name: str, section: BaseModel, field: str, kind: ConfigType, scale: int = 1
) -> BrokerConfig:
    """A config from one settings field: given when the environment or a flag set it (pydantic
    records which fields were given), its default the field's."""
    value = getattr(section, field)
    default = type(section).model_fields[field].get_default(call_default_factory=True)
    return BrokerConfig(
        name,
        _text(_scaled(value, scale)),
        kind,
        given=field in section.model_fields_set,
        default=None if default is None else _text(_scaled(default, scale)),
    )


def _scaled(value: object, scale: int) -> object:
    if scale == 1 or not isinstance(value, int | float):
        return value
    return int(value * scale)


def _text(value: object) -> str:
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)
