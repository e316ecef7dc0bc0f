"""Fetch serves every acked record, fills a response up to its byte limits and no further.

Issue 29: a running broker stopped serving records it had acked once more than the state's
recent segments were committed past a consumer's position (a cached listing marked complete
went stale); a fetch returned at most 8 segments per partition; the request's overall
``max_bytes`` was ignored; an incremental session with a small ``fetch.max.bytes`` starved
partitions. A producer that waits for each ack makes one segment per record, which is what
these tests do on the wire.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import (
    FETCH,
    PRODUCE,
    KafkaWire,
    batch_offsets,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
)
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

READ_WHOLE_MS = 30_000  # a max_wait no read of these few segments outlasts


def produce_one_by_one(wire: KafkaWire, topic: str, partition: int, values: list[bytes]) -> None:
    """Each record its own produce, awaited: one segment per record."""
    for value in values:
        code, _ = produce_partition(
            wire.request(PRODUCE, 9, produce_body(topic, partition, make_batch(0, [value])))
        )
        assert code == ErrorCode.NONE


def read_all(
    wire: KafkaWire, topic: str, partition: int, offset: int, end: int, max_bytes: int = 1 << 20
) -> list[int]:
    """The offsets read from ``offset`` up to ``end`` (fails if a fetch comes back empty)."""
    offsets: list[int] = []
    while offset < end:
        part = fetch_partition(
            wire.request(FETCH, 11, fetch_body(topic, partition, offset, max_bytes=max_bytes))
        )
        assert part.error_code == ErrorCode.NONE
        read = batch_offsets(part.records)
        assert read, f"nothing at {offset} (high watermark {part.high_watermark})"
        for base, count in read:
            offsets.extend(range(base, base + count))
        offset = offsets[-1] + 1
    return offsets


def test_records_committed_past_a_consumers_position_stay_readable(
    broker: BrokerProcess,
) -> None:
    """40 records, read to the end, then 40 more (more segments than the state names): all 80
    are readable by the consumer reading on and by a new one, without a restart."""
    create_topics(broker.bootstrap, ["t"], partitions=1)
    with KafkaWire(broker.bootstrap) as wire:
        produce_one_by_one(wire, "t", 0, [b"a%d" % i for i in range(40)])
        assert read_all(wire, "t", 0, 0, 40) == list(range(40))
        produce_one_by_one(wire, "t", 0, [b"b%d" % i for i in range(40)])
        assert read_all(wire, "t", 0, 40, 80) == list(range(40, 80))
        assert read_all(wire, "t", 0, 0, 80) == list(range(80))


def test_a_fetch_fills_the_partition_limit_across_many_segments(broker: BrokerProcess) -> None:
    """A partition of 60 one-record segments is read in one fetch when the limit allows and
    the request's ``max_wait`` does (past it a read stops at what it holds:
    test_fetch_backlog.py); a fetch with records is answered when its read ends, so a long
    ``max_wait`` costs no time here."""
    create_topics(broker.bootstrap, ["m"], partitions=1)
    with KafkaWire(broker.bootstrap) as wire:
        produce_one_by_one(wire, "m", 0, [b"v%d" % i for i in range(60)])
        part = fetch_partition(wire.request(FETCH, 11, fetch_body("m", 0, 0, READ_WHOLE_MS)))
        assert batch_offsets(part.records) == [(i, 1) for i in range(60)]
        # From the middle too, where the first segments come from a listing.
        part = fetch_partition(wire.request(FETCH, 11, fetch_body("m", 0, 5, READ_WHOLE_MS)))
        assert batch_offsets(part.records) == [(i, 1) for i in range(5, 60)]


def two_partition_fetch(offsets: dict[int, int], max_bytes: int, partition_max: int) -> Any:
    body = fetch_body("r", 0, 0, max_bytes=max_bytes)
    template = body["topics"][0]["partitions"][0]
    body["topics"][0]["partitions"] = [
        template | {"partition": p, "fetch_offset": o, "partition_max_bytes": partition_max}
        for p, o in offsets.items()
    ]
    return body


def records_by_partition(response: Any) -> dict[int, list[tuple[int, int]]]:
    return {
        int(p.partition_index): batch_offsets(p.records)
        for t in response.responses
        for p in t.partitions
    }


def response_bytes(response: Any) -> int:
    return sum(len(p.records or b"") for t in response.responses for p in t.partitions)


def test_the_request_max_bytes_caps_the_whole_response(broker: BrokerProcess) -> None:
    """Kafka's rule: the response holds at most the request's ``max_bytes`` of records, except
    that the first partition with data gets at least one batch (a batch is never split)."""
    create_topics(broker.bootstrap, ["r"], partitions=2)
    value = b"x" * 1000
    with KafkaWire(broker.bootstrap) as wire:
        for partition in (0, 1):
            for _ in range(5):
                batch = make_batch(0, [value] * 10)  # ~10 KB a batch
                wire.request(PRODUCE, 9, produce_body("r", partition, batch))
        batch_size = len(
            fetch_partition(wire.request(FETCH, 11, fetch_body("r", 0, 0, max_bytes=1))).records
        )
        assert 10_000 < batch_size < 11_000  # one batch, over the limit: the first is whole

        # Partition limits allow everything; the request's limit allows 2.5 batches.
        limit = batch_size * 5 // 2
        response = wire.request(FETCH, 11, two_partition_fetch({0: 0, 1: 0}, limit, 1 << 20))
        assert response_bytes(response) <= limit
        assert records_by_partition(response)[0] == [(0, 10), (10, 10)]
        assert records_by_partition(response)[1] == []

        # Below one batch: the first partition with data gets one batch, the next none.
        response = wire.request(FETCH, 11, two_partition_fetch({0: 50, 1: 0}, 100, 1 << 20))
        assert records_by_partition(response) == {0: [], 1: [(0, 10)]}

        # Enough for all: both partitions whole.
        response = wire.request(FETCH, 11, two_partition_fetch({0: 0, 1: 0}, 1 << 20, 1 << 20))
        assert records_by_partition(response) == {
            p: [(i * 10, 10) for i in range(5)] for p in (0, 1)
        }


def test_a_confluent_consumer_reads_records_acked_one_by_one_after_reaching_the_end(
    broker_cluster: BrokerCluster,
) -> None:
    """The issue's reproduction with librdkafka on both ends: 40 records sent one by one and
    read to the end; 40 more sent one by one while the consumer is paused, then read by it and
    by a new consumer starting there."""
    broker = broker_cluster.start()
    create_topics(broker.bootstrap, ["c"], partitions=1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    config = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "unused",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    }

    def send_one_by_one(prefix: bytes) -> None:
        for i in range(40):
            producer.produce("c", value=prefix + b"%d" % i)
            assert producer.flush(10) == 0

    def consume(consumer: Consumer, count: int) -> list[bytes]:
        values: list[bytes] = []
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == count:
                break
        return values

    send_one_by_one(b"a")
    first, second = Consumer(config), Consumer(config)
    try:
        first.assign([TopicPartition("c", 0, 0)])
        assert consume(first, 40) == [b"a%d" % i for i in range(40)]
        first.pause([TopicPartition("c", 0)])
        send_one_by_one(b"b")
        second.assign([TopicPartition("c", 0, 40)])
        assert consume(second, 40) == [b"b%d" % i for i in range(40)]
        first.resume([TopicPartition("c", 0)])
        assert consume(first, 40) == [b"b%d" % i for i in range(40)]
    finally:
        first.close()
        second.close()


def test_a_long_poll_outliving_its_topics_deletion_says_unknown_topic(
    broker: BrokerProcess,
) -> None:
    """A consumer waiting at the end of a partition whose topic is deleted is told the topic
    is unknown. It was told OFFSET_OUT_OF_RANGE (the deleted partition looked empty), and
    librdkafka then reset its position ("offset reset ... to BEGINNING") on a topic that no
    longer exists, while a cooperative-sticky consumer was leaving."""
    import time

    from confluent_kafka.admin import AdminClient

    create_topics(broker.bootstrap, ["gone"], partitions=1)
    with KafkaWire(broker.bootstrap) as wire:
        produce_one_by_one(wire, "gone", 0, [b"a", b"b"])
        wire.send(FETCH, 11, fetch_body("gone", 0, 2, max_wait_ms=3000))
        time.sleep(0.5)  # the fetch is waiting for records past the end
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics(["gone"])["gone"].result(10)
        _, response = wire.recv(FETCH, 11)
        assert fetch_partition(response).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
