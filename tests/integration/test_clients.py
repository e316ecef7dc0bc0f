"""Stock Kafka clients against one broker process on moto S3 and etcd.

kafka-python, aiokafka, confluent-kafka (librdkafka 2.16) and kcat (Debian's, librdkafka 2.0)
each create a topic, produce keyed records with headers and explicit timestamps with every
compression codec and the idempotent producer on, and read everything back from offset 0:
per-partition order, dense offsets from 0, keys, values, headers, partitions and timestamps.
Then the same across clients, ListOffsets (earliest, latest, by timestamp) and a long-poll
fetch woken by a later produce.

One broker serves the whole module (each test uses its own topics).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from harness.brokers import BrokerProcess, new_cluster
from harness.kafka_wire import FETCH, KafkaWire, batches_in, fetch_body, fetch_partition
from harness.round_trip import (
    CODECS,
    PARTITIONS,
    Record,
    check_round_trip,
    check_stored_batches,
    make_records,
)
from harness.s3 import S3Endpoint
from harness.stock_clients import (
    CLIENTS,
    CONSUMERS,
    PRODUCERS,
    ck_create_topic,
    kcat_consume_records,
    kcat_produce_records,
    kcat_records,
    kp_consume,
    kp_create_topic,
    kp_produce,
)
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration


# --- one broker for the module ----------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("clients"), "clients"
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop_all()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return f"t-{request.node.name[:40].translate(str.maketrans('[]', '--'))}-{uuid.uuid4().hex[:6]}"


# --- one client, every codec ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "codec"), [(client, codec) for client in CLIENTS for codec in CODECS]
)
def test_client_round_trip(kafka: BrokerProcess, topic: str, client: str, codec: str) -> None:
    create, produce, consume = CLIENTS[client]
    create(kafka.bootstrap, topic)
    records = make_records(f"{client}-{codec}")
    acked = produce(kafka.bootstrap, topic, records, codec)
    consumed = consume(kafka.bootstrap, topic, PARTITIONS, len(records))
    check_round_trip(records, consumed, acked)
    check_stored_batches(kafka.bootstrap, topic, codec)


@pytest.mark.parametrize("codec", CODECS)
def test_kcat_round_trip(kafka: BrokerProcess, topic: str, codec: str) -> None:
    """kcat auto-creates the topic (3 partitions by default) and reads it back as JSON."""
    records = kcat_records(f"kcat-{codec}")
    before = int(time.time() * 1000)
    kcat_produce_records(kafka.bootstrap, topic, records, codec)
    after = int(time.time() * 1000)
    consumed = kcat_consume_records(kafka.bootstrap, topic, PARTITIONS, len(records))
    check_round_trip(records, consumed, None, window_ms=(before, after))
    check_stored_batches(kafka.bootstrap, topic, codec)


# --- across clients ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("producer", "consumer", "codec"),
    [
        ("kafka-python", "confluent", "zstd"),
        ("confluent", "aiokafka", "lz4"),
        ("aiokafka", "kcat", "snappy"),
        ("kcat", "kafka-python", "gzip"),
        ("confluent", "kafka-python", "snappy"),
        ("kafka-python", "aiokafka", "gzip"),
    ],
)
def test_cross_client(
    kafka: BrokerProcess, topic: str, producer: str, consumer: str, codec: str
) -> None:
    ck_create_topic(kafka.bootstrap, topic)
    before = int(time.time() * 1000)
    acked = None
    if producer == "kcat":
        records = kcat_records(f"{producer}-{codec}")
        kcat_produce_records(kafka.bootstrap, topic, records, codec)
    else:
        records = make_records(f"{producer}-{codec}")
        acked = PRODUCERS[producer](kafka.bootstrap, topic, records, codec)  # type: ignore[misc]
    after = int(time.time() * 1000)
    consumed = CONSUMERS[consumer](kafka.bootstrap, topic, PARTITIONS, len(records))
    check_round_trip(records, consumed, acked, window_ms=(before, after))


def test_keyed_records_without_partition_stay_together(kafka: BrokerProcess, topic: str) -> None:
    """The client's partitioner picks the partition; one key always lands on one partition."""
    ck_create_topic(kafka.bootstrap, topic)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 10})
    sent = [(f"key-{i % 4}".encode(), f"v{i}".encode()) for i in range(24)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    consumed = kp_consume(kafka.bootstrap, topic, PARTITIONS, len(sent))
    partitions_of_key: dict[bytes | None, set[int]] = {}
    for message in consumed:
        partitions_of_key.setdefault(message.key, set()).add(message.partition)
    assert all(len(parts) == 1 for parts in partitions_of_key.values()), partitions_of_key
    for key in partitions_of_key:
        in_order = [m.value for m in sorted(consumed, key=lambda m: m.offset) if m.key == key]
        assert in_order == [v for k, v in sent if k == key]


# --- ListOffsets ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_list_offsets_earliest_latest_and_by_timestamp(
    kafka: BrokerProcess, topic: str, codec: str
) -> None:
    """offsets_for_times finds the first record at or after a time, inside compressed batches."""
    kp_create_topic(kafka.bootstrap, topic, partitions=2)
    records = make_records(f"offsets-{codec}", count=12, partitions=1)  # all on partition 0
    kp_produce(kafka.bootstrap, topic, records, codec)
    first_ts = records[0].timestamp
    assert first_ts is not None
    tp0, tp1 = KpTopicPartition(topic, 0), KpTopicPartition(topic, 1)
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id=None)
    try:
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 12, tp1: 0}
        # exactly on record 5's time, between records 7 and 8, before everything, after all
        found = consumer.offsets_for_times({tp0: first_ts + 5000})[tp0]
        assert (found.offset, found.timestamp) == (5, first_ts + 5000)
        found = consumer.offsets_for_times({tp0: first_ts + 7500})[tp0]
        assert (found.offset, found.timestamp) == (8, first_ts + 8000)
        found = consumer.offsets_for_times({tp0: first_ts - 10_000})[tp0]
        assert (found.offset, found.timestamp) == (0, first_ts)
        assert consumer.offsets_for_times({tp0: first_ts + 60_000})[tp0] is None
        assert consumer.offsets_for_times({tp1: first_ts})[tp1] is None  # empty partition
    finally:
        consumer.close()

    # librdkafka asks the same questions its own way
    ck = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        assert ck.get_watermark_offsets(CkTopicPartition(topic, 0), timeout=10) == (0, 12)
        [found_ck] = ck.offsets_for_times([CkTopicPartition(topic, 0, first_ts + 3500)], 10)
        assert found_ck.error is None and found_ck.offset == 4
    finally:
        ck.close()


