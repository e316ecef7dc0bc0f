"""The transactional fault campaign: exactly-once under crashed, hung and restarted brokers, a
paused etcd and a paused object store, directly or through a ``kafscale proxy``.

Starts etcd, moto's S3 server and ``--brokers`` ``kafscale broker`` processes (as
``bench/chaos.py`` does, with its supervisor and its faults), and runs these clients
(confluent-kafka unless said otherwise; librdkafka keeps transaction protocol v1, so every
partition's first batch of a transaction is verified, KIP-890 part 1):

* ``--txn-producers`` transactional producers (``transactional.id`` ``chaos-txn-<i>``), each
  writing transactions of ``--per-txn`` records spread over the ``--partitions`` partitions of
  topic ``txn-out`` (shared by all producers), and aborting ``--abort-share`` of them on
  purpose;
* ``--ctp-workers`` consume-transform-produce workers: worker ``w`` reads partition ``w`` of
  ``txn-in`` (filled with ``--input-records`` records per partition before the faults start),
  writes one output per input record to partition ``w`` of ``ctp-out`` and commits the input
  offsets with ``send_offsets_to_transaction`` (group ``ctp-<w>``) in the same transaction, in
  transactions of up to ``--per-txn`` records, aborting ``--abort-share`` of them and then
  rewinding to the last committed offset;
* ``--java-producers`` transactional producers of the official Java client (``ChaosTxn.java``,
  kafka-clients 4.x: transaction protocol v2, KIP-890 part 2: partitions added by Produce v12,
  the epoch bumped at every EndTxn v5), as the librdkafka ones, ``transactional.id``
  ``java-txn-<i>``; its jars come from the test harness's cache (run one Java client test
  once);
* ``--idempotent`` plain idempotent producers (``bench/chaos.py``'s, on topic ``chaos``),
  checked as that campaign checks them.

Faults, for ``--duration-s`` (or ``--faults``), one every 1-4 s chosen with ``--seed``: those of
``bench/chaos.py`` (``kill``, ``stop``, ``term`` a broker; pause ``etcd`` or the ``store``),
and with ``--via-proxy`` also ``proxy``: SIGKILL the proxy and restart it on its port.

With ``--via-proxy`` every client (producers, workers, the checker) talks to one ``kafscale
proxy`` only; its brokers are never named to them.

Each transaction ends with one of these outcomes, recorded by the client that ran it:
``committed`` (commit_transaction returned), ``aborted`` (aborted on purpose, or never asked to
commit: a produce failed first), ``commit_failed`` (commit raised an abortable error and the
abort then succeeded), ``indeterminate`` (the commit met a fatal error, e.g. fenced, or the
producer gave up: the outcome is the coordinator's). The check then reads both output topics
with a ``read_committed`` consumer, up to each partition's high watermark, and counts:

* ``committed_missing`` / ``committed_partial``: a committed transaction with none / some of its
  records visible; ``duplicated``: a record visible more than once;
* ``aborted_visible``, ``commit_failed_visible``: any record of such a transaction visible;
* ``indeterminate_partial``: a transaction whose outcome the client did not learn, visible only
  in part (all or nothing is the rule);
* ``reordered``: a producer's committed records out of send order in a partition;
* ``stalled_partitions``: partitions a ``read_committed`` consumer could not read to the high
  watermark within ``--read-timeout-s`` (a last stable offset stuck behind a hanging
  transaction);
* for the workers, ``ctp_mismatch``: the committed input offset of a worker's group is ``C``
  but the visible outputs are not exactly one per input record ``0..C-1`` in order;
* ``foreign``: visible records no transaction wrote;
* ``clients_hung``: clients still running ``--join-timeout-s`` after they were told to stop (a
  client blocked in a call for good; named, not waited for).

It also reads everything with ``read_uncommitted`` and reports what is there (aborted records
included, as expected). Exit status 1 if any count is not 0. ``--client-conf KEY=VALUE`` adds a
librdkafka setting to the transactional clients and the checkers. Loopback only, bounded in
time (faults for ``--duration-s``, then bounded waits)::

    .venv/bin/python bench/chaos_txn.py --duration-s 180 --seed 1
    .venv/bin/python bench/chaos_txn.py --duration-s 180 --seed 2 --via-proxy
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos
from _cluster import Stack, create_topic, wait_for
from chaos import Acked, Cluster, Slot, check, inject, read_log, run_producer
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from kafscale.broker.child_process import KAFSCALE, BrokerProcess, free_port_run

JAVA_SOURCE = Path(__file__).with_name("java") / "ChaosTxn.java"
# the Java client's jars, as the test harness (tests/harness/java_client.py) leaves them
JAVA_CACHE = Path.home() / ".cache" / "kafscale" / "java-client"
TXN_TOPIC = "txn-out"
IN_TOPIC = "txn-in"
CTP_TOPIC = "ctp-out"
FAULTS = (*chaos.FAULTS, "proxy")
# librdkafka settings added to every transactional producer, worker consumer and checker
# (``--client-conf``), e.g. metadata.recovery.strategy=none
CLIENT_CONF: dict[str, str] = {}
TXN_TIMEOUT_MS = 20_000  # how long a producer that vanished holds its partitions' LSO
COMMITTED, ABORTED, COMMIT_FAILED, INDETERMINATE = (
    "committed",
    "aborted",
    "commit_failed",
    "indeterminate",
)


# --- what the clients did -------------------------------------------------------------------------


@dataclass
class Txn:
    """One transaction as its client saw it: records (partition, value) in send order."""

    producer: str
    number: int
    records: list[tuple[int, bytes]] = field(default_factory=list)
    outcome: str = ""


@dataclass
class Journal:
    """Every transaction the clients ran, and what they could not do."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    txns: list[Txn] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)

    def add(self, txn: Txn) -> None:
        with self.lock:
            self.txns.append(txn)

    def error(self, what: str) -> None:
        with self.lock:
            self.errors[what] += 1


