"""Retention by time and size, and DeleteRecords, delete whole objects and move the log start."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from harness.brokers import BrokerCluster

pytestmark = pytest.mark.integration


def segment_keys(cluster: BrokerCluster, topic: str) -> list[str]:
    keys = cluster.object_keys(f"{cluster.cluster}/topics/{topic}/")
    return [k for k in keys if k.endswith(".kfs")]


def produce_in_rounds(bootstrap: str, topic: str, rounds: int, keyed: bool = False) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(rounds):
        key = b"key-%d" % i if keyed else None
        producer.produce(topic, key=key, value=b"x" * 1000, partition=0)
        assert producer.flush(10) == 0  # one flush (one segment) per round


def earliest_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "r"})
    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    consumer.close()
    return int(low)


def test_retention_by_bytes_deletes_old_segments(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S="0.5")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("sized", 1, 1, config={"retention.bytes": "5000"})])[
        "sized"
    ].result(10)
    produce_in_rounds(broker.bootstrap, "sized", 12)
    # ~1.1 KB segments: 5000 bytes keep four of them.
    low = trimmed_to(broker_cluster, broker.bootstrap, "sized", at_least=7, produced=12)
    assert low >= 7, f"log start {low} after 12 KB with retention.bytes=5000"
    # Later checks weigh the log from what they listed before plus what was committed since.
    produce_in_rounds(broker.bootstrap, "sized", 8)
    low = trimmed_to(broker_cluster, broker.bootstrap, "sized", at_least=15, produced=20)
    assert low >= 15, f"log start {low} after 20 KB with retention.bytes=5000"


def trimmed_to(
    cluster: BrokerCluster, bootstrap: str, topic: str, at_least: int, produced: int
) -> int:
    """The log start once it reached ``at_least`` (or 15 s passed), after checking that the
    segments below it were deleted (all but the one holding it, within 10 s)."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and earliest_offset(bootstrap, topic) < at_least:
        time.sleep(0.3)
    low = earliest_offset(bootstrap, topic)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(segment_keys(cluster, topic)) > produced - low + 1:
        time.sleep(0.3)
    assert len(segment_keys(cluster, topic)) <= produced - low + 1
    return low


def test_retention_by_time_expires_everything_old(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S="0.5")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("timed", 1, 1, config={"retention.ms": "1000"})])["timed"].result(
        10
    )
    produce_in_rounds(broker.bootstrap, "timed", 3)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and earliest_offset(broker.bootstrap, "timed") < 3:
        time.sleep(0.3)
    assert earliest_offset(broker.bootstrap, "timed") == 3
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(segment_keys(broker_cluster, "timed")) > 1:
        time.sleep(0.3)
    assert len(segment_keys(broker_cluster, "timed")) <= 1


def test_a_compacted_topic_is_never_trimmed_by_time(broker_cluster: BrokerCluster) -> None:
    """Kafka trims a ``cleanup.policy=compact`` topic only by compaction (Connect's and a schema
    registry's topics rely on it): with a key per record nothing is cleaned away, so every record
    stays. The same retention.ms with ``compact,delete`` expires as usual, which shows the checks
    ran. (Compacted topics need keys: test_compaction.py.)"""
    broker = broker_cluster.start(KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S="0.5")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    policies = {"kept": "compact", "trimmed": "compact,delete"}
    new = [
        NewTopic(t, 1, 1, config={"cleanup.policy": p, "retention.ms": "1000"})
        for t, p in policies.items()
    ]
    for future in admin.create_topics(new).values():
        future.result(10)
    for topic in policies:
        produce_in_rounds(broker.bootstrap, topic, 3, keyed=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and earliest_offset(broker.bootstrap, "trimmed") < 3:
        time.sleep(0.3)
    assert earliest_offset(broker.bootstrap, "trimmed") == 3
    time.sleep(1.0)  # two more checks
    assert earliest_offset(broker.bootstrap, "kept") == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kept"})
    consumer.assign([TopicPartition("kept", 0, 0)])
    offsets = [m.offset() for m in consumer.consume(3, timeout=10)]
    consumer.close()
    assert offsets == [0, 1, 2]


def test_a_fenced_writers_late_upload_is_deleted_by_the_next_owner(
    broker_cluster: BrokerCluster,
) -> None:
    """An upload of the previous epoch that lands after the handoff (planted here at the new
    epoch's first offset, where a fenced writer's uploads begin) is never committed; the new
    owner's janitor deletes it and leaves the data alone. (Here the partition's first page of
    keys holds it too; tests/unit/test_retention.py shows the boundary scan finding it.)"""
    first = broker_cluster.start()
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic("fenced", 1, 1)])["fenced"].result(10)
    produce_in_rounds(first.bootstrap, "fenced", 3)
    assert first.stop() == 0
    prefix = next(iter(segment_keys(broker_cluster, "fenced"))).rsplit("/", 1)[0]
    late = f"{prefix}/{3:020d}-e0.kfs"  # epoch 0's writer, at offset 3 where epoch 1 begins
    broker_cluster.s3.client().put_object(Bucket=broker_cluster.bucket, Key=late, Body=b"late")
    second = broker_cluster.start(KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S="0.5")
    produce_in_rounds(second.bootstrap, "fenced", 2)  # epoch 1 at offsets 3 and 4
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and late in segment_keys(broker_cluster, "fenced"):
        time.sleep(0.3)
    assert late not in segment_keys(broker_cluster, "fenced")
    assert len(segment_keys(broker_cluster, "fenced")) == 5
    assert earliest_offset(second.bootstrap, "fenced") == 0


def test_a_topics_segment_bytes_cuts_its_segments(broker_cluster: BrokerCluster) -> None:
    """``segment.bytes`` set on a topic is the size at which its partitions flush and cut
    segments; topics without it get the broker's ``log.segment_bytes``, and say so."""
    broker = broker_cluster.start(
        KAFSCALE_LOG__SEGMENT_BYTES="2097152",
        KAFSCALE_LOG__FLUSH_INTERVAL_MS="3000",
        KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS="3000",
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new = [NewTopic("small-segments", 1, 1, config={"segment.bytes": "16384"})]
    new += [NewTopic("default-segments", 1, 1)]
    for future in admin.create_topics(new).values():
        future.result(10)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "batch.num.messages": 1,  # a batch per record, many requests in flight
            "max.in.flight.requests.per.connection": 100,
        }
    )
    for i in range(64):  # 64 KiB in 1 KiB batches, inside one 3 s flush interval
        producer.produce("small-segments", value=b"%04d" % i + b"x" * 1020, partition=0)
        producer.poll(0)
    assert producer.flush(20) == 0  # whole 16 KiB segments at once, the rest on the timer
    sizes = [
        len(
            broker_cluster.s3.client()
            .get_object(Bucket=broker_cluster.bucket, Key=key)["Body"]
            .read()
        )
        for key in segment_keys(broker_cluster, "small-segments")
    ]
    assert len(sizes) >= 4 and max(sizes) <= 16384 + 1200, sizes
    resource = ConfigResource(ResourceType.TOPIC, "default-segments")
    described = admin.describe_configs([resource])[resource].result(10)
    assert described["segment.bytes"].value == "2097152"
