"""Topic administration through two stock admin clients: kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient (librdkafka).

Create (and already-exists), describe and incrementally alter configs, add partitions and
produce to the new one, delete a topic (a re-created topic of the same name shows none of the
old records), delete records (the log start offset moves; a consumer from 0 is moved to it) and
describe the cluster. One broker serves the module; each test uses its own topics.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, OffsetSpec
from confluent_kafka.admin import ConfigResource as CkConfigResource
from confluent_kafka.admin import NewPartitions as CkNewPartitions
from confluent_kafka.admin import NewTopic as CkNewTopic
from confluent_kafka.admin import ResourceType as CkResourceType
from harness.brokers import BrokerCluster, BrokerProcess, running_cluster
from harness.kafka_wire import FETCH, KafkaWire, fetch_body, fetch_partition
from harness.s3 import S3Endpoint
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kafka.errors import KafkaError as KpKafkaError

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 0, 1, 3
OFFSET_INVALID = -1001  # librdkafka: no committed offset
MESSAGE_TOO_LARGE, INVALID_TIMESTAMP = 10, 32
TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_CONFIG = 36, 37, 40


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    with running_cluster(etcd_server, s3_server, tmp_path_factory, "admin") as cluster:
        yield cluster


@pytest.fixture
def kafka(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.brokers[0]


@pytest.fixture
def topic() -> str:
    return f"admin-{uuid.uuid4().hex[:10]}"


# --- one interface over both admin clients ---------------------------------------------------


class Admin(Protocol):
    def create(self, topic: str, partitions: int, configs: dict[str, str] | None = None) -> int: ...
    def configs(self, topic: str) -> dict[str, tuple[str | None, bool]]: ...
    def alter(self, topic: str, changes: dict[str, str | None]) -> int: ...
    def add_partitions(self, topic: str, total: int) -> int: ...
    def delete(self, topic: str) -> int: ...
    def delete_records(self, topic: str, partition: int, before: int) -> tuple[int, int]: ...
    def earliest(self, topic: str, partition: int) -> int: ...
    def describe_cluster(self) -> tuple[str, int, set[tuple[int, str, int]]]: ...
    def close(self) -> None: ...


def _kp_code(exc: Exception) -> int:
    return int(getattr(exc, "errno", -1))


class KafkaPythonAdmin:
    def __init__(self, bootstrap: str) -> None:
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)

    def create(self, topic: str, partitions: int, configs: dict[str, str] | None = None) -> int:
        result = self.admin.create_topics(
            [KpNewTopic(topic, partitions, 1, topic_configs=configs or {})], raise_errors=False
        )
        return int(result["topics"][0]["error_code"])

    def configs(self, topic: str) -> dict[str, tuple[str | None, bool]]:
        result = self.admin.describe_configs(
            [KpConfigResource("TOPIC", topic)], config_filter="all"
        )
        entries = result["topic"][topic]
        return {
            name: (entry["value"], entry["config_source"] == "DEFAULT_CONFIG")
            for name, entry in entries.items()
        }

    def alter(self, topic: str, changes: dict[str, str | None]) -> int:
        configs = {n: ("DELETE", None) if v is None else ("SET", v) for n, v in changes.items()}
        try:
            result = self.admin.alter_configs(
                [KpConfigResource("TOPIC", topic, configs=configs)],
                raise_on_unknown=False,
                incremental=True,
            )
        except KpKafkaError as exc:
            return _kp_code(exc)
        outcome = str(result["topic"][topic])  # "OK" or "[Error 40] InvalidConfigurationError…"
        if outcome == "OK":
            return NONE
        match = re.match(r"\[Error (-?\d+)\]", outcome)
        assert match, outcome
        return int(match.group(1))

    def add_partitions(self, topic: str, total: int) -> int:
        try:
            response = self.admin.create_partitions({topic: KpNewPartitions(total)})
        except KpKafkaError as exc:
            return _kp_code(exc)
        return int(response.results[0].error_code)

    def delete(self, topic: str) -> int:
        try:
            result = self.admin.delete_topics([topic])
        except KpKafkaError as exc:
            return _kp_code(exc)
        return int(result["topics"][0]["error_code"])

    def delete_records(self, topic: str, partition: int, before: int) -> tuple[int, int]:
        tp = KpTopicPartition(topic, partition)
        try:
            result = self.admin.delete_records({tp: before})[tp]
        except KpKafkaError as exc:
            return _kp_code(exc), -1
        return int(result["error_code"]), int(result["low_watermark"])

    def earliest(self, topic: str, partition: int) -> int:
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=self.admin.config["bootstrap_servers"])
        try:
            tp = KpTopicPartition(topic, partition)
            return int(consumer.beginning_offsets([tp])[tp])
        finally:
            consumer.close()

    def describe_cluster(self) -> tuple[str, int, set[tuple[int, str, int]]]:
        result = self.admin.describe_cluster()
        brokers = {(b["broker_id"], b["host"], b["port"]) for b in result["brokers"]}
        return result["cluster_id"], int(result["controller_id"]), brokers

    def close(self) -> None:
        self.admin.close()


def _ck_code(future: Any) -> int:
    try:
        future.result(30)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return NONE


class ConfluentAdmin:
    def __init__(self, bootstrap: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(self, topic: str, partitions: int, configs: dict[str, str] | None = None) -> int:
        futures = self.admin.create_topics([CkNewTopic(topic, partitions, 1, config=configs or {})])
        return _ck_code(futures[topic])

    def configs(self, topic: str) -> dict[str, tuple[str | None, bool]]:
        resource = CkConfigResource(CkResourceType.TOPIC, topic)
        entries = self.admin.describe_configs([resource])[resource].result(30)
        return {name: (entry.value, bool(entry.is_default)) for name, entry in entries.items()}

    def alter(self, topic: str, changes: dict[str, str | None]) -> int:
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.DELETE)
            if value is None
            else ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in changes.items()
        ]
        resource = CkConfigResource(CkResourceType.TOPIC, topic, incremental_configs=entries)
        return _ck_code(self.admin.incremental_alter_configs([resource])[resource])

    def add_partitions(self, topic: str, total: int) -> int:
        return _ck_code(self.admin.create_partitions([CkNewPartitions(topic, total)])[topic])

    def delete(self, topic: str) -> int:
        return _ck_code(self.admin.delete_topics([topic])[topic])

    def delete_records(self, topic: str, partition: int, before: int) -> tuple[int, int]:
        futures = self.admin.delete_records([CkTopicPartition(topic, partition, before)])
        [future] = futures.values()
        try:
            deleted = future.result(30)
        except KafkaException as exc:
            return int(exc.args[0].code()), -1
        return NONE, int(deleted.low_watermark)

    def earliest(self, topic: str, partition: int) -> int:
        tp = CkTopicPartition(topic, partition)
        futures = self.admin.list_offsets({tp: OffsetSpec.earliest()})
        [future] = futures.values()
        return int(future.result(30).offset)

    def describe_cluster(self) -> tuple[str, int, set[tuple[int, str, int]]]:
        result = self.admin.describe_cluster().result(30)
        brokers = {(n.id, n.host, n.port) for n in result.nodes}
        return result.cluster_id, int(result.controller.id), brokers

    def close(self) -> None:
        pass


ADMINS = {"kafka-python": KafkaPythonAdmin, "confluent": ConfluentAdmin}


@pytest.fixture(params=list(ADMINS))
def admin(request: pytest.FixtureRequest, kafka: BrokerProcess) -> Iterator[Admin]:
    client = ADMINS[request.param](kafka.bootstrap)
    try:
        yield client
    finally:
        client.close()


# --- helpers ----------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> list[int]:
    offsets: list[int] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for value in values:
        producer.produce(
            topic,
            value=value,
            partition=partition,
            on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()),
        )
    assert producer.flush(30) == 0
    return offsets


def produce_alone(bootstrap: str, topic: str, value: bytes) -> int:
    """Produce ``value`` in a batch of its own, uncompressed; the broker's error code (0: acked).
    The client's own size limit is raised so that the broker's is the one that counts."""
    codes: list[int] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "message.max.bytes": 1 << 20, "compression.type": "none"}
    )
    producer.produce(
        topic, value=value, on_delivery=lambda err, _: codes.append(err.code() if err else 0)
    )
    assert producer.flush(30) == 0
    return codes[0]


def consume(
    bootstrap: str, topic: str, partition: int, start: int, expect: int, reset: str = "earliest"
) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "auto.offset.reset": reset,
            "fetch.wait.max.ms": 100,
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([CkTopicPartition(topic, partition, start)])
        deadline = time.monotonic() + (20 if expect else 3)
        while time.monotonic() < deadline and (expect == 0 or len(got) < expect):
            message = consumer.poll(0.3)
            if message is None or message.error() is not None:
                continue
            got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return got


def topic_partitions(bootstrap: str, topic: str) -> int | None:
    """The partition count Metadata reports, or None if the topic is unknown."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


