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

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.admin import NewTopic as CkNewTopic
from harness.brokers import BrokerProcess, new_cluster
from harness.kafka_wire import FETCH, KafkaWire, batches_in, fetch_body, fetch_partition
from harness.kcat import kcat_consume, kcat_headers, kcat_produce
from harness.s3 import S3Endpoint
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KpNewTopic

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
RECORDS = 9  # three per partition
CONSUME_TIMEOUT_S = 30.0


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


# --- what is produced and what comes back ----------------------------------------------------


Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Record:
    partition: int
    key: bytes
    value: bytes
    headers: Headers
    timestamp: int | None  # None: the client sets the time (kcat cannot set one)


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int


def make_records(tag: str, count: int = RECORDS, partitions: int = PARTITIONS) -> list[Record]:
    """Keyed records with two headers each, spread round-robin, timestamps an hour ago."""
    base_ms = int(time.time() * 1000) - 3_600_000
    return [
        Record(
            partition=i % partitions,
            key=f"key-{i}".encode(),
            # repetitive so that every codec really compresses
            value=(f"{tag}-value-{i}|" * 30).encode(),
            headers=(("trace", f"trace-{i}".encode()), ("source", tag.encode())),
            timestamp=base_ms + 1000 * i,
        )
        for i in range(count)
    ]


def check_round_trip(
    produced: list[Record],
    consumed: list[Consumed],
    acked: list[tuple[int, int]] | None,
    window_ms: tuple[int, int] | None = None,
) -> None:
    """Everything came back, in order per partition, at dense offsets from 0, unchanged.

    ``acked``: (partition, offset) the producer was given for each record, if it tells.
    ``window_ms``: wall-clock bounds for records the client timestamped itself.
    """
    assert len(consumed) == len(produced), f"{len(consumed)} consumed, {len(produced)} produced"
    for partition in sorted({r.partition for r in produced}):
        sent = [r for r in produced if r.partition == partition]
        got = sorted((c for c in consumed if c.partition == partition), key=lambda c: c.offset)
        assert [c.offset for c in got] == list(range(len(sent))), f"partition {partition}"
        for record, message in zip(sent, got, strict=True):
            assert message.key == record.key
            assert message.value == record.value
            assert message.headers == record.headers
            if record.timestamp is not None:
                assert message.timestamp == record.timestamp
            else:
                assert window_ms is not None
                assert window_ms[0] - 1000 <= message.timestamp <= window_ms[1] + 1000
    if acked is not None:
        expected = []
        next_offset: dict[int, int] = {}
        for record in produced:
            expected.append((record.partition, next_offset.get(record.partition, 0)))
            next_offset[record.partition] = expected[-1][1] + 1
        assert acked == expected


CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class CodecNotUsed(AssertionError):
    """The client sent the batch with another codec than it was configured with."""


# librdkafka decides per broker whether it may compress, from the advertised ApiVersions:
# LZ4 needs FindCoordinator (any version) advertised; librdkafka 2.0 (Debian's kcat) also needs
# Produce v0 in the advertised range for gzip/snappy/lz4 (the broker serves Produce from v0,
# message format v0/v1 included, as Kafka 3.9 does). Without either, the client logs
# "Broker does not support compression type" and sends uncompressed batches, which
# check_stored_batches catches (CodecNotUsed).


def check_stored_batches(bootstrap: str, topic: str, codec: str, idempotent: bool = True) -> None:
    """The batches as the broker serves them: the client's codec, and a producer id when the
    idempotent producer was on (batches are stored as received, never re-encoded)."""
    with KafkaWire(bootstrap) as wire:
        for partition in range(PARTITIONS):
            response = wire.request(FETCH, 12, fetch_body(topic, partition, 0))
            batches = batches_in(fetch_partition(response).records)
            assert batches, f"partition {partition} is empty"
            for batch in batches:
                if batch.compression != CODEC_IDS[codec]:
                    raise CodecNotUsed(f"{codec} configured, batch stored as {batch}")
                if idempotent:
                    assert batch.producer_id >= 0 and batch.base_sequence >= 0, batch


# --- kafka-python ---------------------------------------------------------------------------


def kp_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([KpNewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def kp_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=None if codec == "none" else codec,
        enable_idempotence=True,
        acks="all",
        linger_ms=20,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp,
            )
            for r in records
        ]
        producer.flush(30)
        metadata = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(10)
    return [(m.partition, m.offset) for m in metadata]


