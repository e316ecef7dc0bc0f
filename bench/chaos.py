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
* ``etcd``: SIGSTOP etcd (every member of the cluster) for 1-3 s;
* ``store``: SIGSTOP the S3 server for 1-3 s;
* ``etcd-leader``: SIGKILL the etcd member that leads, restart it after 1-``--max-etcd-down-s``
  s (the other two elect a leader meanwhile).

etcd is a cluster of ``--etcd-members`` (default 3; the brokers get every member's URL).
A consumer group of ``--group-members`` confluent-kafka consumers (default 3; 0: none) reads the
topic throughout, committing what it processed after each batch (at-least-once), while a watch
polls the committed offsets (OffsetFetch); see ``_chaos_group.py`` for what is checked.

Then every broker is brought back, producers flush, and the checker reads every partition from
the start and counts, over acknowledged records: **lost** (not in the log), **duplicated** (in
the log more than once), **misplaced** (at another offset than acknowledged) and **reordered**
(a producer's records not in the order it sent them). Once the producers stop, the group
drains to the high watermarks (up to ``--drain-s``); its check counts acked records never
delivered to it, committed offsets seen going back, partitions whose final committed offset is
not the high watermark, and reports duplicates delivered (allowed: at-least-once), the longest
time a partition was assigned to no member and the longest it delivered nothing. Prints the
figures; exit status 1 if any count but the group's duplicates is not 0. Records not acked are
reported per producer and librdkafka error (the failed sequences, their partition and send
times, the producer's last acked record), with librdkafka's ``error_cb`` errors;
``--producer-debug`` keeps each producer's librdkafka log in the work directory. Loopback only,
bounded in time. Run from the repository root::

    .venv/bin/python bench/chaos.py                       # 10 minutes, >= 60 faults
    .venv/bin/python bench/chaos.py --duration-s 30 --seed 7
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
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

from _chaos_group import GROUP, Group, long_silences
from _cluster import RawKafka, Stack, create_topic, etcd_leader, wait_for
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from kafscale.broker.child_process import BrokerProcess, free_port_run

TOPIC = "chaos"
DEFAULT_FAULTS = ("kill", "stop", "term", "etcd", "store", "etcd-leader")
FAULTS = (*DEFAULT_FAULTS, "coord-kill", "coord-stop", "coord-term")
"""``coord-*``: that fault, to the broker FindCoordinator names for the group (else any)."""
MAX_ETCD_DOWN_S = 5.0  # etcd-leader: the killed member is restarted after 1 s to this


@dataclass
class Slot:
    """A broker's place: its ports survive restarts, as a pod's address does."""

    port: int
    admin_port: int
    process: BrokerProcess | None = None


MAX_CLIENT_ERRORS = 200
COUNTED_ONLY = frozenset({"_TRANSPORT"})  # error_cb errors counted, not listed


@dataclass(frozen=True, slots=True)
class Sent:
    """A record as the producer sent it: its sequence, partition and when (campaign seconds)."""

    seq: int
    partition: int
    sent_at: float


@dataclass(frozen=True, slots=True)
class ClientError:
    producer: int
    at: float
    error: str


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
    # (producer, error name) -> the records librdkafka failed with it, in the order reported
    failures: dict[tuple[int, str], list[Sent]] = field(default_factory=dict)
    last_acked: dict[int, Sent] = field(default_factory=dict)  # per producer
    client_errors: list[ClientError] = field(default_factory=list)  # error_cb, first ones
    counted_errors: Counter[str] = field(default_factory=Counter)  # error_cb, COUNTED_ONLY

    def add(
        self,
        producer: int,
        seq: int,
        value: bytes,
        partition: int,
        offset: int | None,
        sent_at: float = 0.0,
    ) -> None:
        with self.lock:
            self.where[value] = (partition, offset)
            self.by_producer[producer].append((seq, value))
            last = self.last_acked.get(producer)
            if last is None or seq > last.seq:
                self.last_acked[producer] = Sent(seq, partition, sent_at)

    def fail(self, producer: int, error: str, sent: Sent) -> None:
        """A delivery report with an error (``error``: librdkafka's name, ``_MSG_TIMED_OUT``)
        or a record ``flush`` left undelivered (``error`` ``unflushed``)."""
        with self.lock:
            self.failed += 1
            self.failures.setdefault((producer, error), []).append(sent)

    def client_error(self, producer: int, at: float, name: str, text: str) -> None:
        """An error librdkafka reported outside a delivery (``error_cb``): all brokers down,
        a fatal idempotence error, ... The first ``MAX_CLIENT_ERRORS`` are kept, but a refused
        connection (``_TRANSPORT``: every broker kill makes each producer report one or two)
        is only counted, so that it does not crowd out the rare ones."""
        with self.lock:
            if name in COUNTED_ONLY:
                self.counted_errors[name] += 1
            elif len(self.client_errors) < MAX_CLIENT_ERRORS:
                self.client_errors.append(ClientError(producer, round(at, 2), f"{name}: {text}"))


def failure_summary(acked: Acked) -> list[dict[str, Any]]:
    """What the producers were not told was stored, per producer and error (pure): how many,
    their partition, the first and last sequence and when they were sent, and the producer's
    last acked record (so a run's output says which partition stalled, from when, and with
    which error librdkafka gave up on it)."""
    summary = []
    for (producer, error), failed in sorted(acked.failures.items()):
        first = min(failed, key=lambda sent: sent.seq)
        last = max(failed, key=lambda sent: sent.seq)
        acked_last = acked.last_acked.get(producer)
        summary.append(
            {
                "producer": producer,
                "error": error,
                "records": len(failed),
                "partitions": sorted({sent.partition for sent in failed}),
                "seqs": [first.seq, last.seq],
                "sent_s": [round(first.sent_at, 2), round(last.sent_at, 2)],
                "last_acked": None
                if acked_last is None
                else {"seq": acked_last.seq, "sent_s": round(acked_last.sent_at, 2)},
            }
        )
    return summary


class Cluster:
    def __init__(self, stack: Stack, brokers: int) -> None:
        self.stack = stack
        self.slots = [Slot(free_port_run(), free_port_run()) for _ in range(brokers)]
        self.restarts = 0
        self.failed_starts = 0
        self.etcd_restarts = 0
        self.max_etcd_down_s = MAX_ETCD_DOWN_S

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

    def print_tails(self, lines: int = 30) -> None:
        """The end of every broker's log, on stderr (the campaign failed)."""
        for slot in self.slots:
            if slot.process is not None:
                print(
                    f"--- broker :{slot.port} (tail)\n{slot.process.tail(lines)}", file=sys.stderr
                )

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
    index: int,
    bootstrap: str,
    rate: float,
    stop: threading.Event,
    acked: Acked,
    started: float | None = None,
    debug: str = "",
    log_dir: Path | None = None,
) -> None:
    """One idempotent producer at ``rate`` records/s to partition ``index`` until ``stop``,
    then a flush. Every failed delivery is recorded with librdkafka's error name, and every
    ``error_cb`` error too (``Acked.fail``, ``Acked.client_error``); ``debug`` (librdkafka
    contexts, e.g. ``msg,protocol,broker,eos``) writes its log to ``log_dir/producer-<i>.log``."""
    origin = time.monotonic() if started is None else started

    def client_error(error: Any) -> None:
        acked.client_error(index, time.monotonic() - origin, error.name(), error.str())

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": f"chaos-producer-{index}",
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 300_000,
            "error_cb": client_error,
            **producer_logging(index, debug, log_dir),
        }
    )
    seq = 0
    unreported: dict[int, float] = {}  # seq -> when sent, until its delivery report

    def report(error: Any, message: Any, seq: int = 0, sent_at: float = 0.0) -> None:
        unreported.pop(seq, None)  # reports run in this thread (poll, flush)
        if error is None:
            acked.add(index, seq, message.value(), message.partition(), message.offset(), sent_at)
        else:
            acked.fail(index, error.name(), Sent(seq, message.partition(), sent_at))

    interval = 1 / rate
    next_at = time.monotonic()
    while not stop.is_set():
        value = b"p%d-%d" % (index, seq)
        sent_at = time.monotonic() - origin
        producer.produce(
            TOPIC,
            value=value,
            partition=index,
            on_delivery=lambda e, m, s=seq, t=sent_at: report(e, m, s, t),
        )
        unreported[seq] = sent_at
        seq += 1
        producer.poll(0)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(300)
    for left, sent_at in sorted(unreported.items()):  # flush gave up before their report
        acked.fail(index, "unflushed", Sent(left, index, sent_at))


