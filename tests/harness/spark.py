"""Spark for tests: one local SparkSession for the whole pipeline suite (a start costs 5-15 s),
the options that point the data source at a test's cluster (real etcd, moto's S3, brokers),
and pyspark's own planner and executor steps run in this process. It imports nothing of the
broker: ``tests/unit/test_spark_source_imports.py`` counts what those steps import."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from harness.java_client import JVM_FLAGS

if TYPE_CHECKING:
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
        # The tests' queries are small: C1 alone and the serial collector, as for the test
        # clients, halve the driver JVM's CPU (~45 s to ~22 s for a start and a few queries).
        .config("spark.driver.extraJavaOptions", " ".join(JVM_FLAGS))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
        stop_spark_jvm()


def stop_spark_jvm() -> None:
    """``SparkSession.stop`` leaves py4j's JVM running until this process exits, busy with ~4 %
    of a core; the suite stops the session as soon as a worker is done with Spark
    (``harness.workers``), so the JVM goes too. Unsetting the gateway makes the next
    ``getOrCreate`` launch a new one. The JVM exits when its stdin closes (PySpark's protocol)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    SparkContext._gateway = None
    SparkContext._jvm = None
    gateway.close()
    process = getattr(gateway, "proc", None)
    if process is None:
        return
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


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


def plan_as_spark_does(data_source: Any, streaming: bool) -> bytes:
    """What pyspark's planner process sends back to the JVM for a read of ``data_source``: the
    pickled read function (with the reader inside it) and the pickled partitions. These bytes
    are what every task receives, so what is in them reaches the executors."""
    import io

    from pyspark.sql.datasource_internal import _streamReader
    from pyspark.sql.worker.plan_data_source_read import write_read_func_and_partitions

    schema = data_source.schema()
    reader = _streamReader(data_source, schema) if streaming else data_source.reader(schema)
    out = io.BytesIO()
    write_read_func_and_partitions(
        out,
        reader=reader,
        data_source=data_source,
        schema=schema,
        max_arrow_batch_size=10_000,
        binary_as_bytes=True,
    )
    return out.getvalue()


def run_as_executors_do(payload: bytes, partitions: list[Any] | None = None) -> list[Any]:
    """Unpickle ``payload`` (from ``plan_as_spark_does``) as a task does and run its read
    function over each partition (those it carries, or ``partitions`` for a stream, which
    plans them per micro-batch): the Arrow batches the tasks would hand to the JVM."""
    import io

    import pyarrow as pa
    from pyspark.serializers import read_int
    from pyspark.worker_util import pickleSer

    stream = io.BytesIO(payload)
    read_function, _ = pickleSer._read_with_length(stream)
    raw = [stream.read(read_int(stream)) for _ in range(read_int(stream))]
    raw += [pickleSer.dumps(partition) for partition in partitions or []]
    batches: list[Any] = []
    for partition in raw:
        row = pa.RecordBatch.from_arrays([pa.array([partition], pa.binary())], ["partition"])
        batches.extend(read_function(iter([row])))
    return batches