def kafka_error(exc: KafkaException) -> KafkaError:
    error = exc.args[0]
    assert isinstance(error, KafkaError)
    return error


def error_name(exc: KafkaException) -> str:
    return kafka_error(exc).name()


def new_producer(bootstrap: str, transactional_id: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "linger.ms": 5,
            "message.timeout.ms": TXN_TIMEOUT_MS,
            "log_level": 0,
            **CLIENT_CONF,
        }
    )


def init_producer(
    bootstrap: str, transactional_id: str, stop: threading.Event, journal: Journal
) -> Producer | None:
    """A producer that completed init_transactions (retried through faults); None if told to
    stop first."""
    while not stop.is_set():
        producer = new_producer(bootstrap, transactional_id)
        try:
            producer.init_transactions(30)
            return producer
        except KafkaException as exc:
            journal.error(f"init {error_name(exc)}")
            time.sleep(0.5)
    return None


def produce_one(producer: Producer, topic: str, partition: int, value: bytes) -> None:
    while True:
        try:
            producer.produce(topic, value=value, partition=partition)
            return
        except BufferError:
            producer.poll(0.05)


def finish(producer: Producer, txn: Txn, commit: bool, journal: Journal) -> bool:
    """End ``txn`` (commit or abort) and record its outcome; False if the producer is no
    longer usable (fatal error: a new one must fence it)."""
    if commit:
        for _attempt in range(10):
            try:
                producer.commit_transaction(30)
                txn.outcome = COMMITTED
                return True
            except KafkaException as exc:
                error = kafka_error(exc)
                journal.error(f"commit {error.name()}")
                if error.retriable():
                    continue
                if error.txn_requires_abort():
                    return abort(producer, txn, COMMIT_FAILED, journal)
                txn.outcome = INDETERMINATE
                return False
        txn.outcome = INDETERMINATE
        return False
    return abort(producer, txn, ABORTED, journal)


