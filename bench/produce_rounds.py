"""Broker CPU per flush round and per produce request (issue 23, third and fourth rounds).

Runs the two steps of ``ack_latency.py`` whose cost is per round rather than per byte (the Java
client on its defaults, confluent-kafka paced at 1,000 records/s) against one ``kafscale
broker`` on a local directory, exactly as that bench runs them, and prints for each: the
broker's CPU per etcd transaction (one per flush round) and per Produce request, split into the
event loop's thread and the rest (the store's worker threads, gRPC's), from ``/proc``. On a
shared machine the rates move 2-3x between runs; CPU per round moves far less, so two versions
of the broker are compared by running this alternately against each (``PYTHONPATH`` pointing at
an exported tree of the other version's ``src``: ``kafscale.broker`` is found there first).
It also prints, from the broker's own histograms, the mean time of a Produce request, a flush
round, a PUT and an etcd transaction over the step (where a request's wait goes), and each
other thread's CPU per round; ``--broker-env`` tries a setting (a coalescing window, say).

    .venv/bin/python bench/produce_rounds.py --reps 3
    .venv/bin/python bench/produce_rounds.py --steps java --profile /tmp/prof   # py-spy --gil
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import ack_latency as bench

PACED_RATE = 1000


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds so far per thread group: the event loop's (the main thread) and the others
    by name (worker threads are named after the process)."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat.rpartition(")")[2].split()
        key = "loop" if task.name == str(pid) else f"thread:{name}"
        totals[key] = totals.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return totals


# (label printed, metric name, label selector): the broker's own histograms whose mean over a
# step says where a request's time goes (waiting for its round, the round's PUT and commit).
TIMINGS = (
    ("produce", "kafscale_request_duration_seconds", 'api="Produce"'),
    ("round", "kafscale_flush_duration_seconds", ""),
    ("put", "kafscale_object_store_request_duration_seconds", 'operation="put"'),
    ("txn", "kafscale_etcd_request_duration_seconds", 'operation="txn"'),
)


def histogram_totals(admin_url: str) -> dict[str, tuple[float, float]]:
    """(count, sum of seconds) so far of each histogram in ``TIMINGS``."""
    text = urllib.request.urlopen(admin_url + "/metrics", timeout=5).read().decode()
    totals: dict[str, tuple[float, float]] = {}
    for label, metric, selector in TIMINGS:
        count = total = 0.0
        for line in text.splitlines():
            if not line.startswith(metric) or selector not in line:
                continue
            if line.startswith(metric + "_count"):
                count += float(line.split()[-1])
            elif line.startswith(metric + "_sum"):
                total += float(line.split()[-1])
        totals[label] = (count, total)
    return totals


def mean_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    parts = []
    for label, _, _ in TIMINGS:
        count = after[label][0] - before[label][0]
        total = after[label][1] - before[label][1]
        parts.append(f"{label} {total * 1e3 / count:.1f}" if count else f"{label} -")
    return "mean ms: " + ", ".join(parts)


def run_step(
    stack: bench.Stack, target: bench.Target, name: str, work: Any, profile: Path | None
) -> None:
    spy = None
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        output = str(profile / f"{name}.txt")
        spy = subprocess.Popen(
            [
                *("py-spy", "record", "--gil", "--nonblocking", "-r", "500", "-f", "raw"),
                *("-p", str(target.broker.pid), "-o", output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
    timings_before = histogram_totals(target.broker.admin_url)
    threads_before = thread_cpu_s(target.broker.pid)
    step = bench.measure(stack, target, name, f"{name}-{time.monotonic_ns()}", work)
    threads_after = thread_cpu_s(target.broker.pid)
    timings_after = histogram_totals(target.broker.admin_url)
    requests = timings_after["produce"][0] - timings_before["produce"][0]
    if spy is not None:
        spy.send_signal(2)
        spy.wait(30)
    loop_s = threads_after.get("loop", 0.0) - threads_before.get("loop", 0.0)
    rounds = max(step.txns, 1)
    print(
        f"{'':43}per round {step.broker_cpu_s * 1e3 / rounds:.2f} ms CPU"
        f" (loop {loop_s * 1e3 / rounds:.2f}), per produce request"
        f" {step.broker_cpu_s * 1e3 / max(requests, 1):.2f} ms"
        f" (loop {loop_s * 1e3 / max(requests, 1):.2f});"
        f" {requests:.0f} requests in {step.txns} rounds",
        flush=True,
    )
    print(f"{'':43}{mean_ms(timings_before, timings_after)}", flush=True)
    others = {
        name: (seconds - threads_before.get(name, 0.0)) * 1e3 / rounds
        for name, seconds in threads_after.items()
        if name != "loop"
    }
    print(
        f"{'':43}other threads, ms CPU per round: "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(others.items()) if ms >= 0.01),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps",
        default="java,paced",
        help="java, paced (both by default) and one (send().get(), one record at a time)",
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--java-records", type=int, default=50_000)
    parser.add_argument("--paced-s", type=float, default=10.0)
    parser.add_argument("--profile", type=Path, help="py-spy --gil raw stacks per step here")
    parser.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for the broker, e.g. KAFSCALE_LOG__FLUSH_COALESCE_MS=1 (repeatable)",
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "kafscale-bench")
    parser.add_argument(
        "--workdir", type=Path, help="parent of the run's work directory (default <cache>/runs)"
    )
    args = parser.parse_args(argv)
    steps = args.steps.split(",")
    value = os.urandom(1024)
    classpath = bench.java_classpath(args.cache) if "java" in steps else ""
    parent = bench.work_parent(args.workdir, args.cache)  # not /tmp: see its docstring
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-rounds-", dir=parent))
    stack = bench.Stack(workdir, dict(item.split("=", 1) for item in args.broker_env))
    try:
        stack.start(["local"])
        target = stack.targets[0]
        print(
            f"broker pid {target.broker.pid}; load average {bench.load1():.1f}; a new file costs"
            f" {bench.file_create_us(workdir):.0f} us of CPU in {workdir}",
            flush=True,
        )
        # Unmeasured: a broker's first answers of each API load its message schemas (~0.3 s
        # of CPU), which ack_latency.py's earlier steps pay before these.
        bootstrap = target.broker.bootstrap
        bench.create_topic(bootstrap, "warm-up", bench.PARTITIONS)
        bench.produce_paced(bootstrap, "warm-up", 1.0, PACED_RATE, value)
        if classpath:
            bench.produce_java(classpath, bootstrap, "warm-up", 2_000, 1024)
        for _ in range(args.reps):
            if "java" in steps:

                def java(b: str, t: str) -> bench.Step:
                    return bench.produce_java(classpath, b, t, args.java_records, 1024)

                run_step(stack, target, "java", java, args.profile)
            if "one" in steps:

                def one(b: str, t: str) -> bench.Step:
                    return bench.produce_one_at_a_time(b, t, args.paced_s, value)

                run_step(stack, target, "one", one, args.profile)
            if "paced" in steps:

                def paced(b: str, t: str) -> bench.Step:
                    return bench.produce_paced(b, t, args.paced_s, PACED_RATE, value)

                run_step(stack, target, "paced", paced, args.profile)
    finally:
        stack.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
