"""Streaming reads: micro-batches between committed high watermarks, restarted from the
checkpoint with no duplicate and no gap, admission by maxOffsetsPerTrigger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.spark import source_options
from harness.topics import create_topic

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def produce(bootstrap: str, topic: str, first: int, count: int, partitions: int) -> None:
    producers = [
        Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": codec})
        for codec in ("zstd", "none")
    ]
    for i in range(first, first + count):
        producers[i % 2].produce(topic, value=f"v{i}".encode(), partition=i % partitions)
    for producer in producers:
        assert producer.flush(30) == 0


def run_available_now(
    spark: Any, options: dict[str, str], out: Path, checkpoint: Path, **extra: str
) -> Any:
    query = (
        spark.readStream.format("kafscale")
        .options(**options)
        .options(**extra)
        .load()
        .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination(180)
    assert not query.isActive
    if query.exception() is not None:
        raise AssertionError(str(query.exception()))
    return query


def test_a_stream_restarted_from_its_checkpoint_resumes_exactly(
    spark: Any, broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = broker_cluster.start()
    create_topic(broker.bootstrap, "events", 2)
    produce(broker.bootstrap, "events", 0, 200, 2)
    options = {**source_options(broker_cluster), "subscribe": "events"}
    out, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"

    first = run_available_now(
        spark, options, out, checkpoint, startingOffsets="earliest", maxOffsetsPerTrigger="60"
    )
    batches = [p for p in first.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 4  # 200 offsets at most 60 at a time
    assert max(p["numInputRows"] for p in batches) <= 60
    assert sorted(r.value for r in spark.read.parquet(str(out)).collect()) == sorted(
        f"v{i}" for i in range(200)
    )

    produce(broker.bootstrap, "events", 200, 100, 2)
    run_available_now(spark, options, out, checkpoint, startingOffsets="earliest")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}" for i in range(300))
    for partition in range(2):
        offsets = sorted(r.offset for r in rows if r.partition == partition)
        assert offsets == list(range(150))


def test_a_new_stream_starts_at_the_latest_offsets_by_default(
    spark: Any, broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = broker_cluster.start()
    create_topic(broker.bootstrap, "late", 1)
    produce(broker.bootstrap, "late", 0, 50, 1)
    options = {**source_options(broker_cluster), "subscribe": "late"}
    out, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    run_available_now(spark, options, out, checkpoint)  # records the start: offset 50
    produce(broker.bootstrap, "late", 50, 20, 1)
    run_available_now(spark, options, out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(50, 70))