def abort(producer: Producer, txn: Txn, outcome: str, journal: Journal) -> bool:
    """Abort (retried while retriable). No commit was ever asked for, so ``txn`` must stay
    invisible whatever happens (``outcome``) unless a commit was asked for first
    (``commit_failed``), where only a successful abort settles it."""
    for _attempt in range(10):
        try:
            producer.abort_transaction(30)
            txn.outcome = outcome
            return True
        except KafkaException as exc:
            error = kafka_error(exc)
            journal.error(f"abort {error.name()}")
            if not error.retriable():
                break
    txn.outcome = ABORTED if outcome == ABORTED else INDETERMINATE
    return False


# --- plain transactions --------------------------------------------------------------------------


def run_txn_producer(
    index: int,
    bootstrap: str,
    args: argparse.Namespace,
    stop: threading.Event,
    journal: Journal,
) -> None:
    """Transactions of ``--per-txn`` records over every partition until told to stop."""
    rng = random.Random(args.seed * 1000 + index)
    name = f"chaos-txn-{index}"
    producer = init_producer(bootstrap, name, stop, journal)
    for number in itertools.count():
        if producer is None or stop.is_set():
            return
        txn = Txn(name, number)
        journal.add(txn)
        ok = run_one_txn(producer, txn, index, args, rng, journal)
        if not ok:
            journal.restarts[name] += 1
            producer = init_producer(bootstrap, name, stop, journal)
        time.sleep(args.pause_s)


def run_one_txn(
    producer: Producer,
    txn: Txn,
    index: int,
    args: argparse.Namespace,
    rng: random.Random,
    journal: Journal,
) -> bool:
    try:
        producer.begin_transaction()
        for k in range(args.per_txn):
            partition = (index + txn.number + k) % args.partitions
            value = b"%s-%d-%d" % (txn.producer.encode(), txn.number, k)
            txn.records.append((partition, value))
            produce_one(producer, TXN_TOPIC, partition, value)
    except KafkaException as exc:
        journal.error(f"produce {error_name(exc)}")
        return abort(producer, txn, ABORTED, journal)
    return finish(producer, txn, rng.random() >= args.abort_share, journal)


# --- the Java client's transactions ---------------------------------------------------------------


