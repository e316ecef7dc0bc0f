"""DescribeConfigs' synonyms and config sources as Kafka gives them (KIP-226): what
``kafka-configs --describe --all``, the Java AdminClient with ``includeSynonyms``, librdkafka's
``describe_configs`` and UIs read to tell a topic's override from a broker setting from a
default. A real broker started with one topic default set (``log.retention.ms``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from harness import children
from harness.brokers import BrokerCluster, new_cluster
from harness.java_client import java_program
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

DESCRIBE_CONFIGS = 32
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC, STATIC_BROKER, DEFAULT = 1, 4, 5
JAVA_SOURCE = Path(__file__).with_name("java") / "ConfigsAdmin.java"
BROKER_RETENTION_MS = "86400000"  # given to the broker at start-up: STATIC_BROKER_CONFIG


@pytest.fixture(scope="module")
def kafka(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    cluster: BrokerCluster = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path_factory.mktemp("synonyms"),
        "synonyms",
        extra_env={"KAFSCALE_TOPICS__RETENTION_MS": BROKER_RETENTION_MS},
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop_all()


@pytest.fixture
def topic(kafka: BrokerProcess) -> str:
    name = f"syn-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    new = NewTopic(name, 1, 1, config={"max.message.bytes": "20000"})
    admin.create_topics([new])[name].result(30)
    return name


def describe(kafka: BrokerProcess, version: int, resource: tuple[int, str], synonyms: bool) -> Any:
    body = {
        "resources": [
            {"resource_type": resource[0], "resource_name": resource[1], "configuration_keys": None}
        ],
        "include_synonyms": synonyms,
        "include_documentation": False,
    }
    with KafkaWire(kafka.bootstrap) as wire:
        (result,) = wire.request(DESCRIBE_CONFIGS, version, body).results
    assert result.error_code == ErrorCode.NONE
    return {c.name: c for c in result.configs}


def synonyms_of(entry: Any) -> list[tuple[str, str, int]]:
    return [(s.name, s.value, int(s.source)) for s in entry.synonyms]


@pytest.mark.parametrize("version", [1, 4])
def test_topic_configs_list_their_synonyms_in_order_of_precedence(
    kafka: BrokerProcess, topic: str, version: int
) -> None:
    configs = describe(kafka, version, (TOPIC, topic), synonyms=True)
    overridden = configs["max.message.bytes"]
    assert overridden.value == "20000"
    assert int(overridden.config_source) == DYNAMIC_TOPIC
    assert synonyms_of(overridden) == [
        ("max.message.bytes", "20000", DYNAMIC_TOPIC),
        ("message.max.bytes", "1048588", DEFAULT),
    ]
    from_broker = configs["retention.ms"]
    assert from_broker.value == BROKER_RETENTION_MS
    assert int(from_broker.config_source) == STATIC_BROKER
    assert synonyms_of(from_broker) == [
        ("log.retention.ms", BROKER_RETENTION_MS, STATIC_BROKER),
        ("log.retention.ms", "604800000", DEFAULT),
    ]
    defaulted = configs["cleanup.policy"]
    assert int(defaulted.config_source) == DEFAULT
    assert synonyms_of(defaulted) == [("log.cleanup.policy", "delete", DEFAULT)]
    assert synonyms_of(configs["segment.bytes"])[0][0] == "log.segment.bytes"
    assert synonyms_of(configs["message.timestamp.type"])[0][0] == "log.message.timestamp.type"
    for entry in configs.values():  # the entry's source is its first synonym's
        assert int(entry.config_source) == int(entry.synonyms[0].source), entry.name


def test_without_include_synonyms_the_lists_stay_empty_and_sources_stay(
    kafka: BrokerProcess, topic: str
) -> None:
    configs = describe(kafka, 4, (TOPIC, topic), synonyms=False)
    assert all(entry.synonyms == () for entry in configs.values())
    assert int(configs["max.message.bytes"].config_source) == DYNAMIC_TOPIC
    assert int(configs["retention.ms"].config_source) == STATIC_BROKER
    assert int(configs["cleanup.policy"].config_source) == DEFAULT


def test_broker_configs_are_static_when_given_else_default(kafka: BrokerProcess) -> None:
    node_id = str(kafka.status()["node_id"])
    configs = describe(kafka, 4, (BROKER, node_id), synonyms=True)
    assert synonyms_of(configs["log.retention.ms"]) == [
        ("log.retention.ms", BROKER_RETENTION_MS, STATIC_BROKER),
        ("log.retention.ms", "604800000", DEFAULT),
    ]
    assert int(configs["log.retention.ms"].config_source) == STATIC_BROKER
    assert synonyms_of(configs["num.partitions"]) == [("num.partitions", "3", DEFAULT)]
    assert int(configs["num.partitions"].config_source) == DEFAULT
    assert synonyms_of(configs["broker.id"]) == [("broker.id", node_id, STATIC_BROKER)]


def test_confluent_kafka_describe_configs_exposes_sources_and_synonyms(
    kafka: BrokerProcess, topic: str
) -> None:
    """librdkafka asks for synonyms (v1+) and exposes them as ``ConfigEntry.synonyms``."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    overridden = configs["max.message.bytes"]
    assert overridden.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert not overridden.is_default
    assert set(overridden.synonyms) == {"max.message.bytes", "message.max.bytes"}
    retention = configs["retention.ms"]
    assert retention.value == BROKER_RETENTION_MS
    assert retention.source == ConfigSource.STATIC_BROKER_CONFIG.value
    (synonym,) = retention.synonyms.values()  # librdkafka keys synonyms by name
    assert synonym.name == "log.retention.ms"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["cleanup.policy"].is_default


def java_describe(kafka: BrokerProcess, kind: str, name: str) -> dict[str, list[str]]:
    """The Java AdminClient's describeConfigs(includeSynonyms): each entry's own line and its
    synonyms' lines, by config name."""
    command = java_program(JAVA_SOURCE, "ConfigsAdmin")
    done = children.run(
        [*command, "describe", kafka.bootstrap, kind, name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    entries: dict[str, list[str]] = {}
    current: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("entry "):
            current = entries.setdefault(line.split()[1], [])
        current.append(line)
    return entries


def test_the_java_admin_client_reads_sources_and_synonyms(kafka: BrokerProcess, topic: str) -> None:
    topic_configs = java_describe(kafka, "topic", topic)
    assert topic_configs["max.message.bytes"] == [
        "entry max.message.bytes DYNAMIC_TOPIC_CONFIG 20000",
        "synonym max.message.bytes DYNAMIC_TOPIC_CONFIG 20000",
        "synonym message.max.bytes DEFAULT_CONFIG 1048588",
    ]
    assert topic_configs["retention.ms"] == [
        f"entry retention.ms STATIC_BROKER_CONFIG {BROKER_RETENTION_MS}",
        f"synonym log.retention.ms STATIC_BROKER_CONFIG {BROKER_RETENTION_MS}",
        "synonym log.retention.ms DEFAULT_CONFIG 604800000",
    ]
    assert topic_configs["cleanup.policy"] == [
        "entry cleanup.policy DEFAULT_CONFIG delete",
        "synonym log.cleanup.policy DEFAULT_CONFIG delete",
    ]
    broker_configs = java_describe(kafka, "broker", str(kafka.status()["node_id"]))
    assert broker_configs["num.partitions"] == [
        "entry num.partitions DEFAULT_CONFIG 3",
        "synonym num.partitions DEFAULT_CONFIG 3",
    ]
