"""Transactions end to end with a real client (confluent-kafka / librdkafka) and brokers.

A transactional producer commits and aborts and a read_committed consumer sees exactly the
committed records, in order; a zombie producer (older epoch) is fenced; a
consume-transform-produce loop with send_offsets_to_transaction turns every input into exactly
one output and commits the input offsets with it; a coordinator SIGKILLed with transactions in
flight loses nothing decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess, running_cluster
from harness.etcd import harness_etcd
from harness.java_client import java_program
from harness.java_session import JavaSession
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topic

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

TXN_ENV = {"KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS": "200"}


def start(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.start(**TXN_ENV)


@pytest.fixture(scope="module")
def two_brokers(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """Two brokers for the tests that neither kill nor add one, each with topics and
    transactional ids of its own: two brokers started for each cost ~3 s of the suite's time."""
    with running_cluster(
        etcd_server, s3_server, tmp_path_factory, "txnc", brokers=2, extra_env=TXN_ENV
    ) as cluster:
        yield cluster


def producer(bootstrap: str, txn_id: str, **extra: Any) -> Producer:
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 30_000,
            "linger.ms": 5,
            **extra,
        }
    )
    p.init_transactions(30)
    return p


def consume(
    bootstrap: str, topic: str, partitions: int, isolation: str, expect: int, timeout_s: float = 30
) -> list[tuple[int, bytes]]:
    """(partition, value) of every record read from the start: at least ``expect``, and on
    every partition up to its end (the high watermark, or the last stable offset under
    read_committed: ``enable.partition.eof``), so extra records would be seen too. (It polled
    a quiet second after the ``expect``-th before: a second a call.)"""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}-{isolation}-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: list[tuple[int, bytes]] = []
    at_end: set[int] = set()  # partitions whose end was reached after their last record
    deadline = time.monotonic() + timeout_s
    try:
        while (len(seen) < expect or len(at_end) < partitions) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                continue
            seen.append((message.partition(), message.value()))
            at_end.discard(message.partition())
    finally:
        consumer.close()
    return seen


def test_read_committed_sees_exactly_the_committed_records(two_brokers: BrokerCluster) -> None:
    bootstrap = two_brokers.bootstrap
    create_topic(bootstrap, "txn-out", 3)
    p = producer(bootstrap, "writer")
    expected: list[tuple[int, bytes]] = []
    for round_ in range(6):
        p.begin_transaction()
        values = [b"r%d-%d" % (round_, i) for i in range(30)]
        for i, value in enumerate(values):
            p.produce("txn-out", value, partition=i % 3)
        if round_ % 2 == 0:
            p.commit_transaction(30)
            expected.extend((i % 3, v) for i, v in enumerate(values))
        else:
            p.flush(30)  # the aborted records are in the log, not only in the client
            p.abort_transaction(30)
    p.flush(30)
    committed = consume(bootstrap, "txn-out", 3, "read_committed", len(expected))
    for partition in range(3):
        got = [v for p_, v in committed if p_ == partition]
        assert got == [v for p_, v in expected if p_ == partition]
    everything = consume(bootstrap, "txn-out", 3, "read_uncommitted", 180)
    assert len(everything) == 180  # aborted records are there for read_uncommitted


def test_a_zombie_producer_is_fenced(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    create_topic(bootstrap, "zombie-out", 1)
    zombie = producer(bootstrap, "app")
    zombie.begin_transaction()
    zombie.produce("zombie-out", b"from-the-zombie")
    zombie.flush(30)
    successor = producer(bootstrap, "app")  # aborts the zombie's transaction, bumps the epoch
    successor.begin_transaction()
    successor.produce("zombie-out", b"from-the-successor")
    successor.commit_transaction(30)
    with pytest.raises(KafkaException) as raised:
        zombie.produce("zombie-out", b"late")
        zombie.commit_transaction(30)
    error: KafkaError = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    ), error
    assert consume(bootstrap, "zombie-out", 1, "read_committed", 1) == [(0, b"from-the-successor")]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consume_transform_produce_is_exactly_once(
    broker_cluster: BrokerCluster, protocol: str
) -> None:
    """With a classic group and with a consumer-protocol (KIP-848) one, whose member epoch
    TxnOffsetCommit carries as its generation."""
    start(broker_cluster)
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, "ctp-in", 2)
    create_topic(bootstrap, "ctp-out", 2)
    source = Producer({"bootstrap.servers": bootstrap})
    inputs = [b"%03d" % i for i in range(200)]
    for i, value in enumerate(inputs):
        source.produce("ctp-in", value, partition=i % 2)
    source.flush(30)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ctp",
            "group.protocol": protocol,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe(["ctp-in"])
    p = producer(bootstrap, "ctp-app")
    transformed = 0
    aborted_once = False
    deadline = time.monotonic() + 60
    try:
        while transformed < len(inputs) and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(50, 1.0) if not m.error()]
            if not batch:
                continue
            p.begin_transaction()
            for message in batch:
                p.produce("ctp-out", b"out-" + message.value(), partition=message.partition())
            p.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            if not aborted_once:
                # The first batch is aborted: its outputs vanish and its offsets are not
                # committed, so it is read again from the last committed position.
                aborted_once = True
                p.abort_transaction(30)
                committed = consumer.committed(consumer.assignment(), 30)
                for tp in committed:
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
                continue
            p.commit_transaction(30)
            transformed += len(batch)
        committed = consumer.committed(
            [TopicPartition("ctp-in", 0), TopicPartition("ctp-in", 1)], 30
        )
    finally:
        consumer.close()
    assert transformed == len(inputs)
    assert sorted(tp.offset for tp in committed) == [100, 100]
    outputs = consume(bootstrap, "ctp-out", 2, "read_committed", len(inputs))
    assert sorted(v for _, v in outputs) == sorted(b"out-" + v for v in inputs)


