"""Reading a topic back whole, as a test checks what was acked: each partition's high
watermark, then every record from offset 0 up to it, at dense offsets."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

Acked = dict[tuple[int, int], bytes]  # (partition, offset) -> value

_METADATA_IN_FLUX = frozenset(
    {
        KafkaError._DESTROY_BROKER,  # a broker left the metadata with the request queued on it
        KafkaError._UNKNOWN_PARTITION,  # the partition had no leader in the metadata
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)
"""What ``get_watermark_offsets`` raises while the cluster's metadata changes under it."""


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark, asked again, by a new consumer, while the metadata is in
    flux.

    A broker that died or restarted (a new node id) leaves the metadata, and a partition has no
    leader until another broker claims it. librdkafka then drops the gone broker's handle,
    failing a ListOffsets queued on it with ``_DESTROY_BROKER`` (CI), or fails it with
    ``_UNKNOWN_PARTITION``, and ``get_watermark_offsets`` does not retry; the same consumer kept
    failing for 60 s after the cluster had settled, a new one did not. So each attempt uses a
    new consumer, within 60 s, after which the error stands."""
    deadline = time.monotonic() + 60
    while True:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
        try:
            return {
                p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=20)[1])
                for p in range(partitions)
            }
        except KafkaException as exc:
            if exc.args[0].code() not in _METADATA_IN_FLUX or time.monotonic() > deadline:
                raise
        finally:
            consumer.close()
        time.sleep(0.5)


def read_everything(bootstrap: str, topic: str, partitions: int) -> Acked:
    """Every record of the topic from offset 0 up to each partition's high watermark."""
    ends = high_watermarks(bootstrap, topic, partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        records: Acked = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            (p, ends[p] - 1) not in records for p in range(partitions) if ends[p] > 0
        ):
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records[(message.partition(), message.offset())] = message.value()
    finally:
        consumer.close()
    for p in range(partitions):
        offsets = sorted(o for q, o in records if q == p)
        assert offsets == list(range(ends[p])), f"partition {p}: offsets not dense from 0"
    return records
