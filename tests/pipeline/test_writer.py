"""The writer: rows produced through the Kafka protocol, read back with a Kafka consumer."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from harness.brokers import BrokerCluster
from harness.spark import source_options
from harness.topics import create_topic

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Any]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "readback", "auto.offset.reset": "earliest"}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    messages: list[Any] = []
    try:
        for _ in range(200):
            if len(messages) >= expected:
                break
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                messages.append(message)
    finally:
        consumer.close()
    return messages


def test_rows_written_by_spark_are_read_back_by_a_kafka_consumer(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "out", 2)
    rows = [
        (
            None if i % 4 == 0 else f"k{i}",
            f"value-{i}",
            i % 2,
            [("source", b"spark"), ("i", str(i).encode())] if i % 3 == 0 else [],
        )
        for i in range(500)
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value string, partition int, headers array<struct<key:string,value:binary>>",
    ).repartition(3)
    (
        df.write.format("kafscale")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", "out")
        .mode("append")
        .save()
    )
    messages = consume_all(broker.bootstrap, "out", 2, len(rows))
    assert len(messages) == len(rows)  # exactly once
    got = {
        m.value().decode(): (
            None if m.key() is None else m.key().decode(),
            m.partition(),
            [(k, bytes(v)) for k, v in (m.headers() or [])],
        )
        for m in messages
    }
    assert got == {v: (k, p, [(hk, bytes(hv)) for hk, hv in h]) for k, v, p, h in rows}

    # and the data source reads them back as well, straight from storage
    back = (
        spark.read.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", "out")
        .load()
        .selectExpr("CAST(value AS STRING) AS value")
        .collect()
    )
    assert sorted(r.value for r in back) == sorted(v for _, v, _, _ in rows)


def test_a_streaming_query_writes_through_the_sink(
    spark: Any, shared_cluster: BrokerCluster, tmp_path: Any
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "copy-in", 1)
    create_topic(broker.bootstrap, "copy-out", 1)
    spark.createDataFrame([(f"r{i}",) for i in range(100)], "value string").write.format(
        "kafscale"
    ).option("kafka.bootstrap.servers", broker.bootstrap).option("topic", "copy-in").mode(
        "append"
    ).save()
    query = (
        spark.readStream.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", "copy-in")
        .option("startingOffsets", "earliest")
        .load()
        .select("key", "value")
        .writeStream.format("kafscale")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("topic", "copy-out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    messages = consume_all(broker.bootstrap, "copy-out", 1, 100)
    assert sorted(m.value().decode() for m in messages) == sorted(f"r{i}" for i in range(100))