def test_list_offsets_max_timestamp(kafka: BrokerProcess, topic: str) -> None:
    """ListOffsets v7+ MAX_TIMESTAMP (KIP-734): the first record with the largest timestamp,
    found inside a compressed batch, not the end of the log."""
    kp_create_topic(kafka.bootstrap, topic, partitions=2)
    base_ms = int(time.time() * 1000) - 3_600_000
    deltas = [5, 9, 2, 7, 9, 1]  # the largest twice: the first one counts
    records = [
        Record(0, b"k%d" % i, b"v%d" % i, (), base_ms + d * 1000) for i, d in enumerate(deltas)
    ]
    kp_produce(kafka.bootstrap, topic, records, "zstd")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    results = {}
    for partition in (0, 1):
        futures = admin.list_offsets(
            {CkTopicPartition(topic, partition): OffsetSpec.max_timestamp()}
        )
        [future] = futures.values()
        found = future.result(30)
        results[partition] = (found.offset, found.timestamp)
    assert results[0] == (1, base_ms + 9000)
    assert results[1][0] <= 0  # empty partition: no record to point at


# --- long poll --------------------------------------------------------------------------------


def test_long_poll_is_woken_by_a_later_produce(kafka: BrokerProcess, topic: str) -> None:
    """A consumer waiting at the end of the log with fetch.wait.max.ms of 30 s gets a record
    produced after it started waiting, well before its fetch would have timed out (the bound
    is generous: half the wait; a broker that only answers at max wait misses it)."""
    ck_create_topic(kafka.bootstrap, topic, partitions=1)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 30_000,
            "socket.timeout.ms": 90_000,
        }
    )
    received: list[bytes | None] = []
    try:
        consumer.assign([CkTopicPartition(topic, 0, 0)])
        assert consumer.poll(1.0) is None  # nothing there yet; the fetch is parked
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        producer.produce(topic, key=b"k", value=b"wake-up", partition=0)
        assert producer.flush(30) == 0
        produced_at = time.monotonic()
        while not received and time.monotonic() - produced_at < 15:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                received.append(message.value())
    finally:
        consumer.close()
    assert received == [b"wake-up"], "the parked fetch was not woken by the produce"


def test_long_poll_raw_fetch_returns_before_max_wait(kafka: BrokerProcess, topic: str) -> None:
    """On the wire: a Fetch with max_wait 30 s, parked at the log end, answers with the record
    produced meanwhile, well before its max wait (generous bound: half of it)."""
    ck_create_topic(kafka.bootstrap, topic, partitions=1)
    with KafkaWire(kafka.bootstrap, timeout_s=60) as wire:
        started = time.monotonic()
        wire.send(FETCH, 12, fetch_body(topic, 0, 0, max_wait_ms=30_000))
        time.sleep(0.5)
        producer = Producer({"bootstrap.servers": kafka.bootstrap})
        producer.produce(topic, value=b"late", partition=0)
        assert producer.flush(30) == 0
        _, response = wire.recv(FETCH, 12)
        waited_s = time.monotonic() - started
    partition = fetch_partition(response)
    assert int(partition.error_code) == 0
    assert [(b.base_offset, b.record_count) for b in batches_in(partition.records)] == [(0, 1)]
    assert waited_s < 15, f"the fetch was not woken: it waited {waited_s:.1f}s of 30s"
