"""The fault campaign: acked records survive crashed, hung and restarted brokers, a paused etcd
and a paused object store, with nothing lost, duplicated, misplaced or reordered.

Starts etcd, moto's S3 server and ``--brokers`` ``kafscale broker`` processes (default 3, each
on a port of its own that a restart keeps), creates a topic with one partition per producer,
and runs ``--producers`` idempotent confluent-kafka producers (acks=all, the default settings
of librdkafka's idempotent producer), each writing unique values ``p<producer>-<seq>`` to its
own partition at ``--rate`` records/s. Meanwhile, for ``--duration-s``, one fault at a time
every 1-4 s, chosen at random (``--seed``):

* ``kill``: SIGKILL a broker; the supervisor restarts it on the same port after 0.5-2 s;
* ``stop``: SIGSTOP a broker for 1-``--max-stop-s`` s (a hung process), then SIGCONT;
* ``term``: SIGTERM a broker (graceful handoff); the supervisor restarts it;
* ``etcd``: SIGSTOP etcd for 1-3 s;
* ``store``: SIGSTOP the S3 server for 1-3 s.

Then every broker is brought back, producers flush, and the checker reads every partition from
the start and counts, over acknowledged records: **lost** (not in the log), **duplicated** (in
the log more than once), **misplaced** (at another offset than acknowledged) and **reordered**
(a producer's records not in the order it sent them). Prints the figures; exit status 1 if any
count is not 0. Loopback only, bounded in time. Run from the repository root::

    .venv/bin/python bench/chaos.py                       # 10 minutes, >= 60 faults
    .venv/bin/python bench/chaos.py --duration-s 30 --seed 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cluster import Stack, create_topic, wait_for
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kafscale.broker.child_process import BrokerProcess, free_port_run

TOPIC = "chaos"
FAULTS = ("kill", "stop", "term", "etcd", "store")


@dataclass
class Slot:
    """A broker's place: its ports survive restarts, as a pod's address does."""

    port: int
    admin_port: int
    process: BrokerProcess | None = None


@dataclass
class Acked:
    """What the producers were told: value -> (partition, offset); per producer, in send order."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    # offset None: librdkafka acked it implicitly (a later batch's success), without an offset
    where: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)
    by_producer: dict[int, list[tuple[int, bytes]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    failed: int = 0

    def add(
        self, producer: int, seq: int, value: bytes, partition: int, offset: int | None
    ) -> None:
        with self.lock:
            self.where[value] = (partition, offset)
            self.by_producer[producer].append((seq, value))


class Cluster:
    def __init__(self, stack: Stack, brokers: int) -> None:
        self.stack = stack
        self.slots = [Slot(free_port_run(), free_port_run()) for _ in range(brokers)]
        self.restarts = 0
        self.failed_starts = 0

    def start(self, slot: Slot, attempts: int = 3) -> None:
        """Start the slot's broker; a start that is not ready in time (on a loaded machine a
        broker's imports alone can take a minute) is killed and tried again."""
        for attempt in range(attempts):
            process = BrokerProcess(
                env=self.stack.env(slot.port, slot.admin_port),
                log_path=self.stack.workdir / f"broker-{slot.port}.log",
                port=slot.port,
                admin_port=slot.admin_port,
            )
            slot.process = process
            try:
                process.start(timeout_s=180)
                return
            except (TimeoutError, RuntimeError) as exc:
                process.kill()
                self.failed_starts += 1
                print(f"broker :{slot.port} did not start ({str(exc)[:200]})", flush=True)
                if attempt == attempts - 1:
                    raise

    def close(self) -> None:
        """Kill every broker: the stack stops only what it started itself."""
        for slot in self.slots:
            if slot.process is not None:
                slot.process.kill()

    def restart(self, slot: Slot) -> None:
        """The supervisor: reap, then start on the same port."""
        if slot.process is not None and slot.process.alive:
            slot.process.kill()
        self.start(slot)
        self.restarts += 1

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{slot.port}" for slot in self.slots)


def run_producer(
    index: int, bootstrap: str, rate: float, stop: threading.Event, acked: Acked
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 300_000,
            "log_level": 0,
        }
    )
    seq = 0

    def report(error: Any, message: Any, seq: int = 0) -> None:
        if error is None:
            acked.add(index, seq, message.value(), message.partition(), message.offset())
        else:
            with acked.lock:
                acked.failed += 1

    interval = 1 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        value = b"p%d-%d" % (index, seq)
        producer.produce(
            TOPIC,
            value=value,
            partition=index,
            on_delivery=lambda e, m, s=seq: report(e, m, s),
        )
        seq += 1
        producer.poll(0)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    remaining = producer.flush(300)
    if remaining:
        with acked.lock:
            acked.failed += remaining


def inject(kind: str, cluster: Cluster, rng: random.Random, max_stop_s: float) -> str:
    """One fault, undone before returning (restarts included)."""
    stack = cluster.stack
    if kind in ("kill", "stop", "term"):
        slot = rng.choice(cluster.slots)
        process = slot.process
        assert process is not None
        if kind == "kill":
            process.signal(signal.SIGKILL)
            process.wait(30)
            time.sleep(rng.uniform(0.5, 2.0))
            cluster.restart(slot)
            return f"kill broker :{slot.port}"
        if kind == "term":
            process.signal(signal.SIGTERM)
            try:
                process.wait(60)
            except Exception:
                process.kill()
            cluster.restart(slot)
            return f"term broker :{slot.port}"
        pause_s = rng.uniform(1.0, max_stop_s)
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(pause_s)
        os.kill(process.pid, signal.SIGCONT)
        return f"stop broker :{slot.port} {pause_s:.1f}s"
    pid = stack.etcd.pid if kind == "etcd" else stack.s3.pid  # type: ignore[union-attr]
    assert pid is not None
    pause_s = rng.uniform(1.0, 3.0)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(pause_s)
    os.kill(pid, signal.SIGCONT)
    return f"pause {kind} {pause_s:.1f}s"


def read_log(
    bootstrap: str, partitions: int, timeout_s: float = 600
) -> tuple[dict[int, list[tuple[int, bytes]]], dict[int, int]]:
    """Every record of every partition, from the start up to its high watermark, and the high
    watermarks. Reading stops at ``timeout_s``; what was not read then is reported, not
    counted as lost (``unread``)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-checker",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), 60)[1]
        for p in range(partitions)
    }
    consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(partitions)])
    log: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    done = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + timeout_s
    while len(done) < partitions and time.monotonic() < deadline:
        for message in consumer.consume(1000, 0.5):
            if message.error() is not None:
                continue
            partition = message.partition()
            log[partition].append((message.offset(), message.value()))
            if message.offset() + 1 >= ends[partition]:
                done.add(partition)
    consumer.close()
    return log, ends


def check(
    acked: Acked, log: dict[int, list[tuple[int, bytes]]], ends: dict[int, int]
) -> dict[str, int]:
    """Counts of acked records lost, duplicated, misplaced and reordered (pure). An acked
    record that is not in the log is lost if the partition's high watermark is at or below its
    acked offset, or if its offset was read and held another record; one whose offset the
    reader did not reach (time ran out) is ``unread``."""
    found: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    read_offsets: dict[int, set[int]] = defaultdict(set)
    for partition, records in log.items():
        for offset, value in records:
            found[value].append((partition, offset))
            read_offsets[partition].add(offset)
    lost = duplicated = misplaced = unread = 0
    for value, place in acked.where.items():
        places = found.get(value, [])
        partition, offset = place
        if not places:
            if (
                offset is not None
                and offset < ends.get(partition, 0)
                and offset not in read_offsets[partition]
            ):
                unread += 1
            else:
                lost += 1
        duplicated += len(places) > 1
        if offset is None:  # acked without an offset: only its partition can be checked
            misplaced += bool(places) and all(p != partition for p, _ in places)
        else:
            misplaced += bool(places) and place not in places
    reordered = 0
    for records in acked.by_producer.values():
        offsets = [acked.where[value][1] for _, value in sorted(records)]
        known = [o for o in offsets if o is not None]
        reordered += sum(1 for a, b in itertools.pairwise(known) if b <= a)
    return {
        "lost": lost,
        "duplicated": duplicated,
        "misplaced": misplaced,
        "reordered": reordered,
        "unread": unread,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50, help="records/s per producer")
    parser.add_argument("--max-stop-s", type=float, default=15)
    parser.add_argument("--faults", type=int, default=0, help="stop after this many (0: none)")
    parser.add_argument(
        "--kinds", default=",".join(FAULTS), help=f"faults to choose from ({','.join(FAULTS)})"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttl", type=int, default=4, help="broker session TTL, seconds")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    env = {
        "KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
        "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
        "KAFSCALE_ETCD__TIMEOUT_S": "2",
    }
    with Stack(broker_env=env) as stack:
        cluster = Cluster(stack, args.brokers)
        try:
            for slot in cluster.slots:
                cluster.start(slot)
            create_topic(cluster.bootstrap, TOPIC, args.producers)
            acked = Acked()
            stop = threading.Event()
            producers = [
                threading.Thread(
                    target=run_producer,
                    args=(i, cluster.bootstrap, args.rate, stop, acked),
                    daemon=True,
                )
                for i in range(args.producers)
            ]
            for thread in producers:
                thread.start()
            faults: Counter[str] = Counter()
            started = time.monotonic()
            kinds = [kind for kind in args.kinds.split(",") if kind in FAULTS]
            while time.monotonic() - started < args.duration_s:
                if args.faults and sum(faults.values()) >= args.faults:
                    break
                time.sleep(rng.uniform(1.0, 4.0))
                kind = rng.choice(kinds)
                what = inject(kind, cluster, rng, args.max_stop_s)
                faults[kind] += 1
                print(f"{time.monotonic() - started:7.1f}s  {what}", flush=True)
            for slot in cluster.slots:  # everything back before the producers finish
                if slot.process is None or not slot.process.alive:
                    cluster.restart(slot)
            stop.set()
            for thread in producers:
                thread.join(360)
            wait_for(lambda: all(s.process and s.process.alive for s in cluster.slots), 30)
            log, ends = read_log(cluster.bootstrap, args.producers)
            counts = check(acked, log, ends)
        finally:
            cluster.close()
    figures = {
        "duration_s": round(time.monotonic() - started, 1),
        "faults": sum(faults.values()),
        "faults_by_kind": dict(sorted(faults.items())),
        "restarts": cluster.restarts,
        "acked": len(acked.where),
        "not_acked": acked.failed,
        "in_log": sum(len(records) for records in log.values()),
        **counts,
    }
    print(
        f"\nfault campaign: {figures['duration_s']} s, {figures['faults']} faults "
        f"{figures['faults_by_kind']}, {figures['restarts']} restarts\n"
        f"acked {figures['acked']} records (not acked: {figures['not_acked']}; "
        f"in the log: {figures['in_log']})\n"
        f"lost {counts['lost']}, duplicated {counts['duplicated']}, "
        f"misplaced {counts['misplaced']}, reordered {counts['reordered']}"
        f" (not read back in time: {counts['unread']})"
    )
    if args.json:
        print(json.dumps(figures))
    return 0 if not any(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
