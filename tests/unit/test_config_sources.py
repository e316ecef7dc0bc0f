"""DescribeConfigs' ``config_source`` and ``synonyms`` (``broker/api/config_sources.py``): a
topic config's override, then its broker synonym as given at start-up, then that synonym's
default, as Kafka lists them (KIP-226)."""

from __future__ import annotations

import pytest

from kafscale.broker.api.config_sources import (
    TOPIC_CONFIG_SYNONYMS,
    ConfigSource,
    Synonym,
    broker_synonyms,
    source_of,
    synonym_bodies,
    topic_synonyms,
)
from kafscale.broker.api.configs import TOPIC_CONFIG_TYPES, BrokerConfig, broker_configs
from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.topics import DEFAULT_CONFIGS
from kafscale.broker.settings_cli import build_settings

pytestmark = pytest.mark.unit

TOPIC = ConfigSource.DYNAMIC_TOPIC_CONFIG
STATIC = ConfigSource.STATIC_BROKER_CONFIG
DEFAULT = ConfigSource.DEFAULT_CONFIG


def configs_of(settings: BrokerSettings) -> dict[str, BrokerConfig]:
    return {
        c.name: c
        for c in broker_configs(
            settings, 1, [("PLAINTEXT", "127.0.0.1", 9092)], {"PLAINTEXT": 9092}
        )
    }


def test_a_topic_override_comes_first_then_the_broker_setting_and_its_default() -> None:
    broker = configs_of(BrokerSettings(topics={"retention_ms": 3_600_000}))
    synonyms = topic_synonyms("retention.ms", {"retention.ms": "1000"}, broker)
    assert synonyms == [
        Synonym("retention.ms", "1000", TOPIC),
        Synonym("log.retention.ms", "3600000", STATIC),
        Synonym("log.retention.ms", "604800000", DEFAULT),
    ]
    assert source_of(synonyms) == TOPIC


def test_an_inherited_config_is_static_when_the_broker_was_given_it() -> None:
    broker = configs_of(BrokerSettings(log={"segment_bytes": 8 * 1024 * 1024}))
    synonyms = topic_synonyms("segment.bytes", {}, broker)
    assert synonyms[0] == Synonym("log.segment.bytes", str(8 * 1024 * 1024), STATIC)
    assert source_of(synonyms) == STATIC


def test_an_inherited_config_the_broker_was_not_given_is_a_default() -> None:
    broker = configs_of(BrokerSettings())
    for name, broker_name in [
        ("cleanup.policy", "log.cleanup.policy"),
        ("max.message.bytes", "message.max.bytes"),
        ("message.timestamp.type", "log.message.timestamp.type"),
    ]:
        synonyms = topic_synonyms(name, {}, broker)
        assert synonyms == [Synonym(broker_name, DEFAULT_CONFIGS[name], DEFAULT)]
        assert source_of(synonyms) == DEFAULT


def test_every_default_topic_config_has_a_described_broker_synonym() -> None:
    """Each topic config with a KafScale default inherits it from a broker config DescribeConfigs
    lists, so its synonyms never stop short of where its value comes from."""
    broker = configs_of(BrokerSettings())
    assert set(DEFAULT_CONFIGS) <= set(TOPIC_CONFIG_SYNONYMS)
    assert set(TOPIC_CONFIG_SYNONYMS) <= set(TOPIC_CONFIG_TYPES)
    for name, value in DEFAULT_CONFIGS.items():
        assert topic_synonyms(name, {}, broker)[0].value == value, name


def test_a_topic_config_without_a_broker_synonym_has_only_its_override() -> None:
    synonyms = topic_synonyms("segment.ms", {"segment.ms": "60000"}, configs_of(BrokerSettings()))
    assert synonyms == [Synonym("segment.ms", "60000", TOPIC)]
    assert source_of([]) == DEFAULT


def test_broker_configs_know_which_settings_were_given() -> None:
    broker = configs_of(BrokerSettings(groups={"initial_rebalance_delay_ms": 0}))
    assert broker_synonyms(broker["group.initial.rebalance.delay.ms"]) == [
        Synonym("group.initial.rebalance.delay.ms", "0", STATIC),
        Synonym("group.initial.rebalance.delay.ms", "3000", DEFAULT),
    ]
    assert broker_synonyms(broker["num.partitions"]) == [Synonym("num.partitions", "3", DEFAULT)]
    # Derived from the broker's own id: set for it, no default.
    assert broker_synonyms(broker["broker.id"]) == [Synonym("broker.id", "1", STATIC)]
    # No rack and no default: no synonym at all, hence DEFAULT_CONFIG as Kafka says.
    assert broker_synonyms(broker["broker.rack"]) == []
    assert broker["log.retention.check.interval.ms"].default == "30000"


def test_synonyms_go_on_the_wire_only_when_asked_for() -> None:
    synonyms = [Synonym("log.retention.ms", "5", STATIC)]
    assert synonym_bodies(synonyms, include=False) == []
    assert synonym_bodies(synonyms, include=True) == [
        {"name": "log.retention.ms", "value": "5", "source": 4}
    ]


def test_settings_from_the_environment_and_flags_remember_what_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker's settings are the environment merged with flags: both count as given, and
    everything else stays a default (it used to become 'given' in the merge)."""
    monkeypatch.setenv("KAFSCALE_TOPICS__RETENTION_MS", "5000")
    broker = configs_of(build_settings({"log": {"segment_bytes": 2048}}))
    assert (broker["log.retention.ms"].value, broker["log.retention.ms"].given) == ("5000", True)
    assert (broker["log.segment.bytes"].value, broker["log.segment.bytes"].given) == ("2048", True)
    assert not broker["message.max.bytes"].given
    assert not broker["num.partitions"].given


def test_listener_configs_name_every_listener_its_protocol_and_the_internal_one() -> None:
    """Kafka's tools and UIs read these to tell clients where and how to connect; they named
    one PLAINTEXT listener whatever the broker opened."""
    settings = BrokerSettings(
        listeners="INTERNAL://127.0.0.1:0,EXTERNAL://0.0.0.0:9093",
        listener_security_protocol_map="INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        internal_listener_name="INTERNAL",
    )
    advertised = [("INTERNAL", "127.0.0.1", 40001), ("EXTERNAL", "kafka.example.com", 9093)]
    configs = {
        c.name: c.value
        for c in broker_configs(settings, 1, advertised, {"INTERNAL": 40001, "EXTERNAL": 9093})
    }
    assert configs["listeners"] == "INTERNAL://127.0.0.1:40001,EXTERNAL://:9093"
    assert configs["advertised.listeners"] == (
        "INTERNAL://127.0.0.1:40001,EXTERNAL://kafka.example.com:9093"
    )
    assert configs["listener.security.protocol.map"] == (
        "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT"
    )
    assert configs["inter.broker.listener.name"] == "INTERNAL"
