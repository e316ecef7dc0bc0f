"""Batch reads: what producers wrote comes back exactly once, in offset order per partition."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.spark import source_options
from harness.topics import create_topic

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]], **config: Any) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    for record in records:
        producer.produce(topic, **record)
    assert producer.flush(30) == 0


def test_every_compression_comes_back_exactly_once_in_order(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    broker = broker_cluster.start()
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
        .options(**source_options(broker_cluster))
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
