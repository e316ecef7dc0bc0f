"""Partition handoff and crash failover times, and etcd transactions per flush tick.

Starts etcd, moto's S3 server and N ``kafscale broker`` processes (default 3), creates a topic,
waits until every partition has one owner and ownership is balanced, then for R repetitions:

* planned handoff: SIGTERM the owner of a partition and time SIGTERM -> the first produce of that
  partition acknowledged (acks=all, so durable) by the new owner. The probe is a raw Kafka
  connection per surviving broker in a tight loop: Metadata from a survivor names the leader,
  the produce goes to that leader (what a client does, without a client's retry back-off);
  NOT_LEADER answers and a leader that is the leaving broker just mean "again, 2 ms later".
  Then a new broker is started to keep the count, and the bench waits for balance again;
* crash failover: the same with SIGKILL; the partition is free when the killed broker's
  session lease expires, so this is bounded by the session TTL (``--ttl``, default 4 s here,
  10 s in production).

A light background load (confluent-kafka, ``--load-rate`` records/s over all partitions) keeps
data buffered in the brokers, so a handoff includes a real flush.

Finally one broker owning ``--txn-partitions`` partitions (default 32) is loaded on every
partition and the etcd Txn RPCs are counted from etcd's Prometheus endpoint before and after, and
the partition-state commits are followed with a watch: transactions per flush tick
(elapsed / flush interval) and partitions per commit transaction.

Prints p50/p99 and the targets of issue 3. Run from the repository root::

    .venv/bin/python bench/handoff.py                     # ~2 minutes on 2 cores
    .venv/bin/python bench/handoff.py --reps 5 --ttl 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _cluster import (
    BrokerProcess,
    RawKafka,
    Stack,
    create_topic,
    make_batch,
    percentile,
    verdict,
    wait_for,
)
from _raw_connections import RawConnections

TOPIC = "handoff"
TXN_TOPIC = "flushes"
NONE, NOT_LEADER = 0, 6


@dataclass
class Handoff:
    kind: str
    partition: int
    old_node: int
    new_node: int
    seconds: float
    attempts: int
    exited_s: float = float("nan")  # signal -> the old process exited (measured in background)
    _waiter: threading.Thread | None = None


def watch_exit(handoff: Handoff, broker: BrokerProcess, began: float) -> None:
    """Note when the signalled process exits, without holding the bench up."""

    def wait() -> None:
        with contextlib.suppress(Exception):
            broker.wait(120)
            handoff.exited_s = time.perf_counter() - began

    handoff._waiter = threading.Thread(target=wait, daemon=True, name=f"exit-{broker.node_id}")
    handoff._waiter.start()


# --- ownership ----------------------------------------------------------------------------------


def owners(brokers: list[BrokerProcess], topic: str) -> dict[int, list[int]]:
    """partition -> node ids that report owning it (``/status`` of every live broker)."""
    found: dict[int, list[int]] = {}
    for broker in brokers:
        for name in broker.owned():
            t, _, p = name.rpartition("-")
            if t == topic:
                found.setdefault(int(p), []).append(broker.node_id)
    return found


def balanced(brokers: list[BrokerProcess], topic: str, partitions: int) -> bool:
    found = owners(brokers, topic)
    if sorted(found) != list(range(partitions)) or any(len(v) != 1 for v in found.values()):
        return False
    counts = [sum(1 for v in found.values() if v[0] == b.node_id) for b in brokers]
    return max(counts) - min(counts) <= 1


# --- one handoff --------------------------------------------------------------------------------


def measure_one(
    stack: Stack, probe: RawConnections, partition: int, signum: int, timeout_s: float
) -> Handoff:
    live = stack.live_brokers
    by_node = {b.node_id: b for b in live}
    owner_node = owners(live, TOPIC)[partition][0]
    owner = by_node[owner_node]
    survivors = [b for b in live if b is not owner]
    for broker in survivors:
        probe.connection(broker)  # connect before the clock starts
    batch = make_batch([b"handoff-probe"])
    attempts = 0
    began = time.perf_counter()
    owner.signal(signum)
    deadline = began + timeout_s
    turn = 0
    while time.perf_counter() < deadline:
        asked = survivors[turn % len(survivors)]
        turn += 1
        leader = probe.connection(asked).leader(TOPIC, partition)
        target = by_node.get(leader)
        if target is None or target is owner:
            time.sleep(0.002)
            continue
        attempts += 1
        code, _ = probe.connection(target).produce(TOPIC, partition, batch)
        if code == NONE:
            seconds = time.perf_counter() - began
            probe.drop(owner_node)
            handoff = Handoff(
                signal.Signals(signum).name,
                partition,
                owner_node,
                target.node_id,
                seconds,
                attempts,
            )
            watch_exit(handoff, owner, began)
            return handoff
        if code != NOT_LEADER:
            time.sleep(0.002)
    raise TimeoutError(f"partition {partition} had no new owner {timeout_s}s after the signal")


def run_handoffs(
    stack: Stack, args: argparse.Namespace, signum: int, probe: RawConnections
) -> list[Handoff]:
    results = []
    for rep in range(args.reps):
        live = stack.live_brokers
        wait_for(lambda live=live: balanced(live, TOPIC, args.partitions), 60, "balanced ownership")
        time.sleep(args.settle)
        handoff = measure_one(stack, probe, rep % args.partitions, signum, args.ttl * 3 + 30)
        results.append(handoff)
        print(
            f"   {handoff.kind} #{rep + 1}: partition {handoff.partition} "
            f"{handoff.old_node} -> {handoff.new_node} in {handoff.seconds * 1000:.0f} ms "
            f"({handoff.attempts} produce attempts)",
            flush=True,
        )
        if signum == signal.SIGKILL:
            # wait until the dead broker's registration is gone before the next round
            dead = {b.node_id for b in stack.brokers if not b.alive}
            wait_for(
                lambda dead=dead: not dead & set(_registered(stack.live_brokers)),
                30,
                "lease expiry",
            )
        stack.start_broker()
    return results


def _registered(brokers: list[BrokerProcess]) -> list[int]:
    """Node ids a live broker lists in Metadata (the etcd broker registry)."""
    conn = RawKafka(brokers[0].bootstrap, timeout_s=10)
    try:
        response = conn.request(3, 9, {"topics": [], "allow_auto_topic_creation": False})
        return [int(b.node_id) for b in response.brokers]
    finally:
        conn.close()


# --- background load ----------------------------------------------------------------------------


class Load(threading.Thread):
    """confluent-kafka producing ``rate`` records/s to every partition until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        super().__init__(daemon=True, name="load")
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.acked = 0
        self.failed = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60_000,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 0,  # brokers going away on purpose: no connection-refused noise
            }
        )

        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                self.acked += 1
            else:
                self.failed += 1

        value = os.urandom(1024)
        interval = 1.0 / self.rate
        next_at = time.perf_counter()
        sent = 0
        while not self._stop_event.is_set():
            now = time.perf_counter()
            if now < next_at:
                producer.poll(min(next_at - now, 0.01))
                continue
            next_at += interval
            with contextlib.suppress(BufferError):
                producer.produce(
                    self.topic, value=value, partition=sent % self.partitions, on_delivery=delivered
                )
                sent += 1
        producer.flush(30)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(60)