def _txn_state(cluster: BrokerCluster, txn_id: str) -> dict[str, Any] | None:
    async def read() -> dict[str, Any] | None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(keys.transaction_key(cluster.cluster, txn_id))
            return None if entry is None else json.loads(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def _coordinator_of(cluster: BrokerCluster, txn_id: str) -> BrokerProcess:
    async def read() -> int:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(keys.transaction_lease_key(cluster.cluster, txn_id))
            assert entry is not None, "nobody coordinates the transactional id"
            return int(entry.value)
        finally:
            await etcd.close()

    node_id = asyncio.run(read())
    (coordinator,) = [b for b in cluster.brokers if b.node_id == node_id]
    return coordinator


def test_the_coordinator_sigkilled_mid_commit_leaves_whole_transactions(
    broker_cluster: BrokerCluster,
) -> None:
    """Transactions commit in a loop while the broker coordinating them is SIGKILLed at a
    random moment: afterwards every transaction is visible whole or not at all, every one the
    client saw committed is visible, and none is left open."""
    start(broker_cluster), start(broker_cluster)
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, "chaos-out", 4)
    # A transaction outliving the takeover (session TTL plus a loaded machine's delays) is
    # aborted by the next coordinator and its producer fenced, as Kafka does: the loop then
    # starts a new producer under the same id, as an application (Kafka Streams) does.
    producers = [producer(bootstrap, "chaos", **{"transaction.timeout.ms": 15_000})]
    coordinator = _coordinator_of(broker_cluster, "chaos")
    survivor = next(b for b in broker_cluster.brokers if b is not coordinator)
    committed: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def run() -> None:
        for round_ in range(10_000):
            if stop.is_set():
                return
            p = producers[-1]
            try:
                p.begin_transaction()
                for i in range(20):
                    p.produce("chaos-out", b"%d-%d" % (round_, i), partition=i % 4)
                p.commit_transaction(20)
                committed.append(round_)
            except KafkaException as exc:
                error = exc.args[0]
                errors.append(str(error))
                if error.fatal():  # fenced: this instance is done, a new one takes the id
                    with contextlib.suppress(KafkaException):
                        producers.append(producer(bootstrap, "chaos"))
                    continue
                # Abortable, retriable or a timeout: the transaction is abandoned (aborted if
                # the client can still abort it, else the coordinator times it out).
                with contextlib.suppress(KafkaException):
                    p.abort_transaction(20)

    loop = threading.Thread(target=run)
    loop.start()
    ready = time.monotonic() + 30
    while len(committed) < 3 and time.monotonic() < ready:
        time.sleep(0.05)
    time.sleep(random.uniform(0.0, 0.5))  # somewhere inside a transaction or its commit
    before_kill = len(committed)
    coordinator.kill()
    # The survivor takes the partitions and the transactional id over once the killed broker's
    # session expires; the client carries on committing there.
    carried_on = time.monotonic() + 60
    while len(committed) <= before_kill + 2 and time.monotonic() < carried_on and loop.is_alive():
        time.sleep(0.1)
    stop.set()
    loop.join(60)
    assert not loop.is_alive()
    assert before_kill > 0 and len(committed) > before_kill, (before_kill, committed, errors)

    def settled() -> bool:
        state = _txn_state(broker_cluster, "chaos")
        return state is not None and state["state"] in ("Empty", "CompleteCommit", "CompleteAbort")

    deadline = time.monotonic() + 30
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert settled(), _txn_state(broker_cluster, "chaos")
    seen = consume(survivor.bootstrap, "chaos-out", 4, "read_committed", len(committed) * 20)
    by_round: dict[int, list[bytes]] = {}
    for _, value in seen:
        by_round.setdefault(int(value.split(b"-")[0]), []).append(value)
    partial = {r: len(v) for r, v in by_round.items() if len(v) != 20}
    assert not partial, f"transactions seen in part: {partial}"
    missing = set(committed) - set(by_round)
    assert not missing, f"acknowledged commits not visible: {sorted(missing)}"
    with contextlib.suppress(KafkaException):  # a fenced last instance has nothing to flush
        producers[-1].flush(10)


