"""Admin requests answered as Kafka answers them (issue 29, found by librdkafka's own tests):
the broker resource in DescribeConfigs, typed config entries, AlterConfigs (API 33), explicit
replica assignments, unknown topic configs, DeleteRecords beyond the high watermark."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from harness.brokers import BrokerCluster, new_cluster
from harness.groups import wait_for
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.api.configs import ConfigType
from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

DESCRIBE_CONFIGS, ALTER_CONFIGS, DELETE_RECORDS = 32, 33, 21
CREATE_TOPICS, CREATE_PARTITIONS = 19, 37
TOPIC, BROKER = 2, 4


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("rules"), "rules"
    )
    try:
        cluster.start()
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def kafka(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.brokers[0]


@pytest.fixture
def topic() -> str:
    return f"rules-{uuid.uuid4().hex[:10]}"


def node_ids(admin: AdminClient) -> list[int]:
    return sorted(admin.list_topics(timeout=10).brokers)


def error_code(future: object) -> int:
    try:
        future.result(30)  # type: ignore[attr-defined]
    except Exception as exc:  # the client's KafkaException carries the code
        return int(exc.args[0].code())
    return 0


def test_describe_configs_of_the_broker_lists_typed_broker_configs(kafka: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    node_id = str(kafka.status()["node_id"])
    resource = ConfigResource(ConfigResource.Type.BROKER, node_id)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["advertised.listeners"].value == f"PLAINTEXT://{kafka.bootstrap}"
    assert configs["broker.id"].value == node_id
    assert configs["auto.create.topics.enable"].value in ("true", "false")
    assert int(configs["log.segment.bytes"].value) > 0
    assert len(configs) >= 20

    # config_type (v3+) on the wire: the broker's and a topic's.
    with KafkaWire(kafka.bootstrap) as wire:
        body = {
            "resources": [
                {"resource_type": BROKER, "resource_name": node_id, "configuration_keys": None}
            ],
            "include_synonyms": False,
            "include_documentation": False,
        }
        response = wire.request(DESCRIBE_CONFIGS, 4, body)
        types = {c.name: int(c.config_type) for c in response.results[0].configs}
        assert types["advertised.listeners"] == ConfigType.LIST
        assert types["log.segment.bytes"] == ConfigType.INT
        assert types["log.retention.ms"] == ConfigType.LONG
        assert types["auto.create.topics.enable"] == ConfigType.BOOLEAN
        assert types["broker.rack"] == ConfigType.STRING
        assert ConfigType.UNKNOWN not in types.values()
        other = {**body["resources"][0], "resource_name": "999"}  # type: ignore[dict-item]
        wrong = wire.request(DESCRIBE_CONFIGS, 4, {**body, "resources": [other]})
        assert wrong.results[0].error_code == ErrorCode.INVALID_REQUEST


def test_topic_config_entries_carry_their_types(kafka: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    assert error_code(admin.create_topics([NewTopic(topic, 1, 1)])[topic]) == 0
    with KafkaWire(kafka.bootstrap) as wire:
        body = {
            "resources": [{"resource_type": TOPIC, "resource_name": topic}],
            "include_synonyms": False,
            "include_documentation": False,
        }
        response = wire.request(DESCRIBE_CONFIGS, 4, body)
        types = {c.name: int(c.config_type) for c in response.results[0].configs}
        assert types["retention.ms"] == ConfigType.LONG
        assert types["cleanup.policy"] == ConfigType.LIST
        assert types["max.message.bytes"] == ConfigType.INT
        assert types["message.timestamp.type"] == ConfigType.STRING


def test_alter_configs_replaces_a_topics_configs(kafka: BrokerProcess, topic: str) -> None:
    """AlterConfigs (API 33), the non-incremental one: the topic's configs become the ones
    given; those left out return to their defaults."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    new = NewTopic(topic, 1, 1, config={"retention.ms": "1000000", "max.message.bytes": "2000"})
    assert error_code(admin.create_topics([new])[topic]) == 0

    def alter(configs: dict[str, str], resource_type: int = TOPIC, version: int = 2) -> int:
        body = {
            "resources": [
                {
                    "resource_type": resource_type,
                    "resource_name": topic,
                    "configs": [{"name": k, "value": v} for k, v in configs.items()],
                }
            ],
            "validate_only": False,
        }
        with KafkaWire(kafka.bootstrap) as wire:
            return int(wire.request(ALTER_CONFIGS, version, body).responses[0].error_code)

    assert alter({"retention.ms": "5000"}) == ErrorCode.NONE
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["retention.ms"].value == "5000" and not configs["retention.ms"].is_default
    assert configs["max.message.bytes"].is_default  # left out: back to the default
    assert alter({"nonsense.x": "1"}, version=0) == ErrorCode.INVALID_CONFIG
    assert alter({"retention.ms": "soon"}, version=1) == ErrorCode.INVALID_CONFIG
    assert alter({"log.retention.ms": "1"}, resource_type=BROKER) == ErrorCode.INVALID_REQUEST


