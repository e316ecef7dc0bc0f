"""How much a ``kafscale`` process costs to start: import time, and a broker's time to ready.

Every pod restart, HPA scale-out and ``kafscale <command>`` pays the import; the test suite
starts ~310 brokers and ~40 proxies. This bench measures, ``--runs`` times each (median, min):

* ``import``: a fresh ``python -c "import kafscale.broker.cli, kafscale.broker.app"``, what
  ``kafscale broker`` imports (wall and CPU);
* ``help``: ``kafscale --help`` (what every CLI command pays before it does anything);
* ``broker``: ``kafscale broker`` against a single-node etcd (``EmbeddedEtcd``, fast, no fsync)
  and a local object directory, from spawn until ``/readyz`` answers 200: wall, and the
  broker's CPU (user + system from ``/proc/<pid>/stat``) at that moment; then SIGTERM;
* ``proxy``: ``kafscale proxy`` against the same etcd, spawn until ``/readyz``;
* ``spark``: a fresh ``python -c "import kafscale.pipeline.source"`` (``source``), what every
  Python process Spark starts for the data source imports (the processes compete for the
  cores while Spark waits at most 10 s for each new one to connect back); what a batch
  query's planner imports before it reads etcd (``planner``) and an executor's worker before
  its first rows (``executor``); and ``pyspark``, pyspark's data source API alone, the floor.
  ``--compare-src DIR`` measures the same from another tree too (``old-...``; ``DIR`` is its
  ``src``, e.g. of ``git archive main | tar -x -C /tmp/old``), run for run alternating with
  this tree's, so that old and new meet the same load. It does so for ``broker`` too
  (``old-broker``). Compile that tree's bytecode first (``python -m compileall -q
  /tmp/old/broker``): with ``PYTHONDONTWRITEBYTECODE`` set, an extracted tree is compiled
  again by every process, ~0.5 s of CPU per broker start.

Children start with ``child_env`` (no Hypothesis, as the test harness starts them). CPU is the
figure that matters on a busy machine; wall time includes waiting for the two cores. Run from
the repository root: ``.venv/bin/python bench/startup.py [--runs 7]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from kafscale.broker.child_process import KAFSCALE, BrokerProcess, child_env, free_port_run
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_once(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child run to completion."""
    cpu_before = _children_cpu_s()
    began = time.monotonic()
    subprocess.run(command, env=child_env(os.environ), check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began, _children_cpu_s() - cpu_before


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


def _ready(admin_port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{admin_port}/readyz"
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _start_until_ready(
    command: list[str], env: dict[str, str], admin_port: int
) -> tuple[float, float]:
    """Spawn ``command``, poll ``/readyz`` every 10 ms; wall and CPU at ready; then SIGTERM."""
    began = time.monotonic()
    process = subprocess.Popen(
        command, env=child_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = began + 60
        while not _ready(admin_port):
            if process.poll() is not None:
                raise RuntimeError(f"{command} exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{command} not ready in 60 s")
            time.sleep(0.01)
        return time.monotonic() - began, _process_cpu_s(process.pid)
    finally:
        process.terminate()
        process.wait(30)


def _service_env(
    etcd_url: str, data: Path, cluster: str, port: int, admin_port: int
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    return {
        **env,
        "KAFSCALE_CLUSTER": cluster,
        "KAFSCALE_ETCD__ENDPOINTS": json.dumps([etcd_url]),
        "KAFSCALE_STORAGE__KIND": "local",
        "KAFSCALE_STORAGE__LOCAL_DIR": str(data / "objects"),
        "KAFSCALE_LISTENER__HOST": "127.0.0.1",
        "KAFSCALE_LISTENER__PORT": str(port),
        "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
        "KAFSCALE_LOG_LEVEL": "WARNING",
    }


def _report(name: str, samples: list[tuple[float, float]]) -> None:
    walls = [w for w, _ in samples]
    cpus = [c for _, c in samples]
    print(
        f"{name:<12} wall median {statistics.median(walls):6.3f} s  min {min(walls):6.3f} s   "
        f"CPU median {statistics.median(cpus):6.3f} s  min {min(cpus):6.3f} s   (n={len(samples)})"
    )


def _measure(runs: int, once: Callable[[int], tuple[float, float]]) -> list[tuple[float, float]]:
    once(-1)  # warm the page cache and the bytecode cache; not scored
    return [once(i) for i in range(runs)]


_PYSPARK_API = "import pyspark.sql.datasource, pyspark.sql.streaming.datasource, pyspark.sql.types"
# What a process imports of ours: any (the source), a batch query's planner (the reader it
# makes before it reads etcd), an executor's worker (its first task's reading code).
_SPARK_IMPORTS = {
    "source": "import kafscale.pipeline.source",
    "planner": "from kafscale.pipeline.source import KafScaleDataSource as S\n"
    "from pyspark.sql.datasource import CaseInsensitiveDict as D\n"
    "s = S(D({'subscribe': 't'}))\n"
    "s.reader(s.schema())",
    "executor": "import kafscale.pipeline.source, kafscale.pipeline.fetch",
}


def _import_once(code: str, src: str | None = None) -> tuple[float, float]:
    """Wall and CPU seconds of a fresh interpreter running ``code`` (without ``KAFSCALE_*``
    variables); ``src`` first on its path (another tree's ``kafscale``)."""
    env = {k: v for k, v in child_env(os.environ).items() if not k.upper().startswith("KAFSCALE_")}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    cpu_before = _children_cpu_s()
    began = time.monotonic()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - began, _children_cpu_s() - cpu_before


def _measure_spark(runs: int, compare_src: str | None) -> None:
    """pyspark's data source API alone, then each of ``_SPARK_IMPORTS`` from this tree and (as
    ``old-...``) from ``compare_src``: all interleaved, run after run."""
    candidates: dict[str, tuple[str, str | None]] = {"pyspark": (_PYSPARK_API, None)}
    for name, code in _SPARK_IMPORTS.items():
        candidates[name] = (code, None)
        if compare_src is not None:
            candidates[f"old-{name}"] = (code, compare_src)
    for code, src in candidates.values():
        _import_once(code, src)  # warm the page and bytecode caches; not scored
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    for _ in range(runs):
        for name, (code, src) in candidates.items():
            figures[name].append(_import_once(code, src))
    for name, samples in figures.items():
        _report(name, samples)


def _broker_once(
    etcd: EmbeddedEtcd, data: Path, src: str | None = None
) -> Callable[[int], tuple[float, float]]:
    """One broker start; ``src`` first on its path (another tree's ``kafscale``)."""
    tag = "old-" if src else ""

    def once(i: int) -> tuple[float, float]:
        port = free_port_run(2)  # Kafka, admin
        env = _service_env(etcd.client_url, data, f"c-{tag}broker{i}", port, port + 1)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
        return _start_until_ready([KAFSCALE, "broker"], env, port + 1)

    return once


def _measure_brokers(runs: int, etcd: EmbeddedEtcd, data: Path, compare_src: str | None) -> None:
    """Broker starts of this tree and (as ``old-broker``) of ``compare_src``, alternating start
    after start so that both meet the same load."""
    trees: dict[str, str | None] = {"broker": None}
    if compare_src is not None:
        trees["old-broker"] = compare_src
    starts = {name: _broker_once(etcd, data, src) for name, src in trees.items()}
    for once in starts.values():
        once(-1)  # warm the page and bytecode caches; not scored
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in starts}
    for i in range(runs):
        for name, once in starts.items():
            figures[name].append(once(i))
    for name, samples in figures.items():
        _report(name, samples)


def _measure_proxy(runs: int, etcd: EmbeddedEtcd, data: Path) -> list[tuple[float, float]]:
    """Proxies in front of one broker: a proxy is ready once it sees a live broker."""
    port = free_port_run(2)
    env = _service_env(etcd.client_url, data, "c-proxy", port, port + 1)
    broker = BrokerProcess(env, data / "proxy-broker.log", port, port + 1).start(timeout_s=60)
    try:

        def once(_: int) -> tuple[float, float]:
            port = free_port_run(2)
            env = _service_env(etcd.client_url, data, "c-proxy", port, port + 1)
            return _start_until_ready([KAFSCALE, "proxy"], env, port + 1)

        return _measure(runs, once)
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per figure (median printed)")
    parser.add_argument(
        "--only",
        choices=["import", "help", "broker", "proxy", "spark"],
        action="append",
        help="repeatable",
    )
    parser.add_argument(
        "--compare-src",
        help="spark and broker: also measure the tree of this src directory (an older "
        "checkout), alternating with this one's",
    )
    args = parser.parse_args()
    only = set(args.only or ["import", "help", "broker", "proxy", "spark"])
    print(f"load average before: {os.getloadavg()}")
    if "import" in only:
        # What ``kafscale broker`` imports (the CLI imports the broker only to run one).
        command = [sys.executable, "-c", "import kafscale.broker.cli, kafscale.broker.app"]
        _report("import", _measure(args.runs, lambda _: _run_once(command)))
    if "help" in only:
        _report("help", _measure(args.runs, lambda _: _run_once([KAFSCALE, "--help"])))
    if "spark" in only:
        _measure_spark(args.runs, args.compare_src)
    if only & {"broker", "proxy"}:
        with (
            tempfile.TemporaryDirectory(prefix="kafscale-startup-") as tmp,
            EmbeddedEtcd(Path(tmp) / "etcd", fast=True, no_fsync=True) as etcd,
        ):
            if "broker" in only:
                _measure_brokers(args.runs, etcd, Path(tmp), args.compare_src)
            if "proxy" in only:
                _report("proxy", _measure_proxy(args.runs, etcd, Path(tmp)))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
