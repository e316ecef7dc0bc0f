"""What reporting the lag of uncoordinated groups costs: etcd reads per refresh, and CPU.

Each broker refreshes, every ``groups.lag_refresh_interval_ms`` (30 s), the committed offsets
of the stored groups whose FindCoordinator pick it is (``groups.stored_lag``), reading at most
``groups.lag_refresh_max_groups`` groups a refresh. This stores ``--groups`` groups of
``--offsets`` committed offsets each in a real etcd (single node, no fsync), then, for one
broker of ``--brokers``, prints per pass over the stored groups: refreshes, etcd reads (pages of
``PAGE_KEYS`` keys with their values), wall time of one refresh, groups kept, and the CPU a
``/metrics`` scrape spends choosing which groups it reports (``lag.reported_groups``, with
FindCoordinator's choice per group), and how long the refresh holds the event loop at a time:
a probe task that only yields (``asyncio.sleep(0)``) runs beside it and records each wait for
its next turn (wall and the loop thread's CPU time), the longest step anything else on the loop
(requests, scrapes) waits::

    .venv/bin/python bench/lag_refresh.py --groups 1000 10000 --offsets 3 --brokers 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from kafscale.broker.config import EtcdConnectionSettings
from kafscale.broker.groups import store
from kafscale.broker.groups.leases import choose_coordinator, coordinator_chooser
from kafscale.broker.groups.store import PAGE_KEYS, CommittedOffset, GroupStore, encode_offset
from kafscale.broker.groups.stored_lag import StoredLag
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_connect import connect_etcd
from kafscale.broker.metadata.etcd_txn import put_op
from kafscale.broker.observability.lag import reported_groups

OPS_PER_TXN = 100


async def _store_groups(etcd: Etcd, cluster: str, groups: int, offsets: int) -> None:
    value = encode_offset(CommittedOffset(5, commit_timestamp_ms=1))
    ops = [
        put_op(keys.group_offset_key(cluster, f"group-{index:07d}", "orders", p), value)
        for index in range(groups)
        for p in range(offsets)
    ]
    chunks = [ops[i : i + OPS_PER_TXN] for i in range(0, len(ops), OPS_PER_TXN)]
    for start in range(0, len(chunks), 16):
        await asyncio.gather(*(etcd.txn([], chunk) for chunk in chunks[start : start + 16]))


async def _measure(etcd: Etcd, groups: int, offsets: int, brokers: int, max_groups: int) -> None:
    cluster = f"lagbench-{groups}-{offsets}"
    await _store_groups(etcd, cluster, groups, offsets)
    live = list(range(1, brokers + 1))

    def picked_here(group_id: str) -> bool:
        return choose_coordinator(group_id, None, live) == 1

    lag = StoredLag(GroupStore(etcd, cluster), picked_here, 3600, max_groups)
    walls: list[float] = []
    refresh_cpu: list[float] = []
    held: list[float] = []
    held_cpu: list[float] = []
    while lag.passes < 1:
        started, started_cpu = time.perf_counter(), time.process_time()
        async with _loop_probe(held, held_cpu):
            await lag.refresh()
        walls.append(time.perf_counter() - started)
        refresh_cpu.append(time.process_time() - started_cpu)
    cpu = []
    for _ in range(5):
        started = time.process_time()
        choose = coordinator_chooser(live)  # as GroupCoordinator.lag_offsets does
        reported_groups(1, {}, lag.offsets, functools.partial(choose, holder=None))
        cpu.append(time.process_time() - started)
    print(
        f"{groups} groups x {offsets} offsets, {brokers} brokers, cap {max_groups}, "
        f"{store.DECODE_CHUNK_KEYS} keys decoded between yields: "
        f"one pass = {len(walls)} refreshes, {lag.reads} etcd reads of <= {PAGE_KEYS} keys "
        f"({lag.capped} capped); one refresh {1000 * statistics.median(walls):.0f} ms wall, "
        f"{1000 * statistics.median(refresh_cpu):.0f} ms CPU (medians); "
        f"{len(lag.offsets)} groups kept here; a scrape's choice "
        f"{1000 * statistics.median(cpu):.1f} ms CPU"
    )
    for kind, figures in (("CPU", held_cpu), ("wall", held)):
        figures.sort()
        print(
            f"  the refresh held the event loop for at most {1000 * figures[-1]:.1f} ms {kind} "
            f"at a time (p99 {1000 * figures[int(0.99 * (len(figures) - 1))]:.2f} ms; "
            f"{sum(h > 0.005 for h in figures)} of {len(figures)} turns over 5 ms; the "
            f"longest: {', '.join(f'{1000 * h:.1f}' for h in figures[-5:])} ms)"
        )


@contextlib.asynccontextmanager
async def _loop_probe(held: list[float], held_cpu: list[float]) -> AsyncIterator[None]:
    """Record how long each turn of a task that only yields waited for the next: how long the
    code under the ``with`` kept the event loop from everything else at a time, in wall time
    (``held``: includes the OS running other processes, high on a busy machine) and in the
    loop thread's CPU time (``held_cpu``: the refresh's own work)."""

    async def probe() -> None:
        while True:
            started, started_cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0)
            held.append(time.perf_counter() - started)
            held_cpu.append(time.thread_time() - started_cpu)

    task = asyncio.create_task(probe())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _run(args: argparse.Namespace, url: str) -> None:
    etcd = await connect_etcd(EtcdConnectionSettings(endpoints=(url,), timeout_s=30))
    try:
        for groups in args.groups:
            await _measure(etcd, groups, args.offsets, args.brokers, args.max_groups)
    finally:
        await etcd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--offsets", type=int, default=3, help="committed offsets per group")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--max-groups", type=int, default=10_000, help="the refresh cap")
    parser.add_argument(
        "--decode-chunk-keys",
        type=int,
        default=store.DECODE_CHUNK_KEYS,
        help=f"keys decoded between yields to the loop ({PAGE_KEYS}: a page at once, as before)",
    )
    args = parser.parse_args()
    store.DECODE_CHUNK_KEYS = args.decode_chunk_keys
    workdir = Path(tempfile.mkdtemp(prefix="kafscale-lagbench-"))
    etcd = EmbeddedEtcd(workdir / "etcd", fast=True, no_fsync=True, die_with_parent=True)
    etcd.start()
    try:
        asyncio.run(_run(args, etcd.client_url))
    finally:
        etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
