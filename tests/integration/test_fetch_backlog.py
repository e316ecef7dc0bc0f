"""A Fetch is answered by its ``max_wait`` once it holds records, however large the backlog.

The fault campaign (bench/README.md, chaos seed 31): after a rebalance every partition of the
group delivered nothing for 3-7 s more, and one for 12 s, with its owner running. The members'
librdkafka log showed why: each partition's first Fetch (``fetch.wait.max.ms`` 500) read the
backlog of ~1,500 records in ~600 one-flush segments that the broker answering had not cached
(it had just taken the partition over, or restarted) and was answered 3.3-7.1 s later; the
client's Metadata requests queued behind one of them on the same connection were answered
only with it (Kafka answers a connection's requests in order), 0.9-5.2 s late, so a partition
whose leader had moved waited for that too. The broker now stops reading once past the
request's ``max_wait`` if it holds records (``LogReader.read``'s deadline) and the client
fetches on from there.

No timing is asserted: with ``max_wait`` 0 a backlog of more segments than one read takes at
once (``MAX_SEGMENTS_AT_ONCE``) comes back in parts; it used to come back whole.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster
from harness.kafka_wire import FETCH, KafkaWire, batch_offsets, fetch_body, fetch_partition
from harness.topics import create_topics

from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.storage.reader import MAX_SEGMENTS_AT_ONCE

pytestmark = pytest.mark.integration

BACKLOG = 3 * MAX_SEGMENTS_AT_ONCE + 5  # one segment per record: more than one read's worth


def produce_one_segment_each(bootstrap: str, topic: str, count: int) -> None:
    """librdkafka producing and waiting for each ack: one segment per record."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(count):
        producer.produce(topic, value=b"r%d" % i, partition=0)
        assert producer.flush(30) == 0


def fetched_offsets(wire: KafkaWire, topic: str, offset: int, max_wait_ms: int) -> list[int]:
    part = fetch_partition(wire.request(FETCH, 11, fetch_body(topic, 0, offset, max_wait_ms)))
    assert part.error_code == ErrorCode.NONE
    return [o for base, count in batch_offsets(part.records) for o in range(base, base + count)]


def test_a_backlog_at_a_broker_that_has_not_cached_it_is_answered_in_parts_by_max_wait(
    broker_cluster: BrokerCluster,
) -> None:
    """A broker started after the backlog was written (its cache cold, as after a takeover or
    a restart) answers a Fetch with ``max_wait`` 0 with the records its first read took, a
    prefix in order; fetching on from each answer's end gives every record, none skipped; and
    librdkafka with ``fetch.wait.max.ms`` 0 (each answer cut at its first read) reads the
    backlog whole and in order, from the start and from the middle."""
    owner = broker_cluster.start()
    create_topics(owner.bootstrap, ["backlog"], partitions=1)
    produce_one_segment_each(owner.bootstrap, "backlog", BACKLOG)
    cold = broker_cluster.start()
    with KafkaWire(cold.bootstrap) as wire:
        first = fetched_offsets(wire, "backlog", 0, max_wait_ms=0)
        assert first == list(range(len(first)))
        assert 0 < len(first) < BACKLOG, "the whole backlog in one answer past max_wait"
        offsets = list(first)
        while len(offsets) < BACKLOG:
            more = fetched_offsets(wire, "backlog", offsets[-1] + 1, max_wait_ms=0)
            assert more, f"nothing at {offsets[-1] + 1}"
            offsets.extend(more)
    assert offsets == list(range(BACKLOG))
    for start in (0, BACKLOG // 2):
        assert consumed(cold.bootstrap, "backlog", start) == [
            b"r%d" % i for i in range(start, BACKLOG)
        ]


def consumed(bootstrap: str, topic: str, start: int) -> list[bytes]:
    """The values librdkafka reads from ``start`` to the end of a backlog of ``BACKLOG``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 0,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        for _ in range(300):
            values += [m.value() for m in consumer.consume(BACKLOG, 0.2) if m.error() is None]
            if len(values) >= BACKLOG - start:
                break
    finally:
        consumer.close()
    return values
