"""What each Python process Spark starts for ``format("kafscale")`` imports of ours.

Spark gives every Python process it starts 10 s to connect back (hard-coded in Spark 4's
``PythonWorkerFactory``), and on a loaded host the source's imports made them miss it ("Python
worker failed to connect back"). Importing the source used to cost 3-4 x pyspark's data source
API: it pulled in the broker's settings model (pydantic-settings, listener, TLS and token
models), the live cluster view (ACLs, quotas), etcd's client, prometheus_client and numpy, in
every process. Each process now imports what it uses (``bench/startup.py --only spark``
measures the time). Run in fresh interpreters, as Spark's processes are, each stage as pyspark
runs it:

* ``resolve``: ``import pyspark_kafscale`` (what pyspark's data source lookup imports) and
  ``schema()``, the process that resolves the format;
* ``planner``: a stream read planned by pyspark's own planner code (``plan_as_spark_does``):
  the options parsed and the read function pickled for the executors; then a batch query's
  reader, as its planner makes it before it reads etcd (with etcd's client imported);
* ``executor``: that read function unpickled and run over a task (``run_as_executors_do``),
  reading a segment from a local directory.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from harness import children

from kafscale.broker.child_process import child_env

pytestmark = pytest.mark.unit

NEVER = [  # the broker's: no process of the source uses them
    "kafscale.broker.config",  # BrokerSettings, only when a KAFSCALE_* variable is set
    "pydantic_settings",
    "kafscale.broker.security.listeners",
    "kafscale.broker.security.tokens",
    "kafscale.broker.metadata.cluster",
    "kafscale.broker.authz.store",
    "kafscale.broker.quotas.store",
    "prometheus_client",
]
PLANNING = ["kafscale.pipeline.readers", "kafscale.pipeline.catalog", "aetcd", "grpc"]
READING = ["kafscale.pipeline.fetch", "kafscale.pipeline.decode", "numba"]

NOT_IMPORTED = {  # (pyspark's planner code imports numpy and pyarrow itself)
    "resolve": [*NEVER, *PLANNING, *READING, "numpy", "pydantic"],
    "planner": [*NEVER, *READING],
    "executor": [*NEVER, *PLANNING],
}

_SCRIPT = """
import json, sys
from pathlib import Path

stages = {}
import pyspark_kafscale
from pyspark.sql.datasource import CaseInsensitiveDict
options = {
    "cluster": "c1",
    "storage.kind": "local",
    "storage.local_dir": sys.argv[1],
    "etcd.endpoints": "http://127.0.0.1:1",
    "subscribe": "orders",
}
source = pyspark_kafscale.DefaultSource(CaseInsensitiveDict(options))
source.schema()
stages["resolve"] = sorted(sys.modules)

from harness.spark import plan_as_spark_does
payload = plan_as_spark_does(source, streaming=True)
batch_source = pyspark_kafscale.DefaultSource(CaseInsensitiveDict(options))
batch_source.reader(batch_source.schema())  # a batch query's reader, before it plans from etcd
stages["planner"] = sorted(sys.modules)  # the same process: what it resolved, then planned
Path(sys.argv[1], "payload").write_bytes(payload)
print(json.dumps(stages))
"""

_EXECUTOR = """
import json, sys
from pathlib import Path

before = set(sys.modules)
from harness.batches import make_batch
from kafscale.broker.metadata import keys
from kafscale.broker.storage.segments import encode_segment
from kafscale.pipeline.planning import ReadTask, SegmentObject
test_only = set(sys.modules) - before  # what this script imports to write a segment

from harness.spark import run_as_executors_do
from kafscale.pipeline.source import TaskPartition
segment = encode_segment([make_batch(0, [b"a", b"b"])], 0, 4096)
key = keys.segment_object_key("c1", "orders", "id-1", 0, 0, 1)
path = Path(sys.argv[1], key)
path.parent.mkdir(parents=True)
path.write_bytes(segment.segment)
task = ReadTask("orders", "id-1", 0, 0, 2, (SegmentObject(0, 1, len(segment.segment)),))
payload = Path(sys.argv[1], "payload").read_bytes()
(batch,) = run_as_executors_do(payload, [TaskPartition(task)])
assert batch.column("value").to_pylist() == [b"a", b"b"], batch
print(json.dumps({"executor": sorted(set(sys.modules) - test_only)}))
"""


def _run(script: str, directory: Path) -> dict[str, set[str]]:
    environ = {k: v for k, v in os.environ.items() if not k.upper().startswith("KAFSCALE_")}
    tests = str(Path(__file__).parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(
        [tests, *environ.get("PYTHONPATH", "").split(os.pathsep)]
    )
    done = children.run(
        [sys.executable, "-c", script, str(directory)],
        env=child_env(environ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {stage: set(modules) for stage, modules in json.loads(done.stdout).items()}


def test_each_spark_process_of_the_source_imports_only_what_it_uses(tmp_path: Path) -> None:
    imported = _run(_SCRIPT, tmp_path) | _run(_EXECUTOR, tmp_path)
    found = {
        stage: sorted(name for name in names if name in imported[stage])
        for stage, names in NOT_IMPORTED.items()
    }
    assert found == {"resolve": [], "planner": [], "executor": []}
    assert "kafscale.pipeline.source" in imported["resolve"]  # the stages did their work
    assert "kafscale.pipeline.readers" in imported["planner"]
    assert "kafscale.pipeline.fetch" in imported["executor"]