# --- tests -----------------------------------------------------------------------------------


def test_create_topic_and_already_exists(admin: Admin, kafka: BrokerProcess, topic: str) -> None:
    assert admin.create(topic, 4, {"retention.ms": "3600000"}) == NONE
    assert topic_partitions(kafka.bootstrap, topic) == 4
    assert admin.create(topic, 2) == TOPIC_ALREADY_EXISTS
    assert topic_partitions(kafka.bootstrap, topic) == 4  # unchanged
    assert admin.configs(topic)["retention.ms"] == ("3600000", False)
    assert admin.create("bad/name", 1) != NONE
    assert admin.create(f"{topic}-zero", 0) != NONE


def test_describe_and_incrementally_alter_configs(admin: Admin, topic: str) -> None:
    assert admin.create(topic, 1, {"cleanup.policy": "delete"}) == NONE
    before = admin.configs(topic)
    assert before["retention.ms"] == ("604800000", True)
    assert before["cleanup.policy"] == ("delete", False)

    assert admin.alter(topic, {"retention.ms": "7200000", "retention.bytes": "1048576"}) == NONE
    after = admin.configs(topic)
    assert after["retention.ms"] == ("7200000", False)
    assert after["retention.bytes"] == ("1048576", False)
    assert after["cleanup.policy"] == ("delete", False)  # incremental: others kept

    assert admin.alter(topic, {"retention.bytes": None}) == NONE  # DELETE: back to default
    assert admin.configs(topic)["retention.bytes"] == ("-1", True)
    assert admin.configs(topic)["retention.ms"] == ("7200000", False)

    assert admin.alter(topic, {"retention.ms": "soon"}) == INVALID_CONFIG
    assert admin.configs(topic)["retention.ms"] == ("7200000", False)
    assert admin.alter(f"{topic}-missing", {"retention.ms": "1"}) == UNKNOWN_TOPIC_OR_PARTITION


