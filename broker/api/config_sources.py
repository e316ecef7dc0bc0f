"""Where a config's value comes from: DescribeConfigs' ``config_source`` and ``synonyms``.

Kafka (KIP-226) answers each config entry with the settings that could give it its value, in
order of precedence: a topic's own override, then the broker setting the topic config defaults
from (under the broker's name: ``retention.ms`` from ``log.retention.ms``), that setting as
given to the broker at start-up, then its built-in default. The entry's ``config_source`` is
the first of them. ``kafka-configs --describe --all``, the Java AdminClient with
``includeSynonyms``, librdkafka and UIs (AKHQ, Kafka UI) show these to tell an override from
an inherited value. Pure functions over the broker's config list (``configs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from kafscale.broker.api.configs import BrokerConfig


class ConfigSource(IntEnum):
    """Kafka's ``DescribeConfigsResponse.ConfigSource`` codes on the wire."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


TOPIC_CONFIG_SYNONYMS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}
"""A topic config's broker synonym, as Kafka's ``ServerTopicConfigSynonyms`` names it, for
each topic config whose default comes from a broker config KafScale describes."""


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str
    source: ConfigSource


def broker_synonyms(config: BrokerConfig) -> list[Synonym]:
    """A broker config's synonyms: its start-up value if given, then its default if any."""
    given = [Synonym(config.name, config.value, ConfigSource.STATIC_BROKER_CONFIG)]
    default = (
        []
        if config.default is None
        else [Synonym(config.name, config.default, ConfigSource.DEFAULT_CONFIG)]
    )
    return (given if config.given else []) + default


def topic_synonyms(
    name: str, overrides: Mapping[str, str], broker: Mapping[str, BrokerConfig]
) -> list[Synonym]:
    """A topic config's synonyms: the topic's own override if set, then its broker synonym's."""
    override = overrides.get(name)
    own = [] if override is None else [Synonym(name, override, ConfigSource.DYNAMIC_TOPIC_CONFIG)]
    config = broker.get(TOPIC_CONFIG_SYNONYMS.get(name, ""))
    return own + (broker_synonyms(config) if config is not None else [])


def source_of(synonyms: list[Synonym]) -> ConfigSource:
    """An entry's ``config_source``: its first synonym's (Kafka: DEFAULT_CONFIG if none)."""
    return synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG


def synonym_bodies(synonyms: list[Synonym], include: bool) -> list[dict[str, object]]:
    """The wire's synonym list: empty unless the request asked for synonyms (v1+)."""
    if not include:
        return []
    return [{"name": s.name, "value": s.value, "source": int(s.source)} for s in synonyms]
