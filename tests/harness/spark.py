"""Spark for tests: one local SparkSession for the whole pipeline suite (a start costs 5-15 s),
and the options that point the data source at a test's cluster (real etcd, moto's S3, brokers)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from harness.brokers import BrokerCluster


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # Workers must run this venv's python (pyarrow, numba); Spark must stay on loopback.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafscale-pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def source_options(cluster: BrokerCluster) -> dict[str, str]:
    """Connection options of ``format("kafscale")`` for a test's cluster."""
    return {
        "etcd.endpoints": cluster.etcd_url,
        "cluster": cluster.cluster,
        "storage.kind": "s3",
        "storage.endpoint": cluster.s3.url,
        "storage.bucket": cluster.bucket,
        "storage.region": cluster.s3.region,
        "storage.access_key_id": cluster.s3.access_key_id,
        "storage.secret_access_key": cluster.s3.secret_access_key,
    }
