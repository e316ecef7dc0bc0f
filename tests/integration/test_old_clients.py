"""Clients from before Kafka 2.1: the old API versions Kafka 3.9 still serves (issue 27).

Raw requests at the exact old versions (ListOffsets v0, OffsetCommit v0-v1, OffsetFetch v0,
Produce v0-v2, Fetch v0-v3) against a real broker process, and kafka-python pinned to
``api_version=(0, 9)`` and ``(0, 10, 1)`` alongside confluent-kafka on one topic.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.kafka_wire import (
    API_VERSIONS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    KafkaWire,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
)
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import legacy_messages as lm
from kafscale.broker.protocol.errors import ErrorCode

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
CORRUPT_MESSAGE = 2


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("old-clients"), "old-clients"
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture(scope="module")
def kafka(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.brokers[0]


@pytest.fixture(scope="module")
def proxy(cluster: BrokerCluster) -> BrokerProcess:
    return start_proxy(cluster)


@pytest.fixture
def topic() -> str:
    return f"old-{uuid.uuid4().hex[:8]}"


def produce_with_confluent(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0)
    assert producer.flush(30) == 0


def advertised(wire: KafkaWire) -> dict[int, tuple[int, int]]:
    response = wire.request(API_VERSIONS, 3, {})
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


def test_old_versions_of_the_simple_apis_are_advertised(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        ranges = advertised(wire)
    assert ranges[LIST_OFFSETS][0] == 0
    assert ranges[OFFSET_COMMIT][0] == 0
    assert ranges[OFFSET_FETCH][0] == 0


def list_offsets_v0(wire: KafkaWire, topic: str, timestamp: int) -> tuple[int, list[int]]:
    body = {
        "replica_id": -1,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": 0, "timestamp": timestamp, "max_num_offsets": 1}
                ],
            }
        ],
    }
    partition = wire.request(LIST_OFFSETS, 0, body).topics[0].partitions[0]
    return int(partition.error_code), [int(o) for o in partition.old_style_offsets]


@pytest.mark.parametrize("endpoint", ["broker", "proxy"])
def test_metadata_v0_with_no_topics_lists_every_topic(
    request: pytest.FixtureRequest, endpoint: str, topic: str
) -> None:
    """v0 has no null array, so an empty topic list asks for every topic (kafka-python pinned
    to 0.9 asks so before it knows its subscription, and joined its group knowing no topic when
    it was answered none); from v1 the empty list asks for none."""
    kafka: BrokerProcess = request.getfixturevalue("kafka" if endpoint == "broker" else "proxy")
    create_topics(kafka.bootstrap, [topic], partitions=2)
    with KafkaWire(kafka.bootstrap) as wire:
        every = wire.request(METADATA, 0, {"topics": []})
        none = wire.request(METADATA, 1, {"topics": []})
    listed = {t.name: len(t.partitions) for t in every.topics}
    assert listed.get(topic) == 2
    assert [t.name for t in none.topics] == []


def test_list_offsets_v0_answers_latest_and_earliest(kafka: BrokerProcess, topic: str) -> None:
    create_topics(kafka.bootstrap, [topic], partitions=1)
    produce_with_confluent(kafka.bootstrap, topic, 5)
    with KafkaWire(kafka.bootstrap) as wire:
        assert list_offsets_v0(wire, topic, -1) == (0, [5])
        assert list_offsets_v0(wire, topic, -2) == (0, [0])
        error, offsets = list_offsets_v0(wire, "no-such-topic-" + topic, -1)
        assert (error, offsets) == (3, [])  # UNKNOWN_TOPIC_OR_PARTITION


def commit_body(group: str, topic: str, offset: int, metadata: str) -> dict[str, object]:
    partition = {
        "partition_index": 0,
        "committed_offset": offset,
        "commit_timestamp": -1,
        "committed_metadata": metadata,
    }
    return {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [{"name": topic, "partitions": [partition]}],
    }


def fetch_committed_v0(wire: KafkaWire, group: str, topic: str) -> tuple[int, int, str]:
    body = {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}
    partition = wire.request(OFFSET_FETCH, 0, body).topics[0].partitions[0]
    return int(partition.error_code), int(partition.committed_offset), str(partition.metadata)


@pytest.mark.parametrize("commit_version", [0, 1])
def test_offset_commit_v0_v1_then_offset_fetch_v0(
    kafka: BrokerProcess, topic: str, commit_version: int
) -> None:
    """A group-less (simple) consumer commits with v0 or v1 and reads the offset back with
    OffsetFetch v0; a v7 client sees the same commit.

    Each answer's error code is checked first, so a failure says what the broker answered. The
    coordinator's own retriable answers are retried, bounded, as a client retries them: on a
    loaded machine the broker's 4-s etcd session can lapse right after it took the group
    (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS from OffsetFetch, ``api/group_offsets``),
    or etcd be slow to answer (COORDINATOR_NOT_AVAILABLE; REQUEST_TIMED_OUT from OffsetCommit)."""
    retriable = {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.REQUEST_TIMED_OUT,
    }

    def answered(ask: Callable[[], tuple[int, Any]], what: str) -> Any:
        """``ask()``'s result once its error code is not retriable (within 60 s); NONE."""
        deadline, pause_s, errors = time.monotonic() + 60, 0.1, []
        while True:
            code, result = ask()
            if code not in retriable or time.monotonic() > deadline:
                break
            errors.append(ErrorCode(code).name)
            time.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)
        assert code == ErrorCode.NONE, f"{what}: {ErrorCode(code).name} (retried: {errors})"
        return result

    def commit() -> tuple[int, None]:
        body = commit_body(group, topic, 3, "m")
        response = wire.request(OFFSET_COMMIT, commit_version, body)
        return int(response.topics[0].partitions[0].error_code), None

    def fetch_v0() -> tuple[int, tuple[int, str]]:
        code, offset, metadata = fetch_committed_v0(wire, group, topic)  # v0: partition errors
        return code, (offset, metadata)

    def fetch_v7() -> tuple[int, Any]:
        body = {
            "group_id": group,
            "topics": [{"name": topic, "partition_indexes": [0]}],
            "require_stable": False,
        }
        response = wire.request(OFFSET_FETCH, 7, body)
        if int(response.error_code) != ErrorCode.NONE:  # the group's error: no topics with it
            return int(response.error_code), None
        partition = response.topics[0].partitions[0]
        return int(partition.error_code), partition

    create_topics(kafka.bootstrap, [topic], partitions=1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    with KafkaWire(kafka.bootstrap) as wire:
        answered(commit, f"OffsetCommit v{commit_version}")
        assert answered(fetch_v0, "OffsetFetch v0") == (3, "m")
        assert int(answered(fetch_v7, "OffsetFetch v7").committed_offset) == 3


# --- message format v0/v1: Produce v0-v2 and Fetch v0-v3 on the wire ----------------------


def produce_legacy(
    wire: KafkaWire, version: int, topic: str, messages: list[lm.LegacyMessage], codec: int
) -> tuple[int, int]:
    response = wire.request(
        PRODUCE, version, produce_body(topic, 0, lm.encode_message_set(messages, codec))
    )
    return produce_partition(response)


def fetch_legacy(wire: KafkaWire, version: int, topic: str, offset: int) -> list[lm.LegacyMessage]:
    response = wire.request(FETCH, version, fetch_body(topic, 0, offset))
    partition = fetch_partition(response)
    assert int(partition.error_code) == 0
    return lm.parse_message_set(partition.records or b"").messages


def consume_with_confluent(bootstrap: str, topic: str, count: int) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"cf-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message)
    finally:
        consumer.close()
    return got


def test_produce_v0_v1_v2_are_stored_and_read_by_new_and_old_fetches(
    kafka: BrokerProcess, topic: str
) -> None:
    """Message sets of magic 0 and 1, plain and compressed, produced at v0-v2; a librdkafka
    consumer reads them with keys, values and v1 timestamps, and Fetch v0-v3 read every record
    back down-converted (including one a new producer wrote with a header)."""
    create_topics(kafka.bootstrap, [topic], partitions=1)
    sent = [
        (0, [lm.LegacyMessage(0, -1, b"k0", b"v0"), lm.LegacyMessage(0, -1, None, b"v1")], 0),
        (1, [lm.LegacyMessage(1, 1_700_000_000_002, b"k2", b"v2")], 1),
        (
            2,
            [lm.LegacyMessage(1, 1_700_000_000_003 + i, b"k", b"v%d" % (3 + i)) for i in range(3)],
            2,
        ),
        (2, [lm.LegacyMessage(1, 1_700_000_000_006, b"k6", None)], 3),
    ]
    with KafkaWire(kafka.bootstrap) as wire:
        offsets = [produce_legacy(wire, v, topic, messages, codec) for v, messages, codec in sent]
    assert offsets == [(0, 0), (0, 2), (0, 3), (0, 6)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic, value=b"v7", key=b"k7", partition=0, headers=[("h", b"x")])
    assert producer.flush(30) == 0
    expected = [m for _, messages, _ in sent for m in messages]
    consumed = consume_with_confluent(kafka.bootstrap, topic, 8)
    assert [(m.key(), m.value()) for m in consumed[:7]] == [(m.key, m.value) for m in expected]
    assert [m.timestamp()[1] for m in consumed[2:7]] == [m.timestamp for m in expected[2:]]
    assert consumed[0].timestamp()[1] == -1  # v0 messages carry no timestamp
    with KafkaWire(kafka.bootstrap) as wire:
        for version in (0, 1, 2, 3):
            read: list[lm.LegacyMessage] = []
            while len(read) < 8:
                batch = fetch_legacy(wire, version, topic, len(read))
                assert batch, f"Fetch v{version} made no progress at {len(read)}"
                read.extend(batch)
            magic = lm.legacy_magic(version)
            assert {m.magic for m in read} == {magic}
            assert [(m.key, m.value) for m in read] == [
                *((m.key, m.value) for m in expected),
                (b"k7", b"v7"),
            ]
            if magic == 1:
                assert [m.timestamp for m in read[2:7]] == [m.timestamp for m in expected[2:]]


def test_corrupt_message_set_is_refused_with_corrupt_message(
    kafka: BrokerProcess, topic: str
) -> None:
    create_topics(kafka.bootstrap, [topic], partitions=1)
    data = bytearray(lm.encode_message_set([lm.LegacyMessage(1, 5, b"k", b"value")]))
    data[-1] ^= 0xFF
    with KafkaWire(kafka.bootstrap) as wire:
        response = wire.request(PRODUCE, 2, produce_body(topic, 0, bytes(data)))
        assert produce_partition(response)[0] == CORRUPT_MESSAGE
        assert list_offsets_v0(wire, topic, -1) == (0, [0])  # nothing stored


# --- kafka-python as a Kafka 0.9 / 0.10.1 client, beside confluent-kafka -------------------

OLD_API_VERSIONS = [(0, 9), (0, 10, 1)]


def kp_produce(
    bootstrap: str, topic: str, values: list[bytes], api_version: tuple[int, ...]
) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, api_version=api_version, acks="all", linger_ms=20
    )
    try:
        futures = [producer.send(topic, key=b"kp", value=v) for v in values]
        producer.flush(30)
        for future in futures:
            future.get(timeout=30)
    finally:
        producer.close(10)