# --- the Java client --------------------------------------------------------------------------

JAVA_SOURCE = Path(__file__).with_name("java") / "TxnClient.java"


@pytest.fixture(scope="module")
def txn_client() -> Iterator[JavaSession]:
    """One TxnClient JVM (``serve``) for the module's ~10 calls instead of a JVM each."""
    session = JavaSession([*java_program(JAVA_SOURCE, "TxnClient"), "serve"])
    try:
        yield session
    finally:
        session.close()


def java_txn(session: JavaSession, *args: str) -> list[str]:
    """One TxnClient call (compiled on first use against the harness's kafka-clients jars)."""
    code, lines = session.call(*args)
    assert code == 0, f"TxnClient {args} failed: {lines}"
    return lines


def test_the_java_client_commits_aborts_and_is_fenced(
    txn_client: JavaSession, two_brokers: BrokerCluster
) -> None:
    bootstrap = two_brokers.bootstrap
    create_topic(bootstrap, "java-txn", 2)
    outcomes = java_txn(txn_client, "rounds", bootstrap, "java-txn", "2", "java-app", "6")
    assert outcomes == [f"{'committed' if r % 2 == 0 else 'aborted'} {r}" for r in range(6)]
    lines = java_txn(txn_client, "read", bootstrap, "java-txn", "2", "30")
    records = [line.split(" ", 2)[1:] for line in lines if line.startswith("record ")]
    for partition in ("0", "1"):
        got = [value for p, value in records if p == partition]
        first = 0 if partition == "0" else 1
        assert got == [f"{r}-{i}" for r in (0, 2, 4) for i in range(first, 10, 2)]
    # A zombie with the older epoch cannot commit; only the successor's record is visible.
    create_topic(bootstrap, "java-zombie", 1)
    (outcome,) = java_txn(txn_client, "zombie", bootstrap, "java-zombie", "java-zombie-app")
    assert outcome.startswith("fenced "), outcome
    read = java_txn(txn_client, "read", bootstrap, "java-zombie", "1", "1")
    assert [line for line in read if line.startswith("record ")] == ["record 0 from-the-successor"]


def java_describe(txn_client: JavaSession, bootstrap: str, txn_id: str) -> tuple[str, int, int]:
    """(state, producer id, epoch) as the Java Admin client's DescribeTransactions gives them."""
    (line,) = java_txn(txn_client, "describe", bootstrap, txn_id)
    state, producer_id, epoch = line.split()
    return state, int(producer_id), int(epoch)


def test_the_java_client_runs_transaction_protocol_v2(
    txn_client: JavaSession, two_brokers: BrokerCluster
) -> None:
    """KIP-890 part 2: the Java client (4.x) sees transaction.version 2 finalized and runs
    protocol v2: no AddPartitionsToTxn/AddOffsetsToTxn (Produce v12 and TxnOffsetCommit v5 add
    implicitly), and EndTxn v5 bumps the epoch at every commit and abort, so the markers fence
    every batch of the ended transaction. read_committed sees exactly the committed records;
    the same through the proxy."""
    bootstrap = two_brokers.bootstrap
    create_topic(bootstrap, "tv2", 2)
    outcomes = java_txn(txn_client, "rounds", bootstrap, "tv2", "2", "tv2-app", "4")
    assert outcomes == [f"{'committed' if r % 2 == 0 else 'aborted'} {r}" for r in range(4)]
    state, _, epoch = java_describe(txn_client, bootstrap, "tv2-app")
    assert (state, epoch) == ("CompleteAbort", 4)  # epoch 0 at init, one bump per EndTxn
    committed = consume(bootstrap, "tv2", 2, "read_committed", 20)
    for partition in range(2):
        got = [v.decode() for p_, v in committed if p_ == partition]
        assert got == [f"{r}-{i}" for r in (0, 2) for i in range(partition, 10, 2)]
    # Offsets in the transaction with no AddOffsetsToTxn (only the committed rounds' count),
    # behind the proxy, which gives the client the same features.
    proxy = start_proxy(two_brokers)
    create_topic(proxy.bootstrap, "tv2-offsets", 1)
    lines = java_txn(
        txn_client, "offsets", proxy.bootstrap, "tv2-offsets", "tv2-ctp", "tv2-group", "4"
    )
    assert lines[-1] == "offset 2"
    assert java_describe(txn_client, proxy.bootstrap, "tv2-ctp")[2] == 4


