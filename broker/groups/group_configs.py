"""A consumer group's own configs (KIP-848's group configs, Kafka's ``GroupConfig``).

An operator may give one group its own session timeout and heartbeat interval
(``kafka-configs --entity-type groups --entity-name G --alter --add-config
consumer.session.timeout.ms=60000``); the group's coordinator then uses them in place of the
broker's ``group.consumer.*`` defaults. Kafka checks each value against the broker's
``group.consumer.min/max.*`` bounds and refuses a session timeout not above the heartbeat
interval, all with INVALID_CONFIG; so does this module.

Share groups (KIP-932) have their own ``share.*`` configs (``SHARE_BOUNDS``: Kafka's names and
the ranges its broker defaults allow). Kafka also knows ``streams.*`` group configs; KafScale
serves no streams groups, and a config that nothing enforces is not stored: those names are
refused with INVALID_CONFIG and a message saying why. Pure functions: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kafscale.broker.config import GroupSettings
from kafscale.broker.groups.consumer import ConsumerConfig
from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
GROUP_CONFIG_NAMES = (HEARTBEAT_INTERVAL, SESSION_TIMEOUT)

BROKER_SYNONYMS = {
    SESSION_TIMEOUT: "group.consumer.session.timeout.ms",
    HEARTBEAT_INTERVAL: "group.consumer.heartbeat.interval.ms",
}
"""The broker config each group config defaults from."""

SHARE_SESSION_TIMEOUT = "share.session.timeout.ms"
SHARE_HEARTBEAT_INTERVAL = "share.heartbeat.interval.ms"
SHARE_LOCK_DURATION = "share.record.lock.duration.ms"
SHARE_DELIVERY_LIMIT = "share.delivery.count.limit"
SHARE_AUTO_OFFSET_RESET = "share.auto.offset.reset"
SHARE_ISOLATION_LEVEL = "share.isolation.level"
SHARE_MAX_RECORD_LOCKS = "share.partition.max.record.locks"
SHARE_BOUNDS = {
    SHARE_SESSION_TIMEOUT: (45_000, 60_000),
    SHARE_HEARTBEAT_INTERVAL: (5_000, 15_000),
    SHARE_LOCK_DURATION: (1_000, 3_600_000),
    SHARE_DELIVERY_LIMIT: (2, 10),
    SHARE_MAX_RECORD_LOCKS: (100, 10_000),
}
"""Integer share-group configs and the range a group may set (Kafka's broker defaults for
``group.share.min/max.*``, except the record lock: Kafka allows 15 s to 1 h, KafScale from 1 s)."""
SHARE_CHOICES = {
    SHARE_AUTO_OFFSET_RESET: ("latest", "earliest"),
    SHARE_ISOLATION_LEVEL: ("read_committed", "read_uncommitted"),
}
SHARE_CONFIG_NAMES = (*SHARE_BOUNDS, *SHARE_CHOICES)
SHARE_BROKER_SYNONYMS = {
    SHARE_SESSION_TIMEOUT: "group.share.session.timeout.ms",
    SHARE_HEARTBEAT_INTERVAL: "group.share.heartbeat.interval.ms",
    SHARE_LOCK_DURATION: "group.share.record.lock.duration.ms",
    SHARE_DELIVERY_LIMIT: "group.share.delivery.count.limit",
    SHARE_MAX_RECORD_LOCKS: "group.share.partition.max.record.locks",
}
"""The broker config a share group config defaults from (the other two have none)."""

UNSERVED_PREFIXES = ("streams.",)
"""Kafka's streams-group (KIP-1071) config family."""

GroupConfigs = Mapping[str, str]


def defaults(settings: GroupSettings) -> dict[str, str]:
    """Each group config's value for a group without its own (the broker's setting)."""
    return {
        SESSION_TIMEOUT: str(settings.consumer_session_timeout_ms),
        HEARTBEAT_INTERVAL: str(settings.consumer_heartbeat_interval_ms),
    }


def check_names(names: list[str]) -> None:
    """INVALID_CONFIG for a name Kafka does not know, or one KafScale cannot enforce."""
    for name in names:
        if name in GROUP_CONFIG_NAMES or name in SHARE_CONFIG_NAMES:
            continue
        if name.startswith(UNSERVED_PREFIXES):
            raise KafkaError(
                f"group config {name} is for streams groups, which KafScale does not "
                "serve: it would not be enforced, so it is not stored",
                ErrorCode.INVALID_CONFIG,
            )
        raise KafkaError(f"Unknown group config name: {name}", ErrorCode.INVALID_CONFIG)


def apply_changes(current: GroupConfigs, changes: Mapping[str, str | None]) -> dict[str, str]:
    """``current`` with ``changes`` applied (None: back to the broker's default)."""
    updated = dict(current)
    for name, value in changes.items():
        if value is None:
            updated.pop(name, None)
        else:
            updated[name] = value
    return updated


