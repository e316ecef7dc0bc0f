"""What Spark sends to the executors: the reader (inside pyspark's read function) and the
partitions, pickled by pyspark's own planner code. Executors only GET objects, so the etcd
endpoints, user, password and certificate paths must not be in those bytes, and a task must
still read its rows from them alone. (Only the partitions of compacted topics carry the etcd
settings, to re-locate after a compaction pass: ``tests/unit/test_pipeline_superseded.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness.batches import make_batch
from harness.spark import plan_as_spark_does, run_as_executors_do
from pyspark.sql.datasource import CaseInsensitiveDict

from kafscale.broker.metadata import keys
from kafscale.broker.storage.segments import encode_segment
from kafscale.pipeline.planning import ReadTask, SegmentObject
from kafscale.pipeline.source import KafScaleDataSource, TaskPartition

pytestmark = pytest.mark.pipeline

DRIVER_ONLY = {
    "etcd.endpoints": "https://etcd-for-the-driver.example:2379",
    "etcd.username": "planner-user",
    "etcd.password": "etcd-password-never-on-executors",
    "etcd.ca_file": "/driver/etcd/ca-file.crt",
    "etcd.cert_file": "/driver/etcd/client-cert.crt",
    "etcd.key_file": "/driver/etcd/client-key.key",
}


def test_a_stream_task_gets_the_store_and_not_the_etcd_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Also from the driver's environment, as a broker's settings would set it.
    monkeypatch.setenv("KAFSCALE_ETCD__PASSWORD", "env-etcd-password-never-on-executors")
    options = {
        **DRIVER_ONLY,
        "cluster": "c1",
        "storage.kind": "local",
        "storage.local_dir": str(tmp_path),
        "subscribe": "orders",
        "includeHeaders": "true",
    }
    options.pop("etcd.password")
    source = KafScaleDataSource(CaseInsensitiveDict(options))
    payload = plan_as_spark_does(source, streaming=True)

    for secret in [*DRIVER_ONLY.values(), "env-etcd-password-never-on-executors"]:
        assert secret.encode() not in payload, secret
    assert str(tmp_path).encode() in payload  # the store travels

    segment = encode_segment([make_batch(0, [b"a", b"b", b"c"], headers=[("h", b"x")])], 0, 4096)
    key = keys.segment_object_key("c1", "orders", "id-1", 0, 0, 1)
    (tmp_path / key).parent.mkdir(parents=True)
    (tmp_path / key).write_bytes(segment.segment)
    task = ReadTask("orders", "id-1", 0, 1, 3, (SegmentObject(0, 1, len(segment.segment)),))
    (batch,) = run_as_executors_do(payload, [TaskPartition(task)])
    rows = batch.to_pylist()
    assert [(r["offset"], r["value"]) for r in rows] == [(1, b"b"), (2, b"c")]
    assert rows[0]["headers"] == [{"key": "h", "value": b"x"}]