def test_transactions_through_the_proxy(two_brokers: BrokerCluster) -> None:
    """The proxy routes the coordinator's APIs and passes transactional batches, the last stable
    offset and the aborted transactions through: read_committed behind it sees what it would
    see at the brokers."""
    proxy = start_proxy(two_brokers)
    create_topic(proxy.bootstrap, "proxied-txn", 2)
    p = producer(proxy.bootstrap, "proxied")
    expected: list[tuple[int, bytes]] = []
    for round_ in range(4):
        p.begin_transaction()
        values = [b"p%d-%d" % (round_, i) for i in range(10)]
        for i, value in enumerate(values):
            p.produce("proxied-txn", value, partition=i % 2)
        if round_ % 2 == 0:
            p.commit_transaction(30)
            expected.extend((i % 2, v) for i, v in enumerate(values))
        else:
            p.flush(30)
            p.abort_transaction(30)
    seen = consume(proxy.bootstrap, "proxied-txn", 2, "read_committed", len(expected))
    for partition in range(2):
        assert [v for q, v in seen if q == partition] == [v for q, v in expected if q == partition]


CTP_LOOP = """
import sys
from confluent_kafka import Consumer, Producer

bootstrap, source, sink = sys.argv[1:4]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ctp-restart",
                     "group.instance.id": "worker-1", "session.timeout.ms": 6000,
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
consumer.subscribe([source])
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ctp-restart",
                     "linger.ms": 5})
producer.init_transactions(30)
while True:
    batch = [m for m in consumer.consume(10, 0.5) if not m.error()]
    if not batch:
        continue
    producer.begin_transaction()
    for m in batch:
        producer.produce(sink, b"out-" + m.value(), partition=m.partition())
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                         consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
"""


def _offsets_reader(bootstrap: str) -> Consumer:
    """A consumer of the loop's group that never joins it: it only reads the group's committed
    offsets (one for the whole test, polled every 0.1 s, rather than a new one per poll).
    read_uncommitted, so without require_stable: librdkafka's default (read_committed) asks
    for stable offsets and is told to wait while a killed worker's transaction holds offsets
    pending, until the next worker aborts it (KIP-447)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ctp-restart",
            "isolation.level": "read_uncommitted",
        }
    )


def _committed_total(reader: Consumer, topic: str, partitions: int) -> int:
    """The group's committed offsets, summed."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    return sum(max(tp.offset, 0) for tp in reader.committed(tps, 30))


def test_a_consume_transform_produce_loop_killed_at_random_points_is_exactly_once(
    broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    start(broker_cluster)
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, "restart-in", 2)
    create_topic(bootstrap, "restart-out", 2)
    source = Producer({"bootstrap.servers": bootstrap})
    # 100 transactions of 10: the 4 kills, each within ~0.5 s of a worker's first commit, come
    # long before the end (asserted below).
    inputs = [b"%04d" % i for i in range(1000)]
    for i, value in enumerate(inputs):
        source.produce("restart-in", value, partition=i % 2)
    source.flush(30)
    script = tmp_path / "ctp_loop.py"
    script.write_text(CTP_LOOP)
    command = [sys.executable, str(script), bootstrap, "restart-in", "restart-out"]
    reader = _offsets_reader(bootstrap)
    try:
        kills = 0
        progress_at_kill: list[int] = []
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            worker = children.spawn(command, stderr=subprocess.DEVNULL)
            try:
                if kills < 4:
                    # Once this worker has committed something, at a random moment: mid-batch,
                    # mid-commit, between transactions.
                    before = _committed_total(reader, "restart-in", 2)
                    progress = time.monotonic() + 60
                    while _committed_total(reader, "restart-in", 2) == before:
                        assert time.monotonic() < progress, "the worker makes no progress"
                        time.sleep(0.1)
                    time.sleep(random.uniform(0.0, 0.5))
                    worker.send_signal(signal.SIGKILL)
                    kills += 1
                    progress_at_kill.append(_committed_total(reader, "restart-in", 2))
                else:
                    done = time.monotonic() + 60
                    while time.monotonic() < done:
                        if _committed_total(reader, "restart-in", 2) == len(inputs):
                            break
                        time.sleep(0.5)
                    break
            finally:
                worker.kill()
                worker.wait(10)
        assert kills == 4
        assert progress_at_kill[-1] < len(inputs), progress_at_kill  # killed before the end
        assert _committed_total(reader, "restart-in", 2) == len(inputs)
    finally:
        reader.close()
    outputs = consume(bootstrap, "restart-out", 2, "read_committed", len(inputs))
    values = sorted(v for _, v in outputs)
    duplicates = len(values) - len(set(values))
    assert duplicates == 0, f"{duplicates} outputs written twice"
    assert values == sorted(b"out-" + v for v in inputs)
