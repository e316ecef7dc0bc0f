"""The example job: a topic materialised into Parquet, incrementally, run after run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.topics import create_topic

from kafscale.pipeline.jobs import topic_to_parquet

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def produce(bootstrap: str, first: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "snappy"})
    for i in range(first, first + count):
        producer.produce("orders", key=f"k{i}".encode(), value=f"order-{i}".encode())
    assert producer.flush(30) == 0


def test_each_run_appends_what_was_committed_since_the_last(
    spark: Any, broker_cluster: BrokerCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = broker_cluster.start()
    create_topic(broker.bootstrap, "orders", 3)
    # Connection from the broker's own KAFSCALE_* variables, as next to `kafscale local`.
    for name, value in broker_cluster.env(0, 0).items():
        if name.startswith("KAFSCALE_"):
            monkeypatch.setenv(name, value)
    out = tmp_path / "lake" / "orders"
    argv = ["--topic", "orders", "--out", str(out)]

    produce(broker.bootstrap, 0, 120)
    assert topic_to_parquet.main(argv) == 0
    produce(broker.bootstrap, 120, 80)
    assert topic_to_parquet.main(argv) == 0

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value.decode() for r in rows) == sorted(f"order-{i}" for i in range(200))
    assert {r.date is not None for r in rows} == {True}
