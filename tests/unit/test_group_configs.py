"""A consumer group's own configs (KIP-848): names, validation against the broker's bounds,
and the settings the coordinator then uses (``groups.group_configs``)."""

from __future__ import annotations

import pytest

from kafscale.broker.config import GroupSettings
from kafscale.broker.groups import group_configs
from kafscale.broker.groups.consumer import ConsumerConfig
from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

pytestmark = pytest.mark.unit

SESSION = "consumer.session.timeout.ms"
INTERVAL = "consumer.heartbeat.interval.ms"
KAFKA_DEFAULTS = GroupSettings()


def refusal(configs: dict[str, str], settings: GroupSettings = KAFKA_DEFAULTS) -> str:
    with pytest.raises(KafkaError) as caught:
        group_configs.validate(configs, settings)
    assert caught.value.code is ErrorCode.INVALID_CONFIG
    return str(caught.value)


def test_values_within_the_brokers_bounds_are_accepted() -> None:
    group_configs.validate({SESSION: "60000", INTERVAL: "6000"}, KAFKA_DEFAULTS)
    group_configs.validate({SESSION: "45000"}, KAFKA_DEFAULTS)
    group_configs.validate({}, KAFKA_DEFAULTS)


def test_values_outside_the_brokers_bounds_are_refused_naming_the_bound() -> None:
    assert "group.consumer.min.session.timeout.ms" in refusal({SESSION: "44999"})
    assert "group.consumer.max.session.timeout.ms" in refusal({SESSION: "60001"})
    assert "group.consumer.min.heartbeat.interval.ms" in refusal({INTERVAL: "4999"})
    assert "group.consumer.max.heartbeat.interval.ms" in refusal({INTERVAL: "15001"})


def test_the_bounds_come_from_the_brokers_settings() -> None:
    relaxed = GroupSettings(
        consumer_min_session_timeout_ms=1000, consumer_min_heartbeat_interval_ms=100
    )
    group_configs.validate({SESSION: "2000", INTERVAL: "200"}, relaxed)
    assert "min.session" in refusal({SESSION: "999"}, relaxed)


def test_the_session_must_outlast_the_heartbeat_interval_with_defaults_filled_in() -> None:
    relaxed = GroupSettings(consumer_min_session_timeout_ms=1000)
    assert "must be greater than" in refusal({SESSION: "6000", INTERVAL: "6000"})
    # 4000 ms is within the relaxed bounds but not above the broker's 5000 ms interval.
    assert "must be greater than consumer.heartbeat.interval.ms" in refusal(
        {SESSION: "4000"}, relaxed
    )


@pytest.mark.parametrize("value", ["", "abc", "0", "-5", "1.5", "99999999999"])
def test_values_that_are_not_positive_ints_are_refused(value: str) -> None:
    assert "Invalid value" in refusal({SESSION: value})


def test_unknown_names_and_streams_configs_are_refused() -> None:
    assert "Unknown group config name: session.timeout.ms" in refusal({"session.timeout.ms": "1"})
    assert "streams groups" in refusal({"streams.num.standby.replicas": "1"})


def test_share_configs_are_checked_and_applied() -> None:
    """Share groups (KIP-932) take their share.* group configs, within Kafka's bounds."""
    assert "share.session.timeout.ms must be greater" in refusal({"share.session.timeout.ms": "1"})
    assert "must be one of latest, earliest" in refusal({"share.auto.offset.reset": "none"})
    too_many = refusal({"share.delivery.count.limit": "11"})
    assert "share.delivery.count.limit must be less" in too_many
    configs = {
        "share.auto.offset.reset": "earliest",
        "share.record.lock.duration.ms": "2000",
        "share.delivery.count.limit": "3",
        "share.isolation.level": "read_uncommitted",
    }
    group_configs.validate(configs, KAFKA_DEFAULTS)
    chosen = group_configs.share_config(ShareConfig(), configs)
    assert chosen == ShareConfig(
        auto_offset_reset="earliest",
        record_lock_duration_ms=2000,
        delivery_count_limit=3,
        read_committed=False,
    )
    assert group_configs.share_config(ShareConfig(), {"share.delivery.count.limit": "x"}) == (
        ShareConfig()
    )


def test_changes_set_and_remove() -> None:
    current = {SESSION: "50000", INTERVAL: "6000"}
    assert group_configs.apply_changes(current, {SESSION: None, INTERVAL: "7000"}) == {
        INTERVAL: "7000"
    }
    assert current == {SESSION: "50000", INTERVAL: "6000"}  # not changed in place


def test_a_groups_own_configs_override_the_brokers() -> None:
    broker = ConsumerConfig(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
    own = group_configs.consumer_config(broker, {SESSION: "2000", INTERVAL: "300"})
    assert (own.session_timeout_ms, own.heartbeat_interval_ms) == (2000, 300)
    only_interval = group_configs.consumer_config(broker, {INTERVAL: "700"})
    assert (only_interval.session_timeout_ms, only_interval.heartbeat_interval_ms) == (45000, 700)
    assert group_configs.consumer_config(broker, {}) == broker
    assert group_configs.consumer_config(broker, {SESSION: "junk"}) == broker
