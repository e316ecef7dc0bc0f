"""Batch reads: what producers wrote comes back exactly once, in offset order per partition."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.spark import source_options
from harness.topics import create_topic

from kafscale.broker.storage.segments import encode_segment

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]], **config: Any) -> None:
    failures: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for record in records:
        producer.produce(topic, **record, on_delivery=lambda e, _m: e and failures.append(e))
    assert producer.flush(30) == 0
    assert failures == []


def test_every_compression_comes_back_exactly_once_in_order(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "orders", 3)
    sent = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        records = [
            {
                "value": f"{codec}-{i}".encode() * 3,
                "key": None if i % 3 == 0 else f"k{i}".encode(),
                "partition": i % 3,
                "headers": [("codec", codec.encode()), ("n", None)] if i % 2 else [],
            }
            for i in range(300)
        ]
        produce(broker.bootstrap, "orders", records, **{"compression.type": codec})
        sent.extend(records)
    df = (
        spark.read.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", "orders")
        .option("includeHeaders", "true")
        .load()
    )
    rows = df.collect()
    assert len(rows) == len(sent)
    for partition in range(3):
        got = [r for r in rows if r.partition == partition]
        got.sort(key=lambda r: r.offset)
        assert [r.offset for r in got] == list(range(len(got)))
        want = [r for r in sent if r["partition"] == partition]
        assert [bytes(r.value) for r in got] == [r["value"] for r in want]
        assert [None if r.key is None else bytes(r.key) for r in got] == [r["key"] for r in want]
        assert [
            [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers] for r in got
        ] == [r["headers"] for r in want]
    assert {r.topic for r in rows} == {"orders"}
    assert {r.timestampType for r in rows} == {0}


def segment_object(base: int, values: list[bytes]) -> bytes:
    batch = make_batch(base, values)
    return bytes(encode_segment([batch], 0, 4096).segment)


def test_orphans_of_fenced_writers_and_uncommitted_uploads_are_never_read(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "fenced", 1)
    # One batch, so one segment: with linger.ms=5 a loaded machine split the ten records over
    # two produce requests, hence two flush rounds and two segments (once in three runs).
    records = [{"value": f"real-{i}".encode()} for i in range(10)]
    produce(broker.bootstrap, "fenced", records, **{"linger.ms": 1000})
    (real_key,) = [
        k
        for k in shared_cluster.object_keys(f"{shared_cluster.cluster}/topics/fenced/")
        if k.endswith(".kfs")
    ]
    prefix, name = real_key.rsplit("/", 1)
    base, epoch = int(name[:20]), int(name.split("-e")[1].split(".")[0])
    s3 = shared_cluster.s3.client()
    # A fenced writer's upload at the same offsets (an epoch that never owned them), and an
    # upload beyond the high watermark that was never committed.
    s3.put_object(
        Bucket=shared_cluster.bucket,
        Key=f"{prefix}/{base:020d}-e{epoch + 5}.kfs",
        Body=segment_object(base, [b"orphan"] * 10),
    )
    s3.put_object(
        Bucket=shared_cluster.bucket,
        Key=f"{prefix}/{10:020d}-e{epoch}.kfs",
        Body=segment_object(10, [b"uncommitted"] * 3),
    )
    rows = (
        spark.read.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", "fenced")
        .load()
        .collect()
    )
    assert sorted((r.offset, bytes(r.value)) for r in rows) == [
        (i, f"real-{i}".encode()) for i in range(10)
    ]


def test_assign_offsets_json_and_starting_timestamp_choose_the_rows(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "picked", 3)
    base_ms = 1_700_000_000_000
    produce(
        broker.bootstrap,
        "picked",
        [
            {"value": f"{p}-{i}".encode(), "partition": p, "timestamp": base_ms + i * 1000}
            for p in range(3)
            for i in range(20)
        ],
    )
    options = source_options(shared_cluster)

    def read(**extra: str) -> list[tuple[int, int]]:
        df = spark.read.format("kafscale").options(**options, **extra).load()
        return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    assert read(
        assign='{"picked": [0, 2]}',
        startingOffsets='{"picked": {"0": 5, "2": -2}}',
        endingOffsets='{"picked": {"0": 8, "2": 2}}',
    ) == [(0, 5), (0, 6), (0, 7), (2, 0), (2, 1)]
    assert read(subscribePattern="pick.*", startingTimestamp=str(base_ms + 17_000)) == [
        (p, o) for p in range(3) for o in (17, 18, 19)
    ]
