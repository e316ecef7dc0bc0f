"""What the cluster view's etcd watch and start-up read cost a broker that only follows them.

Every broker (and proxy) keeps a ``ClusterView`` (``broker/metadata/cluster.py``): a read of
the cluster's keys at start-up and a watch afterwards. This bench measures two costs of it:

* **watch events under offset commits.** Two brokers; ``--consumers`` (4) confluent-kafka
  consumers of as many groups, all coordinated by one broker (``assign``, no subscription),
  commit one partition's offset at ``--rates`` (500, 2000) commits/s in all for
  ``--duration`` (15 s) each, asynchronously (a group's commits are written one after another,
  so one group alone does not reach these rates here). The other broker receives nothing but
  watch events: its CPU seconds per second over the run (``/proc/<pid>/stat``) are the cost of
  following commits it has no use for. Printed with the same figure when nothing is committed
  (``idle``), the commits etcd applied per second (its revision's growth: one per
  OffsetCommit) and the coordinator's CPU for scale.
* **start-up with many stored groups.** ``--groups`` (20,000) groups with ``--offsets`` (5)
  committed offsets and a metadata document each are written straight to etcd with the
  product's own keys and encoders (``keys.group_offset_key``, ``groups.store.encode_offset``,
  ``encode_group``); then a new broker is started and timed from spawn until ``/readyz``, with
  its peak RSS (``VmHWM``) and CPU at that moment; the same for a broker started before those
  groups were written, for comparison.

Run from the repository root: ``.venv/bin/python bench/view_watch_cost.py``. To measure
another tree's code, run it with ``PYTHONPATH=<that tree>/src`` (the brokers it starts import
``kafscale`` from there too). Figures: docs/architecture.md ("What the cluster view reads").
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from _cluster import Stack, cpu_seconds, create_topic
from confluent_kafka import Consumer, TopicPartition

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.store import CommittedOffset, encode_group, encode_offset
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import put_op

TOPIC = "commits"
GROUP = "view-bench"


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _revision(url: str) -> int:
    etcd = await Etcd.connect([url], 10.0)
    try:
        return await etcd.revision()
    finally:
        await etcd.close()


async def _coordinator_ids(url: str, cluster: str, groups: list[str]) -> list[int]:
    etcd = await Etcd.connect([url], 10.0)
    try:
        found = [await etcd.get(keys.group_lease_key(cluster, group)) for group in groups]
        return [-1 if kv is None else int(kv.value) for kv in found]
    finally:
        await etcd.close()


async def _write_groups(url: str, cluster: str, groups: int, offsets: int) -> float:
    """Store ``groups`` groups of ``offsets`` committed offsets and an Empty metadata document
    each, 100 keys per transaction, 16 transactions at a time; returns the seconds taken."""
    etcd = await Etcd.connect([url], 30.0)
    began = time.monotonic()
    record = encode_group(GroupRecord("consumer", 3, "range", None, (), empty_since_ms=1))
    now_ms = int(time.time() * 1000)
    ops = []
    for g in range(groups):
        group = f"stored-group-{g:06d}"
        ops.append(put_op(keys.group_metadata_key(cluster, group), record))
        for p in range(offsets):
            value = encode_offset(CommittedOffset(1000 + p, 0, "", now_ms, "a" * 22))
            ops.append(put_op(keys.group_offset_key(cluster, group, f"topic-{p}", p), value))
    chunks = [ops[i : i + 100] for i in range(0, len(ops), 100)]
    limit = asyncio.Semaphore(16)

    async def write(chunk: list) -> None:  # type: ignore[type-arg]
        async with limit:
            await etcd.txn([], chunk)

    try:
        await asyncio.gather(*(write(chunk) for chunk in chunks))
    finally:
        await etcd.close()
    return time.monotonic() - began


def _consumer(bootstrap: str, group: str) -> Consumer:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(4)])
    return consumer


def _consumers_of_one_coordinator(
    stack: Stack, broker: BrokerProcess, count: int
) -> tuple[list[Consumer], int]:
    """``count`` consumers of distinct groups coordinated by one broker (found by committing
    once in each of 4 * ``count`` groups), and that broker's id."""
    groups = [f"{GROUP}-{i}" for i in range(4 * count)]
    consumers = [_consumer(broker.bootstrap, group) for group in groups]
    for consumer in consumers:
        consumer.commit(offsets=[TopicPartition(TOPIC, 0, 0)], asynchronous=False)
    owners = asyncio.run(_coordinator_ids(stack.etcd_url, stack.cluster, groups))
    chosen = max(set(owners), key=owners.count)
    kept = [c for c, owner in zip(consumers, owners, strict=True) if owner == chosen][:count]
    for consumer in consumers:
        if consumer not in kept:
            consumer.close()
    return kept, chosen


def _timed_start(stack: Stack) -> tuple[BrokerProcess, float]:
    began = time.monotonic()
    broker = stack.start_broker()
    return broker, time.monotonic() - began