def test_max_message_bytes_caps_each_batch_and_follows_changes(
    admin: Admin, kafka: BrokerProcess, topic: str
) -> None:
    assert admin.create(topic, 1, {"max.message.bytes": "2000"}) == NONE
    assert produce_alone(kafka.bootstrap, topic, b"s" * 500) == NONE
    assert produce_alone(kafka.bootstrap, topic, b"L" * 5000) == MESSAGE_TOO_LARGE
    assert admin.alter(topic, {"max.message.bytes": "10000"}) == NONE
    deadline = time.monotonic() + 10  # the broker's view follows etcd's watch
    while (code := produce_alone(kafka.bootstrap, topic, b"L" * 5000)) != NONE:
        assert code == MESSAGE_TOO_LARGE and time.monotonic() < deadline
    assert consume(kafka.bootstrap, topic, 0, 0, 2) == [(0, b"s" * 500), (1, b"L" * 5000)]
    assert admin.configs(topic)["max.message.bytes"] == ("10000", False)


def test_create_time_too_far_from_the_broker_clock_is_invalid_timestamp(
    admin: Admin, kafka: BrokerProcess, topic: str
) -> None:
    """As Kafka 4: a record an hour or more ahead of the broker's clock gets INVALID_TIMESTAMP;
    nothing is too old unless ``message.timestamp.before.max.ms`` says so."""
    assert admin.create(topic, 1, {"message.timestamp.before.max.ms": "86400000"}) == NONE
    now_ms = int(time.time() * 1000)
    day_ms = 86_400_000

    def code_at(timestamp_ms: int) -> int:
        codes: list[int] = []
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        producer.produce(
            topic,
            value=b"t",
            timestamp=timestamp_ms,
            on_delivery=lambda err, _: codes.append(err.code() if err else 0),
        )
        assert producer.flush(30) == 0
        return codes[0]

    assert code_at(now_ms + 60_000) == NONE  # a clock a minute fast is fine
    assert code_at(now_ms + 2 * 3_600_000) == INVALID_TIMESTAMP
    assert code_at(now_ms - day_ms // 2) == NONE
    assert code_at(now_ms - 2 * day_ms) == INVALID_TIMESTAMP
    assert admin.alter(topic, {"message.timestamp.before.max.ms": None}) == NONE
    deadline = time.monotonic() + 10  # the broker's view follows etcd's watch
    while (code := code_at(now_ms - 2 * day_ms)) != NONE:
        assert code == INVALID_TIMESTAMP and time.monotonic() < deadline
    assert admin.alter(topic, {"message.timestamp.after.max.ms": "-1"}) == INVALID_CONFIG


def test_log_append_time_topics_stamp_records_with_the_broker_time(
    admin: Admin, kafka: BrokerProcess, topic: str
) -> None:
    assert admin.create(topic, 1, {"message.timestamp.type": "LogAppendTime"}) == NONE
    reported: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    before_ms = int(time.time() * 1000)
    for i in range(3):
        producer.produce(
            topic,
            value=b"v%d" % i,
            timestamp=978_307_200_000,  # 2001: the producer's CreateTime, replaced
            on_delivery=lambda err, msg: reported.append(msg.timestamp()),
        )
    assert producer.flush(30) == 0
    after_ms = int(time.time() * 1000)
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "unused"})
    consumer.assign([CkTopicPartition(topic, 0, 0)])
    stamps = []
    deadline = time.monotonic() + 20
    while len(stamps) < 3 and time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is not None and message.error() is None:
            stamps.append(message.timestamp())
    consumer.close()
    assert len(stamps) == 3
    assert {kind for kind, _ in stamps + reported} == {TIMESTAMP_LOG_APPEND_TIME}
    assert all(before_ms <= ms <= after_ms for _, ms in stamps + reported), (stamps, reported)
    assert admin.alter(topic, {"message.timestamp.type": "Sometime"}) == INVALID_CONFIG