def kp_consume_in_group(
    bootstrap: str, topic: str, group: str, count: int, api_version: tuple[int, ...]
) -> list[bytes]:
    """Values read by a kafka-python group member speaking ``api_version``; it commits what it
    read (OffsetCommit at the old version) before leaving."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        api_version=api_version,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                got += [m.value for m in messages]
        consumer.commit()
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize("endpoint", ["broker", "proxy"])
@pytest.mark.parametrize("api_version", OLD_API_VERSIONS, ids=["0.9", "0.10.1"])
def test_kafka_python_old_protocol_beside_confluent(
    request: pytest.FixtureRequest, endpoint: str, topic: str, api_version: tuple[int, ...]
) -> None:
    """An old client and a new one share a topic: each produces, and both read every record;
    the old client's group commit is what a new member of the group resumes from. Straight to
    the broker and through the proxy (which forwards requests at the client's version)."""
    kafka: BrokerProcess = request.getfixturevalue("kafka" if endpoint == "broker" else "proxy")
    create_topics(kafka.bootstrap, [topic], partitions=3)
    old_values = [b"old-%d" % i for i in range(30)]
    new_values = [b"new-%d" % i for i in range(30)]
    kp_produce(kafka.bootstrap, topic, old_values, api_version)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for value in new_values:
        producer.produce(topic, value=value, key=b"cf", headers=[("h", b"dropped for old")])
    assert producer.flush(30) == 0
    everything = sorted(old_values + new_values)

    group = f"kp-{uuid.uuid4().hex[:6]}"
    assert sorted(kp_consume_in_group(kafka.bootstrap, topic, group, 60, api_version)) == everything
    assert (
        sorted(m.value() for m in consume_with_confluent(kafka.bootstrap, topic, 60)) == everything
    )

    # the group's committed offsets are at the end: a new-protocol member of it reads nothing
    kp_produce(kafka.bootstrap, topic, [b"after"], api_version)
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
    finally:
        consumer.close()
    assert seen == [b"after"]