def _cpu_rate(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


def _commit_run(
    stack: Stack, consumers: list[Consumer], rate: int, duration_s: float, pids: tuple[int, int]
) -> tuple[float, float, float]:
    """Commit at ``rate``/s for ``duration_s``: (commits applied/s, coordinator CPU/s, other
    broker CPU/s)."""
    revision_before = asyncio.run(_revision(stack.etcd_url))
    cpu_before = [cpu_seconds(pid) for pid in pids]
    began = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - began) < duration_s:
        due = int(elapsed * rate) + 1
        while sent < due:
            sent += 1
            offsets = [TopicPartition(TOPIC, sent % 4, sent)]
            consumers[sent % len(consumers)].commit(offsets=offsets, asynchronous=True)
        for consumer in consumers:
            consumer.poll(0)
        time.sleep(0.001)
    elapsed = time.monotonic() - began
    used = [cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
    cpu = [seconds / elapsed for seconds in used]
    applied = (asyncio.run(_revision(stack.etcd_url)) - revision_before) / elapsed
    return applied, cpu[0], cpu[1]


def _commit_phase(stack: Stack, args: argparse.Namespace) -> None:
    first, second = stack.brokers[0], stack.brokers[1]
    create_topic(first.bootstrap, TOPIC, 4)
    # Several groups, all coordinated by one broker: a group's commits are written one after
    # another (one etcd transaction each), so one group alone cannot go fast.
    consumers, coordinator_id = _consumers_of_one_coordinator(stack, first, args.consumers)
    coordinator, other = (first, second) if first.node_id == coordinator_id else (second, first)
    print(f"{len(consumers)} groups, coordinator broker {coordinator.node_id}", end="")
    print(f", other {other.node_id}")

    print("\n== offset commits: CPU of the broker that only follows the watch ==")
    header = f"{'commits/s asked':>16} {'applied/s':>10} {'coordinator CPU':>16}"
    print(f"{header} {'other CPU':>10}")
    idle = _cpu_rate(other.pid, args.duration)
    print(f"{'idle':>16} {'0':>10} {'-':>16} {idle:>9.3f}s/s")
    for rate in args.rates:
        applied, coord_cpu, other_cpu = _commit_run(
            stack, consumers, rate, args.duration, (coordinator.pid, other.pid)
        )
        print(
            f"{rate:>16} {applied:>10.0f} {coord_cpu:>14.3f}s/s {other_cpu:>9.3f}s/s"
            f"   (other minus idle: {other_cpu - idle:.3f}s/s,"
            f" {(other_cpu - idle) / max(applied, 1) * 1e6:.0f} us per commit)"
        )
    for consumer in consumers:
        consumer.close()


def _startup_phase(
    stack: Stack, args: argparse.Namespace, before: tuple[float, float, float]
) -> None:
    print("\n== start-up with stored groups ==")
    stored = args.groups * (args.offsets + 1)
    written_s = asyncio.run(_write_groups(stack.etcd_url, stack.cluster, args.groups, args.offsets))
    print(f"wrote {args.groups} groups x {args.offsets} offsets ({stored} keys)", end="")
    print(f" in {written_s:.1f} s")
    print(f"{'broker start':>34} {'spawn->ready':>13} {'CPU at ready':>13} {'peak RSS':>10}")
    print(f"{'before groups were stored':>34} {before[0]:>12.2f}s {before[1]:>12.2f}s", end="")
    print(f" {before[2]:>8.0f}MiB")
    # The first start-up of this version on a cluster an older one wrote: ``share-groups/`` is
    # filled from ``groups/`` once (``share_groups_index``); then the usual start-up.
    indexed_key = getattr(keys, "share_groups_indexed_key", None)  # absent in older trees
    if indexed_key is not None:
        asyncio.run(_delete(stack.etcd_url, indexed_key(stack.cluster)))
    for what in ("first of this version", "with the stored groups"):
        broker, start_s = _timed_start(stack)
        cpu = cpu_seconds(broker.pid)
        print(f"{what:>34} {start_s:>12.2f}s {cpu:>12.2f}s {_peak_rss_mib(broker.pid):>8.0f}MiB")
    settled = _cpu_rate(stack.brokers[-1].pid, 5.0)
    print(f"the last broker's CPU over the next 5 s: {settled:.3f}s/s")


async def _delete(url: str, key: str) -> None:
    etcd = await Etcd.connect([url], 10.0)
    try:
        await etcd.delete(key)
    finally:
        await etcd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--groups", type=int, default=20_000)
    parser.add_argument("--offsets", type=int, default=5)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--only", choices=["commits", "startup"])
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    with Stack(keep_workdir=args.keep) as stack:
        first, first_start_s = _timed_start(stack)
        before = (first_start_s, cpu_seconds(first.pid), _peak_rss_mib(first.pid))
        if args.only != "startup":
            stack.start_broker()
            _commit_phase(stack, args)
        if args.only != "commits":
            _startup_phase(stack, args, before)


if __name__ == "__main__":
    main()