def java_command() -> list[str]:
    """The command running ChaosTxn, compiled on first use against the jars the test harness
    keeps in ``JAVA_CACHE`` (run any Java client test once, e.g.
    ``tests/integration/test_transactions_clients.py``, to fill it)."""
    jars = JAVA_CACHE / "jars"
    if not any(jars.glob("kafka-clients-*.jar")):
        raise SystemExit(f"no Java client jars in {jars}: run a Java client test once")
    digest = hashlib.sha256(JAVA_SOURCE.read_bytes()).hexdigest()[:12]
    classes = JAVA_CACHE / f"ChaosTxn-classes-{digest}"
    if not classes.is_dir():
        scratch = classes.with_name(classes.name + f".partial-{random.randrange(1 << 30)}")
        scratch.mkdir(parents=True)
        subprocess.run(
            ["javac", "-cp", f"{jars}/*", "-d", str(scratch), str(JAVA_SOURCE)], check=True
        )
        scratch.rename(classes)
    return ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", f"{classes}:{jars}/*"]


def run_java_producer(
    index: int,
    bootstrap: str,
    args: argparse.Namespace,
    stop: threading.Event,
    journal: Journal,
    log_dir: Path,
) -> None:
    """ChaosTxn in a JVM until ``stop`` (its stdin is closed then); its journal lines are
    parsed into ``journal``."""
    name = f"java-txn-{index}"
    command = [
        *args.java_command,
        "ChaosTxn",
        bootstrap,
        TXN_TOPIC,
        str(args.partitions),
        name,
        str(args.per_txn),
        str(args.abort_share),
        str(args.seed * 1000 + 900 + index),
    ]
    with (log_dir / f"{name}.stderr").open("wb") as stderr:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    closer = threading.Thread(target=lambda: (stop.wait(), process.stdin and process.stdin.close()))
    closer.start()
    try:
        assert process.stdout is not None
        read_journal(name, process.stdout, journal)
    finally:
        closer.join()
        process.wait(120)


def read_journal(name: str, lines: Iterator[str], journal: Journal) -> None:
    """ChaosTxn's lines ("rec N P VALUE", "end N OUTCOME", "error WHAT CLASS") into
    ``journal``."""
    txns: dict[int, Txn] = {}
    for line in lines:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "error":
            journal.error(f"java {rest}")
            continue
        number, _, rest = rest.partition(" ")
        txn = txns.get(int(number))
        if txn is None:
            txn = txns[int(number)] = Txn(name, int(number))
            journal.add(txn)
        if kind == "rec":
            partition, _, value = rest.partition(" ")
            txn.records.append((int(partition), value.encode()))
        elif kind == "end":
            txn.outcome = rest
            if rest != COMMITTED:
                journal.restarts[name] += rest == INDETERMINATE


# --- consume-transform-produce -------------------------------------------------------------------


def output_value(partition: int, offset: int, attempt: int) -> bytes:
    """A worker's output for one input record, unique per transaction that wrote it (so an
    aborted attempt's output is told apart from the committed one's)."""
    return b"o%d-%d-%d" % (partition, offset, attempt)


def input_offset(value: bytes) -> int:
    return int(value.split(b"-")[1])


def new_input_consumer(bootstrap: str, worker: int) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ctp-{worker}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "log_level": 0,
            **CLIENT_CONF,
        }
    )


def committed_offset(consumer: Consumer, worker: int, stop: threading.Event) -> int | None:
    """The group's committed input offset (0 if none), retried through faults (a
    read_committed consumer asks for stable offsets: an open transaction makes it wait)."""
    while not stop.is_set():
        try:
            (tp,) = consumer.committed([TopicPartition(IN_TOPIC, worker)], 30)
            if tp.error is None:
                return max(tp.offset, 0)
        except KafkaException:
            pass
        time.sleep(0.5)
    return None


def run_ctp_worker(
    worker: int,
    bootstrap: str,
    args: argparse.Namespace,
    stop: threading.Event,
    journal: Journal,
) -> None:
    """Read ``txn-in`` partition ``worker`` from the group's committed offset, write outputs
    and the next input offset in one transaction, until the input is done or told to stop."""
    rng = random.Random(args.seed * 1000 + 500 + worker)
    name = f"ctp-{worker}"
    numbers = itertools.count()
    while not stop.is_set():
        producer = init_producer(bootstrap, f"chaos-ctp-{worker}", stop, journal)
        consumer = new_input_consumer(bootstrap, worker)
        try:
            position = committed_offset(consumer, worker, stop)
            if producer is None or position is None:
                return
            while not stop.is_set() and position < args.input_records:
                txn = Txn(name, next(numbers))
                ok, position = ctp_round(producer, consumer, txn, position, args, rng, journal)
                if not ok:
                    journal.restarts[name] += 1
                    break
            else:
                return
        finally:
            consumer.close()


def read_inputs(
    consumer: Consumer, worker: int, position: int, count: int
) -> list[tuple[int, bytes]]:
    """Up to ``count`` input records (offset, value) from ``position``, as many as arrive
    within a few seconds."""
    consumer.assign([TopicPartition(IN_TOPIC, worker, position)])
    records: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 5
    while len(records) < count and time.monotonic() < deadline:
        for message in consumer.consume(count - len(records), 0.5):
            if message.error() is None:
                records.append((message.offset(), message.value()))
    return records


def ctp_round(
    producer: Producer,
    consumer: Consumer,
    txn: Txn,
    position: int,
    args: argparse.Namespace,
    rng: random.Random,
    journal: Journal,
) -> tuple[bool, int]:
    """One consume-transform-produce transaction; (producer usable, next position)."""
    worker = int(txn.producer.rsplit("-", 1)[1])
    inputs = read_inputs(consumer, worker, position, args.per_txn)
    if not inputs:
        return True, position
    journal.add(txn)
    try:
        producer.begin_transaction()
        for offset, _value in inputs:
            value = output_value(worker, offset, txn.number)
            txn.records.append((worker, value))
            produce_one(producer, CTP_TOPIC, worker, value)
        next_position = inputs[-1][0] + 1
        producer.send_offsets_to_transaction(
            [TopicPartition(IN_TOPIC, worker, next_position)],
            consumer.consumer_group_metadata(),
            30,
        )
    except KafkaException as exc:
        journal.error(f"ctp {error_name(exc)}")
        return abort(producer, txn, ABORTED, journal), position
    ok = finish(producer, txn, rng.random() >= args.abort_share, journal)
    return ok, next_position if txn.outcome == COMMITTED else position


# --- the proxy -----------------------------------------------------------------------------------


class Proxy:
    """A ``kafscale proxy`` on a port a restart keeps."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.slot = Slot(free_port_run(), free_port_run())
        self.restarts = 0

    def start(self) -> None:
        env = self.stack.env(self.slot.port, self.slot.admin_port)  # storage is ignored
        self.slot.process = BrokerProcess(
            env=env,
            log_path=self.stack.workdir / "proxy.log",
            port=self.slot.port,
            admin_port=self.slot.admin_port,
            command=[KAFSCALE, "proxy"],
        )
        self.slot.process.start(timeout_s=180)

    def kill_and_restart(self, rng: random.Random) -> str:
        process = self.slot.process
        assert process is not None
        process.signal(signal.SIGKILL)
        process.wait(30)
        time.sleep(rng.uniform(0.5, 2.0))
        self.start()
        self.restarts += 1
        return f"kill proxy :{self.slot.port}"

    def close(self) -> None:
        if self.slot.process is not None:
            self.slot.process.kill()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.slot.port}"


# --- reading back ---------------------------------------------------------------------------------


@dataclass
class Log:
    """What a consumer read: per partition, (offset, value) in offset order; partitions it could
    not read to the end in time."""

    records: dict[int, list[tuple[int, bytes]]] = field(default_factory=lambda: defaultdict(list))
    ends: dict[int, int] = field(default_factory=dict)
    stalled: dict[int, int] = field(default_factory=dict)  # partition -> position reached


def read_topic(
    bootstrap: str, topic: str, partitions: int, isolation: str, timeout_s: float
) -> Log:
    """Every record of ``topic`` from the start up to each partition's high watermark (taken
    first), with ``isolation`` (``read_committed`` or ``read_uncommitted``). A partition is done
    when the consumer's position reaches its high watermark (a read_committed position passes
    control and aborted batches too); one not done within ``timeout_s`` is ``stalled``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-txn-checker-{isolation}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "log_level": 0,
            **CLIENT_CONF,
        }
    )
    log = Log()
    try:
        for p in range(partitions):
            log.ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), 60)[1]
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        pending = {p for p, end in log.ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is None:
                    log.records[message.partition()].append((message.offset(), message.value()))
            positions = consumer.position([TopicPartition(topic, p) for p in pending])
            pending -= {tp.partition for tp in positions if tp.offset >= log.ends[tp.partition]}
        for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
            log.stalled[tp.partition] = tp.offset
    finally:
        consumer.close()
    return log


def group_offsets(bootstrap: str, workers: int) -> dict[int, int]:
    """Each worker group's committed input offset (0 if none)."""
    offsets = {}
    for worker in range(workers):
        consumer = new_input_consumer(bootstrap, worker)
        try:
            (tp,) = consumer.committed([TopicPartition(IN_TOPIC, worker)], 60)
            offsets[worker] = max(tp.offset, 0)
        finally:
            consumer.close()
    return offsets


# --- the check (pure) ---------------------------------------------------------------------------


def locate(*logs: Log) -> dict[bytes, list[tuple[int, int]]]:
    found: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for log in logs:
        for partition, records in log.records.items():
            for offset, value in records:
                found[value].append((partition, offset))
    return found


def check_txns(txns: list[Txn], found: dict[bytes, list[tuple[int, int]]]) -> dict[str, int]:
    """Counts of transactional anomalies in what a read_committed consumer saw."""
    counts: Counter[str] = Counter()
    written: set[bytes] = set()
    for txn in txns:
        visible = [value for _, value in txn.records if value in found]
        written.update(value for _, value in txn.records)
        counts["duplicated"] += sum(len(found[v]) > 1 for v in visible)
        counts["misplaced"] += sum(
            all(p != partition for p, _ in found.get(value, [(partition, 0)]))
            for partition, value in txn.records
        )
        counts.update(txn_anomalies(txn, len(visible)))
    counts["reordered"] += count_reordered(txns, found)
    counts["foreign"] += sum(1 for value in found if value not in written)
    return {name: counts[name] for name in ANOMALIES}


ANOMALIES = (
    "committed_missing",
    "committed_partial",
    "duplicated",
    "misplaced",
    "reordered",
    "aborted_visible",
    "commit_failed_visible",
    "indeterminate_partial",
    "foreign",
)


def txn_anomalies(txn: Txn, visible: int) -> Counter[str]:
    total = len(txn.records)
    anomalies: Counter[str] = Counter()
    if txn.outcome == COMMITTED and total:
        anomalies["committed_missing"] += visible == 0
        anomalies["committed_partial"] += 0 < visible < total
    elif txn.outcome == ABORTED:
        anomalies["aborted_visible"] += visible > 0
    elif txn.outcome == COMMIT_FAILED:
        anomalies["commit_failed_visible"] += visible > 0
    else:
        anomalies["indeterminate_partial"] += 0 < visible < total
    return anomalies


def count_reordered(txns: list[Txn], found: dict[bytes, list[tuple[int, int]]]) -> int:
    """Pairs of a producer's visible records in one partition whose offsets go backwards
    against send order (transactions in their order, records in theirs)."""
    sent: dict[tuple[str, int], list[int]] = defaultdict(list)
    for txn in sorted(txns, key=lambda t: (t.producer, t.number)):
        for partition, value in txn.records:
            places = [offset for p, offset in found.get(value, []) if p == partition]
            if places:
                sent[(txn.producer, partition)].append(min(places))
    return sum(
        sum(1 for a, b in itertools.pairwise(offsets) if b <= a) for offsets in sent.values()
    )


def check_ctp(log: Log, committed: dict[int, int]) -> int:
    """Workers whose visible outputs are not exactly one per input offset below the group's
    committed offset, in order (pure)."""
    return sum(
        [input_offset(value) for _, value in log.records.get(worker, [])] != list(range(end))
        for worker, end in committed.items()
    )


# --- the campaign ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=180)
    parser.add_argument("--faults", type=int, default=0, help="stop after this many (0: none)")
    parser.add_argument("--kinds", default=",".join(FAULTS), help=f"from {','.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=4, help="broker session TTL, seconds")
    parser.add_argument("--max-stop-s", type=float, default=10)
    parser.add_argument("--txn-producers", type=int, default=2)
    parser.add_argument("--ctp-workers", type=int, default=2)
    parser.add_argument(
        "--java-producers", type=int, default=1, help="Java client (transaction protocol v2)"
    )
    parser.add_argument("--idempotent", type=int, default=0, help="chaos.py's plain producers")
    parser.add_argument("--rate", type=float, default=20, help="records/s per plain producer")
    parser.add_argument("--partitions", type=int, default=4, help="of txn-out")
    parser.add_argument("--per-txn", type=int, default=10)
    parser.add_argument("--abort-share", type=float, default=0.25)
    parser.add_argument("--pause-s", type=float, default=0.05, help="between transactions")
    parser.add_argument("--input-records", type=int, default=20_000, help="per worker")
    parser.add_argument("--read-timeout-s", type=float, default=180)
    parser.add_argument("--via-proxy", action="store_true", help="every client to one proxy")
    parser.add_argument(
        "--client-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for the transactional clients and checkers (repeatable)",
    )
    parser.add_argument(
        "--join-timeout-s",
        type=float,
        default=150,
        help="how long the clients may take to finish once told to stop (the rest are hung)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    return parser.parse_args(argv)


def fill_input(bootstrap: str, workers: int, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 0})
    for worker in range(workers):
        for offset in range(records):
            produce_one(producer, IN_TOPIC, worker, b"in%d-%d" % (worker, offset))
    if producer.flush(300):
        raise RuntimeError("the input records were not all acknowledged")


def start_clients(
    args: argparse.Namespace,
    bootstrap: str,
    stop: threading.Event,
    journal: Journal,
    acked: Acked,
    log_dir: Path,
) -> list[threading.Thread]:
    """Every client in a thread of its own, running until ``stop`` is set."""
    shared = (bootstrap, args, stop, journal)
    targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        *((run_txn_producer, (i, *shared)) for i in range(args.txn_producers)),
        *((run_ctp_worker, (w, *shared)) for w in range(args.ctp_workers)),
        *((run_java_producer, (i, *shared, log_dir)) for i in range(args.java_producers)),
        *((run_producer, (i, bootstrap, args.rate, stop, acked)) for i in range(args.idempotent)),
    ]
    threads = [
        threading.Thread(target=t, args=a, daemon=True, name=f"{t.__name__}-{a[0]}")
        for t, a in targets
    ]
    for thread in threads:
        thread.start()
    return threads


def run_faults(
    args: argparse.Namespace, cluster: Cluster, proxy: Proxy | None, rng: random.Random
) -> Iterator[tuple[str, str]]:
    """Inject faults for the campaign's duration; yields each one's kind and description."""
    kinds = [k for k in args.kinds.split(",") if k in FAULTS and (k != "proxy" or proxy)]
    started = time.monotonic()
    done = 0
    while time.monotonic() - started < args.duration_s:
        if args.faults and done >= args.faults:
            return
        time.sleep(rng.uniform(1.0, 4.0))
        kind = rng.choice(kinds)
        if kind == "proxy":
            assert proxy is not None
            what = proxy.kill_and_restart(rng)
        else:
            what = inject(kind, cluster, rng, args.max_stop_s)
        done += 1
        yield kind, f"{time.monotonic() - started:7.1f}s  {what}"


def campaign(args: argparse.Namespace, stack: Stack, cluster: Cluster) -> dict[str, Any]:
    rng = random.Random(args.seed)
    for slot in cluster.slots:
        cluster.start(slot)
    proxy = Proxy(stack) if args.via_proxy else None
    try:
        if proxy is not None:
            proxy.start()
        bootstrap = proxy.bootstrap if proxy else cluster.bootstrap
        create_topic(bootstrap, TXN_TOPIC, args.partitions)
        create_topic(bootstrap, CTP_TOPIC, max(args.ctp_workers, 1))
        create_topic(bootstrap, IN_TOPIC, max(args.ctp_workers, 1))
        if args.idempotent:
            create_topic(bootstrap, chaos.TOPIC, args.idempotent)
        fill_input(bootstrap, args.ctp_workers, args.input_records)
        acked, stop, journal = Acked(), threading.Event(), Journal()
        threads = start_clients(args, bootstrap, stop, journal, acked, stack.workdir)
        started = time.monotonic()
        faults: Counter[str] = Counter()
        for kind, what in run_faults(args, cluster, proxy, rng):
            faults[kind] += 1
            print(what, flush=True)
        for slot in cluster.slots:  # everything back before the clients finish
            if slot.process is None or not slot.process.alive:
                cluster.restart(slot)
        stop.set()
        deadline = time.monotonic() + args.join_timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        hung = [thread.name for thread in threads if thread.is_alive()]
        wait_for(lambda: all(s.process and s.process.alive for s in cluster.slots), 30)
        figures = verify(args, bootstrap, journal, acked)
        figures.update(
            duration_s=round(time.monotonic() - started, 1),
            faults=sum(faults.values()),
            faults_by_kind=dict(sorted(faults.items())),
            broker_restarts=cluster.restarts,
            proxy_restarts=proxy.restarts if proxy else 0,
            clients_hung=hung,
        )
        return figures
    finally:
        if proxy is not None:
            proxy.close()


def verify(
    args: argparse.Namespace, bootstrap: str, journal: Journal, acked: Acked
) -> dict[str, Any]:
    """Read everything back and count (see the module's docstring)."""
    topics = ((TXN_TOPIC, args.partitions), (CTP_TOPIC, max(args.ctp_workers, 1)))
    committed_logs = [
        read_topic(bootstrap, topic, n, "read_committed", args.read_timeout_s)
        for topic, n in topics
    ]
    raw_logs = [
        read_topic(bootstrap, topic, n, "read_uncommitted", args.read_timeout_s)
        for topic, n in topics
    ]
    txns = list(journal.txns)
    visible, raw = locate(*committed_logs), locate(*raw_logs)
    counts = check_txns(txns, visible)
    offsets = group_offsets(bootstrap, args.ctp_workers)
    counts["ctp_mismatch"] = check_ctp(committed_logs[1], offsets)
    counts["stalled_partitions"] = sum(len(log.stalled) for log in committed_logs)
    figures: dict[str, Any] = {
        "transactions": len(txns),
        "outcomes": dict(sorted(Counter(t.outcome or "unfinished" for t in txns).items())),
        "outcomes_by_client": {
            kind: dict(
                sorted(
                    Counter(t.outcome or "unfinished" for t in txns if client(t) == kind).items()
                )
            )
            for kind in sorted({client(t) for t in txns})
        },
        "records_committed_visible": sum(map(len, visible.values())),
        "records_uncommitted_visible": sum(map(len, raw.values())),
        "not_committed_records_in_log": sum(
            v in raw for t in txns if t.outcome != COMMITTED for _, v in t.records
        ),
        "indeterminate_visible": sum(
            any(v in visible for _, v in t.records) for t in txns if t.outcome == INDETERMINATE
        ),
        "ctp_committed_offsets": offsets,
        "stalled": {
            f"{topic}/{p}@{position}": log.ends[p]
            for (topic, _), log in zip(topics, committed_logs, strict=True)
            for p, position in log.stalled.items()
        },
        "client_errors": dict(sorted(journal.errors.items())),
        "producer_restarts": dict(sorted(journal.restarts.items())),
        **counts,
    }
    if args.idempotent:
        log, ends = read_log(bootstrap, args.idempotent)
        plain = check(acked, log, ends)
        figures["idempotent"] = {"acked": len(acked.where), "not_acked": acked.failed, **plain}
    return figures


def client(txn: Txn) -> str:
    """The kind of client that ran ``txn``: ``chaos-txn``, ``ctp`` or ``java-txn``."""
    return txn.producer.rsplit("-", 1)[0]


def failed(figures: dict[str, Any]) -> bool:
    keys = (*ANOMALIES, "ctp_mismatch", "stalled_partitions", "clients_hung")
    plain = figures.get("idempotent", {})
    return any(figures[k] for k in keys) or any(
        plain.get(k) for k in ("lost", "duplicated", "misplaced", "reordered")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.java_command = java_command() if args.java_producers else []
    CLIENT_CONF.update(item.split("=", 1) for item in args.client_conf)
    env = {
        "KAFSCALE_ETCD__SESSION_TTL_S": str(args.ttl),
        "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
        "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
        "KAFSCALE_ETCD__TIMEOUT_S": "2",
    }
    with Stack(cluster="chaos-txn", broker_env=env, keep_workdir=args.keep) as stack:
        print(f"work dir {stack.workdir}", flush=True)
        cluster = Cluster(stack, args.brokers)
        try:
            figures = campaign(args, stack, cluster)
        finally:
            cluster.close()
    print(json.dumps(figures, indent=1 if not args.json else None))
    return 1 if failed(figures) else 0


if __name__ == "__main__":
    sys.exit(main())