def validate(configs: GroupConfigs, settings: GroupSettings) -> None:
    """Kafka's ``GroupConfig.validate``: names known, values integers within the broker's
    bounds, and the session timeout longer than the heartbeat interval (both effective:
    an unset one is the broker's default)."""
    check_names(list(configs))
    effective = {**defaults(settings), **configs}
    session = _positive_int(SESSION_TIMEOUT, effective[SESSION_TIMEOUT])
    interval = _positive_int(HEARTBEAT_INTERVAL, effective[HEARTBEAT_INTERVAL])
    _within(
        HEARTBEAT_INTERVAL,
        interval,
        ("group.consumer.min.heartbeat.interval.ms", settings.consumer_min_heartbeat_interval_ms),
        ("group.consumer.max.heartbeat.interval.ms", settings.consumer_max_heartbeat_interval_ms),
    )
    _within(
        SESSION_TIMEOUT,
        session,
        ("group.consumer.min.session.timeout.ms", settings.consumer_min_session_timeout_ms),
        ("group.consumer.max.session.timeout.ms", settings.consumer_max_session_timeout_ms),
    )
    if session <= interval:
        raise KafkaError(
            f"{SESSION_TIMEOUT} must be greater than {HEARTBEAT_INTERVAL}",
            ErrorCode.INVALID_CONFIG,
        )
    _validate_share(configs)


def _validate_share(configs: GroupConfigs) -> None:
    for name, (low, high) in SHARE_BOUNDS.items():
        if name in configs:
            value = _positive_int(name, configs[name])
            _within(name, value, (f"{low}", low), (f"{high}", high))
    for name, choices in SHARE_CHOICES.items():
        if name in configs and configs[name].strip().lower() not in choices:
            raise KafkaError(
                f"Invalid value {configs[name]} for configuration {name}: "
                f"must be one of {', '.join(choices)}",
                ErrorCode.INVALID_CONFIG,
            )


def _positive_int(name: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number < 1 or number > 2**31 - 1:
        raise KafkaError(
            f"Invalid value {value} for configuration {name}: must be an integer of at least 1",
            ErrorCode.INVALID_CONFIG,
        )
    return number


def _within(name: str, value: int, low: tuple[str, int], high: tuple[str, int]) -> None:
    if value < low[1]:
        raise KafkaError(
            f"{name} must be greater than or equal to {low[0]} ({low[1]})",
            ErrorCode.INVALID_CONFIG,
        )
    if value > high[1]:
        raise KafkaError(
            f"{name} must be less than or equal to {high[0]} ({high[1]})",
            ErrorCode.INVALID_CONFIG,
        )


def consumer_config(base: ConsumerConfig, configs: GroupConfigs) -> ConsumerConfig:
    """The group's consumer-protocol settings: ``base`` (the broker's) with the group's own
    configs over it. A stored value that no longer parses (hand-edited etcd) is ignored."""
    chosen = base
    session = _stored_int(configs.get(SESSION_TIMEOUT))
    if session is not None:
        chosen = replace(chosen, session_timeout_ms=session)
    interval = _stored_int(configs.get(HEARTBEAT_INTERVAL))
    if interval is not None:
        chosen = replace(chosen, heartbeat_interval_ms=interval)
    return chosen


def _stored_int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number >= 1 else None


def share_config(base: ShareConfig, configs: GroupConfigs) -> ShareConfig:
    """A share group's settings: ``base`` (the broker's) with the group's own configs over
    it; a stored value that no longer parses is ignored."""
    numbers = {name: _stored_int(configs.get(name)) for name in SHARE_BOUNDS}
    chosen = replace(
        base,
        session_timeout_ms=numbers[SHARE_SESSION_TIMEOUT] or base.session_timeout_ms,
        heartbeat_interval_ms=numbers[SHARE_HEARTBEAT_INTERVAL] or base.heartbeat_interval_ms,
        record_lock_duration_ms=numbers[SHARE_LOCK_DURATION] or base.record_lock_duration_ms,
        delivery_count_limit=numbers[SHARE_DELIVERY_LIMIT] or base.delivery_count_limit,
        max_record_locks=numbers[SHARE_MAX_RECORD_LOCKS] or base.max_record_locks,
    )
    reset = (configs.get(SHARE_AUTO_OFFSET_RESET) or "").strip().lower()
    if reset in SHARE_CHOICES[SHARE_AUTO_OFFSET_RESET]:
        chosen = replace(chosen, auto_offset_reset=reset)
    isolation = (configs.get(SHARE_ISOLATION_LEVEL) or "").strip().lower()
    if isolation in SHARE_CHOICES[SHARE_ISOLATION_LEVEL]:
        chosen = replace(chosen, read_committed=isolation == "read_committed")
    return chosen


def share_defaults(base: ShareConfig) -> dict[str, str]:
    """Each share group config's value for a group without its own."""
    return {
        SHARE_SESSION_TIMEOUT: str(base.session_timeout_ms),
        SHARE_HEARTBEAT_INTERVAL: str(base.heartbeat_interval_ms),
        SHARE_LOCK_DURATION: str(base.record_lock_duration_ms),
        SHARE_DELIVERY_LIMIT: str(base.delivery_count_limit),
        SHARE_MAX_RECORD_LOCKS: str(base.max_record_locks),
        SHARE_AUTO_OFFSET_RESET: base.auto_offset_reset,
        SHARE_ISOLATION_LEVEL: "read_committed" if base.read_committed else "read_uncommitted",
    }
