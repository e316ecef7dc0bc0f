"""The Spark lines ``kafscale local``'s banner prints work as pasted, by a user whose virtual
environment is not activated (``.venv/bin/kafscale local``, ``.venv/bin/python job.py``, as the
README runs them): Spark then starts plain ``python3`` to find data sources unless
``PYSPARK_PYTHON`` says otherwise, and the system's Python has no ``pyspark_kafscale``."""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import children
from harness.java_client import JVM_FLAGS
from harness.local_mode import start_local, stop_with_ctrl_c
from harness.ports import free_port_run

# A SparkSession of its own on two loaded cores: minutes, at worst.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def banner_spark_lines(banner: str) -> tuple[dict[str, str], str]:
    """The banner's ``export NAME=value`` lines and its Python snippet, as a user copies them."""
    lines = banner[banner.index("Spark (pip install") :].splitlines()[1:]
    exports: dict[str, str] = {}
    python: list[str] = []
    for line in lines:
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            name, _, value = words[1].partition("=")
            exports[name] = value
        elif line.strip():
            python.append(line)
            if line.rstrip().endswith(".load())"):
                break
    return exports, textwrap.dedent("\n".join(python))


def user_environment(exports: dict[str, str]) -> dict[str, str]:
    """A shell without the test run's Spark settings, the venv not on PATH, plus ``exports``."""
    venv_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KAFSCALE_", "PYSPARK_")) and k != "VIRTUAL_ENV"
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    return env | {"SPARK_LOCAL_IP": "127.0.0.1"} | exports


def test_the_banners_spark_snippet_reads_the_topic_from_a_venv_not_activated(
    tmp_path: Path,
) -> None:
    log = tmp_path / "local.log"
    port = free_port_run(1)
    process = start_local(tmp_path / "data", port, brokers=1, log=log)
    try:
        producer = Producer({"bootstrap.servers": f"localhost:{port}"})
        for i in range(5):
            producer.produce("my-topic", value=b"v%d" % i)
        assert producer.flush(30) == 0
        exports, snippet = banner_spark_lines(log.read_text())
        job = tmp_path / "job.py"
        job.write_text(
            "from pyspark.sql import SparkSession\n"
            'spark = (SparkSession.builder.master("local[1]")'
            '.config("spark.ui.enabled", "false")'
            '.config("spark.driver.host", "127.0.0.1")'
            f'.config("spark.driver.extraJavaOptions", "{" ".join(JVM_FLAGS)}").getOrCreate())\n'
            f"{snippet}\n"
            'print("values", sorted(r.value.decode() for r in df.collect()))\n'
            "spark.stop()\n"
        )
        done = children.run(
            [sys.executable, str(job)],
            env=user_environment(exports),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        assert stop_with_ctrl_c(process) == 0
    errors = [line for line in done.stderr.splitlines() if "Exception" in line]
    assert done.returncode == 0, "\n".join([log.read_text(), done.stdout, *errors[:5]])
    assert "values ['v0', 'v1', 'v2', 'v3', 'v4']" in done.stdout, done.stdout