# --- etcd transactions per flush tick -----------------------------------------------------------


def txn_total(stack: Stack) -> int:
    metrics = stack.etcd_metrics()
    return int(
        sum(
            v
            for k, v in metrics.items()
            if k.startswith("grpc_server_started_total{") and 'grpc_method="Txn"' in k
        )
    )


@dataclass
class TxnResult:
    partitions: int
    seconds: float
    flush_interval_s: float
    txns: int
    idle_txns: int
    idle_seconds: float
    commit_revisions: int
    state_puts: int
    acked: int

    @property
    def ticks(self) -> float:
        return self.seconds / self.flush_interval_s

    @property
    def txns_per_tick(self) -> float:
        return self.txns / self.ticks


def watch_commits(
    stack: Stack, cluster: str
) -> tuple[subprocess.Popen[str], list[tuple[int, int]]]:
    """etcdctl watching the partition-state keys: (mod revision, 1) per changed key."""
    etcdctl = Path(str(stack.etcd.binary if stack.etcd else "etcd")).with_name("etcdctl")
    prefix = f"/kafscale/{cluster}/partitions/"
    watcher = subprocess.Popen(
        [str(etcdctl), f"--endpoints={stack.etcd_url}", "watch", "--prefix", prefix, "-w", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    events: list[tuple[int, int]] = []

    def read() -> None:
        assert watcher.stdout is not None
        for line in watcher.stdout:
            with contextlib.suppress(ValueError):
                for event in json.loads(line).get("Events", []):
                    if event.get("type", "PUT") == "PUT":
                        events.append((int(event["kv"]["mod_revision"]), 1))

    threading.Thread(target=read, daemon=True, name="etcd-watch").start()
    return watcher, events


def measure_txns(stack: Stack, args: argparse.Namespace) -> TxnResult:
    cluster = "txn"
    broker = stack.start_broker(cluster=cluster)
    create_topic(broker.bootstrap, TXN_TOPIC, args.txn_partitions)
    wait_for(
        lambda: len(owners([broker], TXN_TOPIC)) == args.txn_partitions, 30, "all partitions owned"
    )
    time.sleep(1.0)
    idle0, t_idle = txn_total(stack), time.perf_counter()
    time.sleep(2.0)
    idle_txns, idle_seconds = txn_total(stack) - idle0, time.perf_counter() - t_idle
    load = Load(broker.bootstrap, TXN_TOPIC, args.txn_partitions, args.txn_rate)
    load.start()
    time.sleep(2.0)  # warm-up: connections, metadata, first flushes
    watcher, events = watch_commits(stack, cluster)
    time.sleep(0.5)
    start_events = len(events)
    txn0, began = txn_total(stack), time.perf_counter()
    time.sleep(args.txn_duration)
    txns, seconds = txn_total(stack) - txn0, time.perf_counter() - began
    window = events[start_events:]
    load.stop()
    watcher.terminate()
    watcher.wait(5)
    broker.signal(signal.SIGTERM)
    broker.wait(30)
    return TxnResult(
        partitions=args.txn_partitions,
        seconds=seconds,
        flush_interval_s=args.flush_interval_ms / 1000,
        txns=txns,
        idle_txns=idle_txns,
        idle_seconds=idle_seconds,
        commit_revisions=len({rev for rev, _ in window}),
        state_puts=len(window),
        acked=load.acked,
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--reps", type=int, default=10, help="repetitions per kind (SIGTERM, SIGKILL)")
    p.add_argument("--ttl", type=int, default=4, help="broker session TTL, s (production: 10)")
    p.add_argument("--flush-interval-ms", type=int, default=100)
    p.add_argument("--load-rate", type=float, default=300.0, help="background records/s (0: off)")
    p.add_argument("--settle", type=float, default=0.3, help="pause after balance, s")
    p.add_argument("--txn-partitions", type=int, default=32)
    p.add_argument("--txn-rate", type=float, default=1000.0, help="records/s over all partitions")
    p.add_argument("--txn-duration", type=float, default=10.0)
    p.add_argument("--skip", choices=["sigterm", "sigkill", "txn"], action="append", default=[])
    p.add_argument(
        "--broker-env", action="append", default=[], metavar="KAFSCALE_X=V", help="repeatable"
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs) at the end")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = {
        "KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": str(args.flush_interval_ms),
        "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "10",
    }
    for item in args.broker_env:
        name, _, value = item.partition("=")
        env[name] = value
    planned: list[Handoff] = []
    crashes: list[Handoff] = []
    txn: TxnResult | None = None
    began = time.perf_counter()
    with Stack(cluster="handoff", broker_env=env, keep_workdir=args.keep) as stack:
        print(f"work dir {stack.workdir}; load average {os.getloadavg()[0]:.2f}", flush=True)
        if not {"sigterm", "sigkill"} <= set(args.skip):
            for _ in range(args.brokers):
                stack.start_broker()
            create_topic(stack.live_brokers[0].bootstrap, TOPIC, args.partitions)
            load = None
            if args.load_rate:
                bootstrap = ",".join(b.bootstrap for b in stack.live_brokers)
                load = Load(bootstrap, TOPIC, args.partitions, args.load_rate)
                load.start()
            probe = RawConnections(timeout_s=30)
            try:
                if "sigterm" not in args.skip:
                    print("planned handoff (SIGTERM) ...", flush=True)
                    planned = run_handoffs(stack, args, signal.SIGTERM, probe)
                if "sigkill" not in args.skip:
                    print(f"crash failover (SIGKILL, session TTL {args.ttl} s) ...", flush=True)
                    crashes = run_handoffs(stack, args, signal.SIGKILL, probe)
            finally:
                probe.close()
                if load is not None:
                    load.stop()
                    print(f"   background load: {load.acked} acked, {load.failed} failed")
            for broker in stack.live_brokers:
                broker.signal(signal.SIGTERM)
            for broker in stack.brokers:
                with contextlib.suppress(Exception):
                    broker.wait(30)
        if "txn" not in args.skip:
            print(
                f"etcd txns: 1 broker, {args.txn_partitions} partitions, {args.txn_rate:.0f} "
                f"records/s, {args.txn_duration:.0f} s ...",
                flush=True,
            )
            txn = measure_txns(stack, args)
        load_end = os.getloadavg()[0]
    report(args, planned, crashes, txn, time.perf_counter() - began, load_end)
    return 0


def report(
    args: argparse.Namespace,
    planned: list[Handoff],
    crashes: list[Handoff],
    txn: TxnResult | None,
    wall: float,
    load_end: float,
) -> None:
    ms = 1000.0
    print()
    print(
        f"kafscale handoff bench: {args.brokers} brokers, {args.partitions} partitions, "
        f"session TTL {args.ttl} s, flush interval {args.flush_interval_ms} ms, background "
        f"load {args.load_rate:.0f} records/s, {os.cpu_count()} CPUs, {wall:.0f} s wall, "
        f"load average {load_end:.2f}"
    )
    print()
    print(f"   {'kind':<30}{'n':>4}{'p50 ms':>9}{'p99 ms':>9}{'min ms':>9}{'max ms':>9}")
    for label, rows in (
        ("planned handoff (SIGTERM)", planned),
        ("crash failover (SIGKILL)", crashes),
    ):
        if rows:
            values = [r.seconds for r in rows]
            print(
                f"   {label:<30}{len(rows):>4}{percentile(values, 50) * ms:>9.0f}"
                f"{percentile(values, 99) * ms:>9.0f}{min(values) * ms:>9.0f}"
                f"{max(values) * ms:>9.0f}"
            )
    for r in (*planned, *crashes):
        if r._waiter is not None:
            r._waiter.join(60)
    if planned:
        exits = [r.exited_s for r in planned if r.exited_s == r.exited_s]
        if exits:
            print(
                f"   (SIGTERM -> old broker process exited: p50 {percentile(exits, 50) * ms:.0f} "
                f"ms, max {max(exits) * ms:.0f} ms; the handoff itself is done long before)"
            )
    if txn is not None:
        print()
        print(
            f"   etcd txns: {txn.txns} Txn RPCs in {txn.seconds:.1f} s = {txn.ticks:.0f} flush "
            f"ticks of {txn.flush_interval_s * ms:.0f} ms -> {txn.txns_per_tick:.2f} txn per tick "
            f"(1 broker, {txn.partitions} partitions, {txn.acked} records acked)"
        )
        print(
            f"   partition-state commits seen by a watch: {txn.state_puts} key updates in "
            f"{txn.commit_revisions} revisions -> "
            f"{txn.state_puts / max(txn.commit_revisions, 1):.1f} partitions per commit txn; "
            f"idle broker: {txn.idle_txns} txns in {txn.idle_seconds:.1f} s"
        )
    print()
    print("targets (issue 3)")
    if planned:
        p99 = percentile([r.seconds for r in planned], 99)
        print(f"   {verdict(p99 <= 1.0)}  planned handoff p99 <= 1 s{'':<18}{p99 * ms:.0f} ms")
    if crashes:
        worst = max(r.seconds for r in crashes)
        budget = args.ttl + 1.0
        print(
            f"   {verdict(worst <= budget)}  crash failover <= TTL + 1 s (max of {len(crashes)})"
            f"{'':<4}{worst * ms:.0f} ms vs {budget * ms:.0f} ms"
        )
    if txn is not None:
        print(
            f"   {verdict(txn.txns_per_tick <= 1.0)}  <= 1 etcd txn per flush tick per broker"
            f"{'':<5}{txn.txns_per_tick:.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
