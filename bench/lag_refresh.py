"""What reporting the lag of uncoordinated groups costs: etcd reads per refresh, and CPU.

Each broker refreshes, every ``groups.lag_refresh_interval_ms`` (30 s), the committed offsets
of the stored groups whose FindCoordinator pick it is (``groups.stored_lag``), reading at most
``groups.lag_refresh_max_groups`` groups a refresh. This stores ``--groups`` groups of
``--offsets`` committed offsets each in a real etcd (single node, no fsync), then, for one
broker of ``--brokers``, prints per pass over the stored groups: refreshes, etcd reads (pages of
``PAGE_KEYS`` keys with their values), wall time of one refresh, groups kept, and the CPU a
``/metrics`` scrape spends choosing which groups it reports (``lag.reported_groups``, with
FindCoordinator's choice per group)::

    .venv/bin/python bench/lag_refresh.py --groups 1000 10000 --offsets 3 --brokers 3
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kafscale.broker.config import EtcdConnectionSettings
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
    while lag.passes < 1:
        started, started_cpu = time.perf_counter(), time.process_time()
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
        f"{groups} groups x {offsets} offsets, {brokers} brokers, cap {max_groups}: "
        f"one pass = {len(walls)} refreshes, {lag.reads} etcd reads of <= {PAGE_KEYS} keys "
        f"({lag.capped} capped); one refresh {1000 * statistics.median(walls):.0f} ms wall, "
        f"{1000 * statistics.median(refresh_cpu):.0f} ms CPU (medians); "
        f"{len(lag.offsets)} groups kept here; a scrape's choice "
        f"{1000 * statistics.median(cpu):.1f} ms CPU"
    )


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
    args = parser.parse_args()
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