def test_create_partitions_then_produce_to_the_new_one(
    admin: Admin, kafka: BrokerProcess, topic: str
) -> None:
    assert admin.create(topic, 1) == NONE
    assert admin.add_partitions(topic, 3) == NONE
    assert topic_partitions(kafka.bootstrap, topic) == 3
    assert produce(kafka.bootstrap, topic, 2, [b"new-0", b"new-1"]) == [0, 1]
    assert consume(kafka.bootstrap, topic, 2, 0, 2) == [(0, b"new-0"), (1, b"new-1")]
    assert admin.add_partitions(topic, 2) == INVALID_PARTITIONS  # no shrinking
    assert admin.add_partitions(f"{topic}-missing", 4) == UNKNOWN_TOPIC_OR_PARTITION


def test_deleted_topic_recreated_shows_no_old_records(
    admin: Admin, kafka: BrokerProcess, cluster: BrokerCluster, topic: str
) -> None:
    assert admin.create(topic, 2) == NONE
    produce(kafka.bootstrap, topic, 0, [b"old-%d" % i for i in range(10)])
    assert admin.delete(topic) == NONE
    assert topic_partitions(kafka.bootstrap, topic) is None
    assert admin.delete(topic) == UNKNOWN_TOPIC_OR_PARTITION

    assert admin.create(topic, 2) == NONE
    assert consume(kafka.bootstrap, topic, 0, 0, 0) == []
    assert produce(kafka.bootstrap, topic, 0, [b"fresh"]) == [0]
    assert consume(kafka.bootstrap, topic, 0, 0, 1) == [(0, b"fresh")]

    # the old topic's objects leave the bucket (asynchronously)
    prefix = f"{cluster.cluster}/topics/{topic}/"
    deadline = time.monotonic() + 20
    while True:
        topic_ids = {key[len(prefix) :].split("/")[0] for key in cluster.object_keys(prefix)}
        if len(topic_ids) <= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(topic_ids) == 1, f"objects of the deleted topic remain: {topic_ids}"


