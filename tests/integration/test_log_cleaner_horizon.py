"""Delete horizons (KIP-534) end to end: a real broker on moto S3 and etcd, real clients.

A tombstone's ``delete.retention.ms`` starts when the cleaner first keeps it, not at its write.
Here the first pass is held back (``min.cleanable.dirty.ratio`` over 1) until the tombstone is
older than ``delete.retention.ms``; that pass keeps it (the old rule dropped it there, so a
consumer reading then missed the deletion) and writes its batch a delete horizon. A consumer
that starts after the pass sees the tombstone, with librdkafka (through the broker and the
proxy) and kafka-python, and every record with the timestamp it was produced with. A pass
after the horizon removes it.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTP
from harness.brokers import BrokerCluster
from harness.log_cleaner import (
    CLEANER_ENV,
    alter_topic,
    create_compacted,
    eventually,
    partition_state,
    stored_horizons,
)
from harness.proxy import start_proxy

pytestmark = pytest.mark.integration

RETENTION_MS = 3000
T0 = 1_700_000_000_000
Row = tuple[int, bytes, bytes | None, int]  # offset, key, value, timestamp ms


def produce(bootstrap: str, topic: str, rows: list[tuple[bytes, bytes | None, int]]) -> None:
    """One flushed producer per call: a segment of its own."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    for key, value, timestamp in rows:
        producer.produce(topic, key=key, value=value, partition=0, timestamp=timestamp)
    assert producer.flush(15) == 0
    time.sleep(0.1)


def consume_librdkafka(bootstrap: str, topic: str, end: int) -> list[Row]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([ConfluentTP(topic, 0, 0)])
    found: list[Row] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            found.append((message.offset(), message.key(), message.value(), message.timestamp()[1]))
            if message.offset() >= end - 1:
                return found
        raise AssertionError(f"consumer stalled after {found[-1:] or 'nothing'} (end {end})")
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, topic: str, end: int) -> list[Row]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    consumer.assign([KafkaTP(topic, 0)])
    consumer.seek_to_beginning()
    found: list[Row] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not found or found[-1][0] < end - 1):
        for batch in consumer.poll(500).values():
            found += [(m.offset, m.key, m.value, m.timestamp) for m in batch]
    consumer.close()
    return found


def test_a_tombstone_older_than_the_retention_at_its_first_pass_is_kept_until_its_horizon(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "horizon"
    create_compacted(
        broker.bootstrap,
        topic,
        **{"min.cleanable.dirty.ratio": "1.5", "delete.retention.ms": str(RETENTION_MS)},
    )
    rounds: list[list[tuple[bytes, bytes | None, int]]] = [
        [(b"a", b"a0", T0 + 30), (b"b", b"b0", T0), (b"c", b"c0", T0 + 7)],
        [(b"a", b"a1", T0 + 2000), (b"b", None, T0 + 1000), (b"c", b"c1", T0 + 500)],
        [(b"c", b"c2", T0 + 5000)],  # the newest segment: never cleaned
    ]
    for rows in rounds:
        produce(broker.bootstrap, topic, rows)
    written = [(o, k, v, t) for o, (k, v, t) in enumerate(r for rows in rounds for r in rows)]
    end = len(written)
    # The tombstone (b at offset 4) grows older than delete.retention.ms before any pass.
    time.sleep(RETENTION_MS / 1000 + 1)
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    first = eventually(
        lambda: (c := partition_state(broker_cluster, topic).cleaned) and c.upto >= end - 1 and c,
        "the first pass",
        timeout_s=90,
    )
    passed_at_ms = time.time() * 1000  # the pass ran before now: its horizon is before now + R

    # A consumer that starts after the pass still sees the deletion, with every timestamp.
    expected = [written[3], written[4], written[5], written[6]]
    assert consume_librdkafka(broker.bootstrap, topic, end) == expected
    assert consume_kafka_python(broker.bootstrap, topic, end) == expected
    assert consume_librdkafka(start_proxy(broker_cluster).bootstrap, topic, end) == expected
    # The tombstone's batch carries the horizon (the pass's time + delete.retention.ms).
    horizons = {h for h in stored_horizons(broker_cluster, topic) if h is not None}
    assert len(horizons) == 1 and min(horizons) <= passed_at_ms + RETENTION_MS

    # After the horizon, the next pass (new data makes one due) removes the tombstone.
    time.sleep(max(0.0, (min(horizons) - time.time() * 1000) / 1000) + 0.5)
    produce(broker.bootstrap, topic, [(b"d", b"d0", T0 + 6000)])
    produce(broker.bootstrap, topic, [(b"e", b"e0", T0 + 7000)])
    eventually(
        lambda: (
            (c := partition_state(broker_cluster, topic).cleaned)
            and c.generation > first.generation
            and c.upto >= end + 1
        ),
        "a pass after the horizon",
        timeout_s=90,
    )
    after = consume_librdkafka(broker.bootstrap, topic, end + 2)
    assert [r[:3] for r in after] == [
        (3, b"a", b"a1"),
        (6, b"c", b"c2"),
        (7, b"d", b"d0"),
        (8, b"e", b"e0"),
    ]