def producer_logging(index: int, debug: str, log_dir: Path | None) -> dict[str, Any]:
    """librdkafka's log settings for producer ``index``: quiet (the faults make it log every
    reconnect), or ``debug`` contexts written to ``log_dir/producer-<index>.log`` (through a
    logger, so they land in the work directory ``--keep`` keeps, not on stderr)."""
    if not debug or log_dir is None:
        return {"log_level": 0}
    logger = logging.getLogger(f"chaos.producer.{index}")
    logger.propagate = False
    handler = logging.FileHandler(log_dir / f"producer-{index}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return {"debug": debug, "log_level": 7, "logger": logger}


def inject(kind: str, cluster: Cluster, rng: random.Random, max_stop_s: float) -> str:
    """One fault, undone before returning (restarts included)."""
    stack = cluster.stack
    if kind.startswith("coord-"):
        kind = kind.removeprefix("coord-")
        slot = coordinator_slot(cluster) or rng.choice(cluster.slots)
    elif kind in ("kill", "stop", "term"):
        slot = rng.choice(cluster.slots)
    if kind in ("kill", "stop", "term"):
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
    if kind == "etcd-leader":
        return kill_etcd_leader(cluster, rng)
    if kind == "etcd":
        pids = [m.pid for m in stack.etcd_cluster or [stack.etcd] if m is not None and m.pid]
    else:
        pids = [stack.s3.pid]  # type: ignore[union-attr]
    assert pids
    pause_s = rng.uniform(1.0, 3.0)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(pause_s)
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    return f"pause {kind} {pause_s:.1f}s"


def kill_etcd_leader(cluster: Cluster, rng: random.Random) -> str:
    """SIGKILL the etcd member that leads (waiting up to a minute for one to be elected), and
    restart it on its ports and data after 1-``max_etcd_down_s`` s."""
    members = cluster.stack.etcd_cluster or [cluster.stack.etcd]
    leader = None
    deadline = time.monotonic() + 60
    while leader is None and time.monotonic() < deadline:
        leader = etcd_leader(members) if len(members) > 1 else members[0]  # type: ignore[list-item]
        if leader is None:
            time.sleep(0.2)
    if leader is None:
        return "etcd-leader: no leader within 60 s"
    leader.kill()
    down_s = rng.uniform(1.0, cluster.max_etcd_down_s)
    time.sleep(down_s)
    for attempt in range(3):
        try:
            leader.start()
            break
        except RuntimeError as exc:  # EtcdStartError: not healthy in time
            print(f"etcd {leader.name} did not start ({str(exc)[:200]})", flush=True)
            leader.kill()
            if attempt == 2:
                raise
    cluster.etcd_restarts += 1
    return f"kill etcd leader {leader.name}, down {down_s:.1f}s"


def find_coordinator(slot: Slot) -> Any:
    """FindCoordinator v1 for the campaign's group, asked of the broker in ``slot``."""
    wire = RawKafka(f"127.0.0.1:{slot.port}", timeout_s=10)
    try:
        return wire.request(10, 1, {"key": GROUP, "key_type": 0})
    finally:
        wire.close()


def coordinator_slot(cluster: Cluster) -> Slot | None:
    """The broker the first live broker names as the group's coordinator (None if none
    answers): the ``coord-*`` faults' target, so that the coordinator moves under the group."""
    for slot in cluster.slots:
        try:
            answer = find_coordinator(slot)
        except (OSError, ValueError):
            continue
        if answer.error_code == 0:
            return next((s for s in cluster.slots if s.port == answer.port), None)
    return None


def find_coordinators(cluster: Cluster) -> list[str]:
    """What each broker answers FindCoordinator for the campaign's group (a stuck group)."""
    lines = []
    for slot in cluster.slots:
        try:
            answer = find_coordinator(slot)
            lines.append(
                f"broker :{slot.port} names node {answer.node_id} :{answer.port} "
                f"(error {answer.error_code})"
            )
        except (OSError, ValueError) as exc:
            lines.append(f"broker :{slot.port}: {exc}")
    return lines


def ended_tasks(workdir: Path) -> dict[str, int]:
    """Background tasks that ended by an exception, per task name, from every broker's log
    (``task_stop.log_failure`` writes "background task <name> ended: ..."): a broker whose
    session watch or ownership follower ended runs on half-dead."""
    ended: Counter[str] = Counter()
    for path in workdir.glob("broker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            _, found, tail = line.partition("background task ")
            if found and " ended: " in tail:
                ended[tail.split(" ", 1)[0]] += 1
    return dict(sorted(ended.items()))


def high_watermark(consumer: Consumer, partition: int, timeout_s: float = 300) -> int:
    """The partition's high watermark, asked again while the cluster cannot say (a broker's
    Metadata briefly without the topic, say, right after the last restart)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), 60)[1])
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


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
    ends = {p: high_watermark(consumer, p) for p in range(partitions)}
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
        "--kinds",
        default=",".join(DEFAULT_FAULTS),
        help=f"faults to choose from ({','.join(FAULTS)}; default: the first six)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ttl", type=int, default=4, help="broker session TTL, seconds")
    parser.add_argument("--etcd-members", type=int, default=3, help="etcd cluster size")
    parser.add_argument(
        "--max-etcd-down-s", type=float, default=MAX_ETCD_DOWN_S, help="etcd-leader: downtime"
    )
    parser.add_argument(
        "--group-members", type=int, default=3, help="consumers in the group (0: no group)"
    )
    parser.add_argument(
        "--drain-s", type=float, default=300, help="how long the group may take to drain"
    )
    parser.add_argument(
        "--member-debug",
        default="",
        help="librdkafka debug contexts for the group's members, e.g. cgrp,protocol (to stderr)",
    )
    parser.add_argument(
        "--producer-debug",
        default="",
        help="librdkafka debug contexts for the producers, e.g. msg,protocol,broker,eos "
        "(to producer-<i>.log in the work directory: add --keep)",
    )
    parser.add_argument(
        "--broker-log-level",
        default="WARNING",
        help="the brokers' KAFSCALE_LOG_LEVEL (INFO adds sessions, ownership and fetch waits)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (etcd's and brokers' logs)"
    )
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    env = {
        "KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
        "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
        "KAFSCALE_ETCD__TIMEOUT_S": "2",
        "KAFSCALE_LOG_LEVEL": args.broker_log_level,
    }
    group: Group | None = None
    group_figures: dict[str, Any] = {}
    with Stack(broker_env=env, etcd_members=args.etcd_members, keep_workdir=args.keep) as stack:
        if args.keep:
            print(f"work directory: {stack.workdir}", flush=True)
        cluster = Cluster(stack, args.brokers)
        cluster.max_etcd_down_s = args.max_etcd_down_s
        try:
            for slot in cluster.slots:
                cluster.start(slot)
            create_topic(cluster.bootstrap, TOPIC, args.producers)
            acked = Acked()
            stop = threading.Event()
            if args.group_members:
                group = Group(
                    cluster.bootstrap, TOPIC, args.producers, args.group_members, args.member_debug
                )
                group.start()
            started = time.monotonic()
            producers = [
                threading.Thread(
                    target=run_producer,
                    args=(i, cluster.bootstrap, args.rate, stop, acked),
                    kwargs={
                        "started": started,
                        "debug": args.producer_debug,
                        "log_dir": stack.workdir,
                    },
                    daemon=True,
                )
                for i in range(args.producers)
            ]
            for thread in producers:
                thread.start()
            faults: Counter[str] = Counter()
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
            stopped_at = time.monotonic()
            for thread in producers:
                thread.join(360)
            wait_for(lambda: all(s.process and s.process.alive for s in cluster.slots), 30)
            log, ends = read_log(cluster.bootstrap, args.producers)
            counts = check(acked, log, ends)
            tasks_ended = ended_tasks(stack.workdir)
            if group is not None:
                if not group.drain(ends, args.drain_s):
                    print("the group did not drain:", *group.states(), sep="\n  ", flush=True)
                    print(f"  committed: {group.watch.latest()}, ends: {ends}", flush=True)
                    for line in find_coordinators(cluster):
                        print("  " + line, flush=True)
                group.stop()
                joined = max(group.seen.ownership.first_assigned.values(), default=started)
                group_figures = group.figures(acked.where, ends, (joined, stopped_at), started)
                if args.keep:  # the members' assignments, seconds from the campaign's start
                    events = [
                        (round(t - started, 2), m, kind, ps)
                        for t, m, kind, ps in group.seen.ownership.events
                    ]
                    slow = [  # commits answered after more than 5 s: (sent, seconds, member)
                        (round(c.sent_at - started, 2), round(c.done_at - c.sent_at, 2), c.member)
                        for c in group.seen.commits
                        if c.done_at - c.sent_at > 5
                    ]
                    silences = long_silences(  # (partition, start, seconds, offsets around)
                        group.seen.deliveries, joined, stopped_at, 10.0, started
                    )
                    (stack.workdir / "group-events.json").write_text(
                        json.dumps(
                            {
                                "assignments": events,
                                "slow_commits": sorted(set(slow)),
                                "silences_over_10s": silences,
                            }
                        )
                    )
        except BaseException:
            cluster.print_tails()
            raise
        finally:
            cluster.close()
    figures = {
        "duration_s": round(time.monotonic() - started, 1),
        "faults": sum(faults.values()),
        "faults_by_kind": dict(sorted(faults.items())),
        "restarts": cluster.restarts,
        "etcd_members": args.etcd_members,
        "etcd_restarts": cluster.etcd_restarts,
        "acked": len(acked.where),
        "not_acked": acked.failed,
        "not_acked_by": failure_summary(acked),
        "producer_errors": [vars_of(e) for e in acked.client_errors],
        "producer_errors_counted": dict(acked.counted_errors),
        "in_log": sum(len(records) for records in log.values()),
        **counts,
        "broker_tasks_ended": tasks_ended,
        **group_figures,
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
    for failure in figures["not_acked_by"]:
        print(describe_failure(failure))
    if acked.counted_errors:
        print(f"producer errors counted (error_cb): {dict(acked.counted_errors)}")
    if acked.client_errors:
        print(f"producer errors (error_cb, first {MAX_CLIENT_ERRORS}):")
        for error in acked.client_errors:
            print(f"  {error.at:7.1f}s  producer {error.producer}: {error.error}")
    if tasks_ended:
        print(f"broker background tasks that ended by an exception: {tasks_ended}")
    if group_figures:
        print(describe_group(group_figures))
    if args.json:
        print(json.dumps(figures))
    return 0 if not any(counts.values()) and group_ok(group_figures) else 1


GROUP_FAILURES = (
    "group_undelivered",
    "group_backwards_fetched",
    "group_backwards_committed",
    "group_unfinished_partitions",
    "group_crashed_members",
)


def group_ok(figures: dict[str, Any]) -> bool:
    """No group figure that means a defect is non-zero (duplicates are allowed)."""
    return not any(figures.get(name) for name in GROUP_FAILURES)


def vars_of(error: ClientError) -> dict[str, Any]:
    return {"producer": error.producer, "at_s": error.at, "error": error.error}


def describe_failure(f: dict[str, Any]) -> str:
    """One line of ``failure_summary``: which producer's records failed, with what, when."""
    last = f["last_acked"]
    acked = (
        "none acked" if last is None else f"last acked seq {last['seq']} sent at {last['sent_s']} s"
    )
    return (
        f"not acked: producer {f['producer']} (partitions {f['partitions']}): {f['records']} "
        f"records failed with {f['error']}, seq {f['seqs'][0]}-{f['seqs'][1]}, sent at "
        f"{f['sent_s'][0]}-{f['sent_s'][1]} s; {acked}"
    )


def describe_group(f: dict[str, Any]) -> str:
    drained = (
        "did not drain" if f["group_drain_s"] is None else f"drained in {f['group_drain_s']} s"
    )
    return (
        f"group of {f['group_members']}: {f['group_delivered']} deliveries, "
        f"{f['group_duplicates']} duplicates (at-least-once), undelivered acked "
        f"{f['group_undelivered']}; commits {f['group_commits_ok']} ok / "
        f"{f['group_commits_failed']} failed; committed offset went back "
        f"{f['group_backwards_fetched']} (OffsetFetch, {f['group_offset_fetches']} polls) / "
        f"{f['group_backwards_committed']} (commits); {drained}, partitions not at the high "
        f"watermark {f['group_unfinished_partitions']}; longest unassigned "
        f"{f['group_longest_unassigned_s']} s, longest without a delivery "
        f"{f['group_longest_silence_s']} s (per partition "
        f"{f['group_longest_silence_by_partition_s']}; first join {f['group_first_join_s']} s)"
    )


if __name__ == "__main__":
    sys.exit(main())
