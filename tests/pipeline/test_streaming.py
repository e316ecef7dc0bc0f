"""Streaming reads: micro-batches between committed high watermarks, restarted from the
checkpoint with no duplicate and no gap, admission by maxOffsetsPerTrigger and
minOffsetsPerTrigger / maxTriggerDelay."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
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
    spark: Any, shared_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "events", 2)
    produce(broker.bootstrap, "events", 0, 200, 2)
    options = {**source_options(shared_cluster), "subscribe": "events"}
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
    spark: Any, shared_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "late", 1)
    produce(broker.bootstrap, "late", 0, 50, 1)
    options = {**source_options(shared_cluster), "subscribe": "late"}
    out, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    run_available_now(spark, options, out, checkpoint)  # records the start: offset 50
    produce(broker.bootstrap, "late", 50, 20, 1)
    run_available_now(spark, options, out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(50, 70))


def wait_until(
    query: Any, condition: Callable[[], bool], what: str, timeout_s: float = 240
) -> None:
    """Poll ``condition`` while ``query`` runs; a generous deadline only against hangs (Spark
    on loaded cores). A failed query fails at once, with its error."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            progress = [
                (p["batchId"], p["numInputRows"], seen_offsets(p)) for p in query.recentProgress
            ]
            raise AssertionError(f"timed out waiting for {what}; progress {progress}")
        time.sleep(0.2)


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def seen_offsets(progress: dict[str, Any]) -> int:
    """Offsets the source reported as committed in the cluster at this trigger."""
    latest = progress["sources"][0].get("latestOffset") or "{}"
    document = json.loads(latest) if isinstance(latest, str) else latest
    return sum(int(o) for partitions in document.values() for o in partitions.values())


def start_memory_stream(spark: Any, options: dict[str, str], name: str, **extra: str) -> Any:
    return (
        spark.readStream.format("kafscale")
        .options(**options)
        .options(startingOffsets="earliest", **extra)
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_min_offsets_per_trigger_holds_batches_until_enough_or_the_delay(
    spark: Any, shared_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "ticks", 2)
    produce(broker.bootstrap, "ticks", 0, 10, 2)
    options = {**source_options(shared_cluster), "subscribe": "ticks"}

    def count(table: str) -> int:
        return int(spark.sql(f"SELECT count(*) FROM {table}").first()[0])

    # Idle triggers report progress too, so the test can see the source looked at new offsets.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    held = start_memory_stream(
        spark, options, "ticks_min", minOffsetsPerTrigger="100", maxTriggerDelay="10m"
    )
    try:
        wait_until(held, lambda: count("ticks_min") == 10, "the first batch (never held back)")
        produce(broker.bootstrap, "ticks", 10, 30, 2)
        wait_until(
            held,
            lambda: any(seen_offsets(p) == 40 for p in held.recentProgress),
            "a trigger that saw the 30 new offsets",
        )
        assert count("ticks_min") == 10  # 30 < minOffsetsPerTrigger: held back
        produce(broker.bootstrap, "ticks", 40, 80, 2)
        wait_until(held, lambda: count("ticks_min") == 120, "the batch once 110 offsets are there")
        assert batch_sizes(held) == [10, 110]
    finally:
        held.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")

    # maxTriggerDelay lets a batch through with fewer offsets than the minimum.
    delayed = start_memory_stream(
        spark, options, "ticks_delay", minOffsetsPerTrigger="1000", maxTriggerDelay="2s"
    )
    try:
        wait_until(delayed, lambda: count("ticks_delay") == 120, "the first batch")
        produce(broker.bootstrap, "ticks", 120, 5, 2)
        wait_until(
            delayed, lambda: count("ticks_delay") == 125, "the batch let through by the delay"
        )
        # The two producers' records may land on either side of a trigger once the delay has
        # run out, so the 5 may come as one batch or two; none waits for the 1000.
        sizes = batch_sizes(delayed)
        assert sizes[0] == 120 and sum(sizes[1:]) == 5
    finally:
        delayed.stop()

    # Trigger.AvailableNow ignores the minimum (it must end) and still honours the maximum.
    query = run_available_now(
        spark,
        options,
        tmp_path / "lake",
        tmp_path / "checkpoint",
        startingOffsets="earliest",
        minOffsetsPerTrigger="50",
        maxOffsetsPerTrigger="50",
    )
    assert sum(batch_sizes(query)) == 125
    assert max(batch_sizes(query)) <= 50