def kp_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    try:
        tps = [KpTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        result: list[Consumed] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(result) < expected and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                result += [
                    Consumed(
                        m.partition,
                        m.offset,
                        m.key,
                        m.value,
                        tuple((name, bytes(value)) for name, value in m.headers),
                        m.timestamp,
                    )
                    for m in messages
                ]
        return result
    finally:
        consumer.close()


# --- aiokafka ---------------------------------------------------------------------------------


def aio_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def aio_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    async def produce() -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            compression_type=None if codec == "none" else codec,
            enable_idempotence=True,
            acks="all",
            linger_ms=20,
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic,
                    key=r.key,
                    value=r.value,
                    headers=list(r.headers),
                    partition=r.partition,
                    timestamp_ms=r.timestamp,
                )
                for r in records
            ]
            metadata = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in metadata]

    return asyncio.run(produce())


def aio_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    async def consume() -> list[Consumed]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        try:
            tps = [AioTopicPartition(topic, p) for p in range(partitions)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            result: list[Consumed] = []
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(result) < expected and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    result += [
                        Consumed(
                            m.partition,
                            m.offset,
                            m.key,
                            m.value,
                            tuple((name, bytes(value)) for name, value in m.headers),
                            m.timestamp,
                        )
                        for m in messages
                    ]
            return result
        finally:
            await consumer.stop()

    return asyncio.run(consume())


# --- confluent-kafka --------------------------------------------------------------------------


def ck_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([CkNewTopic(topic, partitions, 1)], operation_timeout=20)
    for future in futures.values():
        future.result(30)


def ck_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
        }
    )
    reports: list[tuple[int, int] | None] = [None] * len(records)
    errors = []

    def on_delivery(index: int) -> Callable[[object, object], None]:
        def report(err: object, msg: object) -> None:
            if err is not None:
                errors.append(err)
            else:
                reports[index] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        return report

    for i, r in enumerate(records):
        producer.produce(
            topic,
            key=r.key,
            value=r.value,
            headers=list(r.headers),
            partition=r.partition,
            timestamp=r.timestamp or 0,
            on_delivery=on_delivery(i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    return [r for r in reports if r is not None]


def ck_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([CkTopicPartition(topic, p, 0) for p in range(partitions)])
        result: list[Consumed] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(result) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            result.append(
                Consumed(
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple((name, bytes(value)) for name, value in message.headers() or []),
                    message.timestamp()[1],
                )
            )
        return result
    finally:
        consumer.close()


# --- kcat -------------------------------------------------------------------------------------


def kcat_config(codec: str) -> dict[str, str]:
    return {"compression.codec": codec, "enable.idempotence": "true", "linger.ms": "20"}


def kcat_produce_records(bootstrap: str, topic: str, records: list[Record], codec: str) -> None:
    """kcat gives every record of a run the same headers and cannot set timestamps."""
    for partition in sorted({r.partition for r in records}):
        mine = [r for r in records if r.partition == partition]
        headers = mine[0].headers
        assert all(r.headers == headers and r.timestamp is None for r in mine)
        kcat_produce(
            bootstrap,
            topic,
            [(r.key.decode(), r.value.decode()) for r in mine],
            partition=partition,
            headers=[(name, value.decode()) for name, value in headers],
            config=kcat_config(codec),
        )


def kcat_records(tag: str, count: int = RECORDS) -> list[Record]:
    headers = (("trace", b"kcat"), ("source", tag.encode()))
    return [Record(r.partition, r.key, r.value, headers, None) for r in make_records(tag, count)]


def kcat_consume_records(
    bootstrap: str, topic: str, partitions: int, expected: int
) -> list[Consumed]:
    envelopes = kcat_consume(bootstrap, topic, count=expected)
    return [
        Consumed(
            e["partition"],
            e["offset"],
            None if e["key"] is None else e["key"].encode(),
            None if e["payload"] is None else e["payload"].encode(),
            tuple((name, value.encode()) for name, value in kcat_headers(e)),
            e["ts"],
        )
        for e in envelopes
    ]


# --- one client, every codec ------------------------------------------------------------------


CLIENTS = {
    "kafka-python": (kp_create_topic, kp_produce, kp_consume),
    "aiokafka": (aio_create_topic, aio_produce, aio_consume),
    "confluent": (ck_create_topic, ck_produce, ck_consume),
}


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

PRODUCERS = {
    "kafka-python": kp_produce,
    "aiokafka": aio_produce,
    "confluent": ck_produce,
    "kcat": None,
}
CONSUMERS = {
    "kafka-python": kp_consume,
    "aiokafka": aio_consume,
    "confluent": ck_consume,
    "kcat": kcat_consume_records,
}


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