def committed_offset(bootstrap: str, group: str, topic: str, offset: int | None = None) -> int:
    """Commit ``offset`` for partition 0 first (if given); the group's committed offset then
    (``OFFSET_INVALID``, -1001, when none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        if offset is not None:
            consumer.commit(offsets=[CkTopicPartition(topic, 0, offset)], asynchronous=False)
        return int(consumer.committed([CkTopicPartition(topic, 0)], timeout=10)[0].offset)
    finally:
        consumer.close()


def test_a_recreated_topic_starts_without_the_old_committed_offsets(
    admin: Admin, kafka: BrokerProcess, topic: str
) -> None:
    """Kafka drops a deleted topic's committed offsets: a group must not resume the new topic
    at an offset from the old one (it would skip the new topic's first records)."""
    group = f"g-{topic}"
    assert admin.create(topic, 1) == NONE
    produce(kafka.bootstrap, topic, 0, [b"old-%d" % i for i in range(5)])
    assert committed_offset(kafka.bootstrap, group, topic, 5) == 5
    assert admin.delete(topic) == NONE
    assert admin.create(topic, 1) == NONE
    assert committed_offset(kafka.bootstrap, group, topic) == OFFSET_INVALID
    produce(kafka.bootstrap, topic, 0, [b"new-%d" % i for i in range(8)])
    assert committed_offset(kafka.bootstrap, group, topic) == OFFSET_INVALID
    assert committed_offset(kafka.bootstrap, group, topic, 3) == 3  # the new topic's own


def test_delete_records_moves_the_log_start(admin: Admin, kafka: BrokerProcess, topic: str) -> None:
    assert admin.create(topic, 1) == NONE
    produce(kafka.bootstrap, topic, 0, [b"r-%d" % i for i in range(20)])
    assert admin.delete_records(topic, 0, 8) == (NONE, 8)
    assert admin.earliest(topic, 0) == 8

    # a consumer asking for offset 0 is out of range; with auto.offset.reset=earliest it
    # continues from the new log start
    got = consume(kafka.bootstrap, topic, 0, 0, 12)
    assert got == [(o, b"r-%d" % o) for o in range(8, 20)]
    with KafkaWire(kafka.bootstrap) as wire:
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 3)))
        assert int(partition.error_code) == OFFSET_OUT_OF_RANGE
        assert int(partition.log_start_offset) == 8

    assert admin.delete_records(topic, 0, 5) == (NONE, 8)  # never moves back
    assert admin.delete_records(topic, 0, 50)[0] == OFFSET_OUT_OF_RANGE  # beyond the end
    assert admin.delete_records(topic, 0, 20) == (NONE, 20)  # everything
    assert admin.earliest(topic, 0) == 20
    assert produce(kafka.bootstrap, topic, 0, [b"next"]) == [20]


def test_describe_cluster(admin: Admin, kafka: BrokerProcess, cluster: BrokerCluster) -> None:
    cluster_id, controller, brokers = admin.describe_cluster()
    assert cluster.cluster in cluster_id
    assert brokers == {(kafka.node_id, "127.0.0.1", kafka.port)}
    assert controller == kafka.node_id
