"""The example job: a topic materialised into Parquet, incrementally, run after run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Producer
from harness import children
from harness.brokers import BrokerCluster
from harness.java_client import JVM_FLAGS
from harness.topics import create_topic

from kafscale.pipeline.jobs import topic_to_parquet

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def produce(bootstrap: str, first: int, count: int, topic: str = "orders") -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "snappy"})
    for i in range(first, first + count):
        producer.produce(topic, key=f"k{i}".encode(), value=f"order-{i}".encode())
    assert producer.flush(30) == 0


def test_each_run_appends_what_was_committed_since_the_last(
    spark: Any,
    shared_cluster: BrokerCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "orders", 3)
    # Connection from the broker's own KAFSCALE_* variables, as next to `kafscale local`.
    for name, value in shared_cluster.env(0, 0).items():
        if name.startswith("KAFSCALE_"):
            monkeypatch.setenv(name, value)
    out = tmp_path / "lake" / "orders"
    argv = ["--topic", "orders", "--out", str(out)]

    produce(broker.bootstrap, 0, 120)
    assert topic_to_parquet.main(argv) == 0
    assert "120 records appended" in capsys.readouterr().out
    produce(broker.bootstrap, 120, 80)
    assert topic_to_parquet.main(argv) == 0
    # The second run resumes from the checkpoint the first left: only what came since.
    assert "80 records appended" in capsys.readouterr().out

    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.value.decode() for r in rows) == sorted(f"order-{i}" for i in range(200))
    assert {r.value.decode(): r.key.decode() for r in rows} == {
        f"order-{i}": f"k{i}" for i in range(200)
    }
    assert_dense_offsets({(r.partition, r.offset) for r in rows}, total=200, partitions=3)
    assert {r.date is not None for r in rows} == {True}


def assert_dense_offsets(positions: set[tuple[int, int]], *, total: int, partitions: int) -> None:
    """Every record once: ``total`` distinct positions, each partition's offsets 0..n-1."""
    assert len(positions) == total
    for partition in range(partitions):
        offsets = sorted(o for p, o in positions if p == partition)
        assert offsets == list(range(len(offsets)))


def spark_submit(cluster: BrokerCluster, argv: list[str], workdir: Path) -> str:
    """``spark-submit <job file> argv`` as a user runs it: a new JVM and driver of its own, the
    connection from flags (etcd, bucket, endpoint) and the standard AWS environment variables,
    none of the broker's KAFSCALE_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFSCALE_", "AWS_"))}
    env |= {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AWS_ACCESS_KEY_ID": cluster.s3.access_key_id,
        "AWS_SECRET_ACCESS_KEY": cluster.s3.secret_access_key,
        "AWS_DEFAULT_REGION": cluster.s3.region,
    }
    command = [
        str(Path(sys.executable).parent / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--driver-java-options",  # the test SparkSession's CPU-saving flags (harness.spark)
        " ".join(JVM_FLAGS),
        topic_to_parquet.__file__,
        *argv,
    ]
    done = children.run(
        command, env=env, cwd=workdir, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"spark-submit failed:\n{done.stdout}\n{done.stderr[-5000:]}"
    return done.stdout


def test_spark_submit_runs_the_job_unchanged_against_s3(
    shared_cluster: BrokerCluster, tmp_path: Path
) -> None:
    """One run in a JVM of its own (a spark-submit costs a JVM and a driver: about a minute on
    two loaded cores). Runs resuming from the checkpoint are the test above's. The module's
    broker, a topic of its own."""
    broker = shared_cluster.brokers[0]
    create_topic(broker.bootstrap, "submitted", 3)
    out = tmp_path / "lake" / "orders"
    argv = [
        "--topic",
        "submitted",
        "--out",
        str(out),
        "--etcd",
        shared_cluster.etcd_url,
        "--cluster",
        shared_cluster.cluster,
        "--bucket",
        shared_cluster.bucket,
        "--s3-endpoint",
        shared_cluster.s3.url,
    ]

    produce(broker.bootstrap, 0, 150, "submitted")
    assert "150 records appended" in spark_submit(shared_cluster, argv, tmp_path)

    # The Parquet dataset as any reader sees it (pyarrow, no Spark): every record once.
    table = pq.read_table(out, partitioning="hive")
    rows = table.to_pylist()
    assert sorted(r["value"].decode() for r in rows) == sorted(f"order-{i}" for i in range(150))
    assert {r["value"].decode(): r["key"].decode() for r in rows} == {
        f"order-{i}": f"k{i}" for i in range(150)
    }
    assert_dense_offsets({(r["partition"], r["offset"]) for r in rows}, total=150, partitions=3)
    assert {r["topic"] for r in rows} == {"submitted"}
    assert all(r["date"] is not None for r in rows)
