"""bench/chaos_txn.py's clients: transactional producers (librdkafka and the Java client) and
consume-transform-produce workers, each recording its transactions and their outcomes in a
:class:`Journal` (see chaos_txn.py for the campaign and the outcomes)."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

JAVA_SOURCE = Path(__file__).with_name("java") / "ChaosTxn.java"
# the Java client's jars, as the test harness (tests/harness/java_client.py) leaves them
JAVA_CACHE = Path.home() / ".cache" / "kafscale" / "java-client"
TXN_TOPIC = "txn-out"
IN_TOPIC = "txn-in"
CTP_TOPIC = "ctp-out"
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