def test_an_unknown_topic_config_is_invalid_config(kafka: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    new = NewTopic(topic, 1, 1, config={"dummy.doesntexist": "1234"})
    assert error_code(admin.create_topics([new])[topic]) == ErrorCode.INVALID_CONFIG
    for bad in ({"retention.ms": "soon"}, {"cleanup.policy": "shred"}, {"segment.bytes": "-5"}):
        bad_value = NewTopic(topic, 1, 1, config=bad)
        assert error_code(admin.create_topics([bad_value])[topic]) == ErrorCode.INVALID_CONFIG, bad
    known = NewTopic(topic, 1, 1, config={"segment.ms": "3600000", "flush.messages": "5"})
    assert error_code(admin.create_topics([known])[topic]) == 0  # Kafka's configs are taken


def test_explicit_replica_assignments_are_checked_and_accepted(
    kafka: BrokerProcess, topic: str
) -> None:
    """Accepted as Kafka checks them (partitions 0..n-1, registered brokers, none twice in a
    partition); the partitions are then served by their lease owners."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    first, second = node_ids(admin)

    def create(name: str, replicas: list[list[int]], partitions: int = -1) -> int:
        body = {
            "topics": [
                {
                    "name": name,
                    "num_partitions": partitions,
                    "replication_factor": -1,
                    "assignments": [
                        {"partition_index": index, "broker_ids": brokers}
                        for index, brokers in enumerate(replicas)
                    ],
                    "configs": [],
                }
            ],
            "timeout": 10_000,
            "validate_only": False,
        }
        with KafkaWire(kafka.bootstrap) as wire:
            return int(wire.request(CREATE_TOPICS, 7, body).topics[0].error_code)

    def grow(total: int, replicas: list[list[int]]) -> int:
        body = {
            "topics": [
                {
                    "name": topic,
                    "count": total,
                    "assignments": [{"broker_ids": brokers} for brokers in replicas],
                }
            ],
            "timeout": 10_000,
            "validate_only": False,
        }
        with KafkaWire(kafka.bootstrap) as wire:
            return int(wire.request(CREATE_PARTITIONS, 3, body).results[0].error_code)

    def partition_count() -> int:
        return len(admin.list_topics(topic, timeout=10).topics[topic].partitions)

    # librdkafka asks either broker; the one that did not serve the change learns it from the
    # etcd watch a moment later, as a Kafka broker learns it from the metadata log.
    assert create(topic, [[first, second], [second, first], [first, second]]) == ErrorCode.NONE
    wait_for(lambda: partition_count() == 3, 10, "3 partitions in Metadata")
    for name, replicas in [("u", [[first], [12345]]), ("t", [[first, first]]), ("e", [[]])]:
        assert create(f"{topic}-{name}", replicas) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert create(f"{topic}-n", [[first]], partitions=1) == ErrorCode.INVALID_REQUEST

    assert grow(5, [[second, first], [first, second]]) == ErrorCode.NONE
    wait_for(lambda: partition_count() == 5, 10, "5 partitions in Metadata")
    assert grow(6, [[12345, first]]) == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert grow(7, [[first]]) == ErrorCode.INVALID_REPLICA_ASSIGNMENT  # 1 list for 2 new

    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for partition in range(5):
        producer.produce(topic, value=b"x", partition=partition)
    assert producer.flush(30) == 0


def test_delete_records_beyond_the_high_watermark_is_out_of_range_from_any_broker(
    cluster: BrokerCluster, topic: str
) -> None:
    """Kafka answers OFFSET_OUT_OF_RANGE; a broker that does not own the partition answered
    NOT_LEADER_OR_FOLLOWER, which sends the client retrying an impossible request."""
    owner, other = cluster.brokers
    admin = AdminClient({"bootstrap.servers": owner.bootstrap})
    assert error_code(admin.create_topics([NewTopic(topic, 1, 1)])[topic]) == 0
    producer = Producer({"bootstrap.servers": owner.bootstrap})
    for _ in range(3):
        producer.produce(topic, value=b"x", partition=0)
    assert producer.flush(30) == 0

    def delete_records(broker: BrokerProcess, offset: int) -> int:
        body = {
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "offset": offset}]}],
            "timeout": 10_000,
        }
        with KafkaWire(broker.bootstrap) as wire:
            response = wire.request(DELETE_RECORDS, 2, body)
        return int(response.topics[0].partitions[0].error_code)

    for broker in (owner, other):
        assert delete_records(broker, 10) == ErrorCode.OFFSET_OUT_OF_RANGE
