"""Retention under a stream: deleted offsets follow failOnDataLoss, nothing below the log start
is ever returned, nothing above it is lost or read twice."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster
from harness.spark import source_options
from harness.topics import create_topic
from pyspark.errors import StreamingQueryException

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]

SHARED_BROKER_ENV = {"KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S": "0.5"}
"""The module's one broker (``shared_cluster``; each test has a topic of its own): retention
checked every 0.5 s, so what it deletes goes soon after the records that push it out."""


def produce_rounds(bootstrap: str, topic: str, first: int, rounds: int) -> None:
    """One 1 KB record per round, each flushed on its own: one segment per record."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i in range(first, first + rounds):
        producer.produce(topic, value=f"{i:04d}".encode() + b"x" * 1000, partition=0)
        assert producer.flush(10) == 0


def log_start(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low)
    finally:
        consumer.close()


def wait_for_log_start(bootstrap: str, topic: str, at_least: int) -> int:
    """The log start once it reached ``at_least`` and retention stopped moving it (unchanged
    over three of its 0.5 s checks): a query planned while retention still trims would see its
    first offsets deleted under it, which is data loss, not what these tests are about."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and log_start(bootstrap, topic) < at_least:
        time.sleep(0.3)
    low = log_start(bootstrap, topic)
    while time.monotonic() < deadline:
        time.sleep(1.5)
        settled = log_start(bootstrap, topic)
        if settled == low:
            break
        low = settled
    assert low >= at_least
    return low


def stream(spark: Any, options: dict[str, str], out: Path, checkpoint: Path, **extra: str) -> Any:
    query = (
        spark.readStream.format("kafscale")
        .options(**options, **extra)
        .load()
        .selectExpr("offset", "substring(CAST(value AS STRING), 1, 4) AS n")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    with contextlib.suppress(StreamingQueryException):  # the test looks at the exception
        query.awaitTermination(180)
    assert not query.isActive
    return query


def test_retention_under_a_stream_follows_fail_on_data_loss(
    spark: Any, shared_cluster: BrokerCluster, tmp_path: Path
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "trimmed", 1, {"retention.bytes": "5000"})
    options = {**source_options(shared_cluster), "subscribe": "trimmed"}
    out, checkpoint = tmp_path / "lake", tmp_path / "checkpoint"
    produce_rounds(broker.bootstrap, "trimmed", 0, 4)  # 4 KB: nothing trimmed yet
    first = stream(spark, options, out, checkpoint, startingOffsets="earliest")
    assert first.exception() is None
    assert sorted(r.offset for r in spark.read.parquet(str(out)).collect()) == [0, 1, 2, 3]

    # While the stream is away, retention deletes offsets it has not read yet.
    produce_rounds(broker.bootstrap, "trimmed", 4, 12)
    low = wait_for_log_start(broker.bootstrap, "trimmed", 8)

    failed = stream(spark, options, out, checkpoint)
    assert failed.exception() is not None
    message = str(failed.exception())
    assert "failOnDataLoss" in message and "trimmed-0" in message

    resumed = stream(spark, options, out, checkpoint, failOnDataLoss="false")
    assert resumed.exception() is None
    rows = spark.read.parquet(str(out)).collect()
    offsets = sorted(r.offset for r in rows)
    assert len(offsets) == len(set(offsets))  # nothing twice
    assert offsets[:4] == [0, 1, 2, 3]
    later = offsets[4:]
    # Nothing below the log start the resumed batch was planned at; everything above it.
    assert later and later[0] >= low
    assert later == list(range(later[0], 16))
    assert all(int(r.n) == r.offset for r in rows)


def test_a_batch_read_never_returns_records_below_the_log_start(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "trimmed-batch", 1, {"retention.bytes": "5000"})
    produce_rounds(broker.bootstrap, "trimmed-batch", 0, 12)
    low = wait_for_log_start(broker.bootstrap, "trimmed-batch", 7)
    options = {**source_options(shared_cluster), "subscribe": "trimmed-batch"}
    df = spark.read.format("kafscale").options(**options).load()
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets[0] >= low and offsets == list(range(offsets[0], 12))
    # Asking for deleted offsets explicitly is data loss.
    lost = (
        spark.read.format("kafscale")
        .options(**options)
        .option("startingOffsets", '{"trimmed-batch": {"0": 0}}')
        .load()
    )
    with pytest.raises(Exception, match="failOnDataLoss"):
        lost.collect()
    tolerant = (
        spark.read.format("kafscale")
        .options(**options)
        .option("startingOffsets", '{"trimmed-batch": {"0": 0}}')
        .option("failOnDataLoss", "false")
        .load()
    )
    assert sorted(r.offset for r in tolerant.select("offset").collect())[0] >= low
