"""Transactions on the partition: transactional produce, WriteTxnMarkers, read_committed reads.

Real broker processes on etcd and moto's S3 server, spoken to over the wire: a transactional
producer's batches (producer id and epoch as a coordinator would give them), the markers a
coordinator sends when the transaction ends, then Fetch and ListOffsets as consumers of either
isolation level see the partition.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster, BrokerProcess, running_cluster
from harness.kafka_wire import (
    FETCH,
    LIST_OFFSETS,
    PRODUCE,
    KafkaWire,
    batches_in,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
)
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from harness.txn_wire import CONTROL, TRANSACTIONAL, produce_transactional, write_marker

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

DESCRIBE_PRODUCERS = 61
NONE, NOT_LEADER, INVALID_PRODUCER_EPOCH = 0, 6, 47
COORDINATOR_FENCED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 52, 53
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
TOPIC = "txns"
PID = 4242


# These tests play the coordinator themselves (made-up producer ids): the owners must not ask a
# real one (KIP-890's verification is tested in test_transactions_verification.py).
NO_COORDINATOR = {"KAFSCALE_TRANSACTIONS__PARTITION_VERIFICATION": "false"}


@pytest.fixture(autouse=True)
def _no_coordinator(broker_cluster: BrokerCluster) -> None:
    broker_cluster.extra_env.update(NO_COORDINATOR)


@pytest.fixture(scope="module")
def shared_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """One broker for the tests that only produce, mark and read, each on a topic of its own
    (``topic``): a broker started for each cost ~1.5 s of the suite's time. The tests that kill
    or add brokers have clusters of their own (``broker_cluster``)."""
    with running_cluster(
        etcd_server, s3_server, tmp_path_factory, "txn", extra_env=NO_COORDINATOR
    ) as cluster:
        yield cluster


@pytest.fixture
def broker(shared_cluster: BrokerCluster) -> BrokerProcess:
    return shared_cluster.brokers[0]


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    """A new one-partition topic on the shared broker: offsets start at 0 in every test."""
    name = f"{TOPIC}-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [name], partitions=1)
    return name


def txn_produce(
    wire: KafkaWire,
    topic: str,
    values: list[bytes],
    sequence: int,
    epoch: int = 0,
    pid: int = PID,
) -> tuple[int, int]:
    """(error code, base offset) of a transactional batch sent as its producer sends it."""
    return produce_transactional(
        wire, topic, 0, values, producer_id=pid, sequence=sequence, epoch=epoch
    )


def plain_produce(wire: KafkaWire, topic: str, values: list[bytes]) -> int:
    code, offset = produce_partition(
        wire.request(PRODUCE, 9, produce_body(topic, 0, make_batch(0, values)))
    )
    assert code == NONE
    return offset


def marker(
    wire: KafkaWire,
    topic: str,
    commit: bool,
    epoch: int = 0,
    coordinator_epoch: int = 0,
    pid: int = PID,
    version: int = 1,
) -> int:
    """The error code of a WriteTxnMarkers entry for the one partition."""
    return write_marker(
        wire,
        topic,
        0,
        producer_id=pid,
        commit=commit,
        epoch=epoch,
        coordinator_epoch=coordinator_epoch,
        version=version,
    )


def marker_once_owned(wire: KafkaWire, topic: str, commit: bool, timeout_s: float = 30.0) -> int:
    """As a coordinator does: retry while the partition has no live owner (a dead broker's
    lease lasts until its session expires), then the marker's code."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = marker(wire, topic, commit)
        if code != NOT_LEADER or time.monotonic() > deadline:
            return code
        time.sleep(0.2)


def fetch(wire: KafkaWire, topic: str, offset: int, isolation: int) -> Any:
    body = {**fetch_body(topic, 0, offset), "isolation_level": isolation}
    partition = fetch_partition(wire.request(FETCH, 12, body))
    assert int(partition.error_code) == NONE
    return partition


def latest(wire: KafkaWire, topic: str, isolation: int) -> int:
    body = {
        "replica_id": -1,
        "isolation_level": isolation,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    result = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
    assert int(result.error_code) == NONE
    return int(result.offset)


def aborted(partition: Any) -> list[tuple[int, int]]:
    return [(int(t.producer_id), int(t.first_offset)) for t in partition.aborted_transactions or ()]


def describe_producers(wire: KafkaWire, topic: str) -> Any:
    body = {"topics": [{"name": topic, "partition_indexes": [0]}]}
    partition = wire.request(DESCRIBE_PRODUCERS, 0, body).topics[0].partitions[0]
    assert int(partition.error_code) == NONE
    return {int(p.producer_id): p for p in partition.active_producers}


def test_read_committed_stops_at_an_open_transaction_until_it_commits(
    broker: BrokerProcess, topic: str
) -> None:
    with KafkaWire(broker.bootstrap) as wire:
        assert plain_produce(wire, topic, [b"before"]) == 0
        assert txn_produce(wire, topic, [b"t1", b"t2"], sequence=0) == (NONE, 1)
        assert txn_produce(wire, topic, [b"t3"], sequence=2) == (NONE, 3)
        assert plain_produce(wire, topic, [b"other"]) == 4

        committed = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(committed.high_watermark) == 5
        assert int(committed.last_stable_offset) == 1
        assert [b.base_offset for b in batches_in(committed.records)] == [0]
        assert fetch(wire, topic, 1, READ_COMMITTED).records in (None, b"")
        uncommitted = fetch(wire, topic, 0, READ_UNCOMMITTED)
        assert [b.base_offset for b in batches_in(uncommitted.records)] == [0, 1, 3, 4]
        assert int(uncommitted.last_stable_offset) == 1
        assert (latest(wire, topic, READ_COMMITTED), latest(wire, topic, READ_UNCOMMITTED)) == (
            1,
            5,
        )
        producer = describe_producers(wire, topic)[PID]
        assert int(producer.current_txn_start_offset) == 1
        assert (int(producer.producer_epoch), int(producer.last_sequence)) == (0, 2)

        assert marker(wire, topic, commit=True) == NONE
        after = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(after.high_watermark) == 6
        assert int(after.last_stable_offset) == 6
        assert aborted(after) == []
        batches = batches_in(after.records)
        assert [b.base_offset for b in batches] == [0, 1, 3, 4, 5]
        control = batches[-1]
        assert control.attributes & (TRANSACTIONAL | CONTROL) == TRANSACTIONAL | CONTROL
        assert (control.producer_id, control.producer_epoch) == (PID, 0)
        assert latest(wire, topic, READ_COMMITTED) == 6
        assert int(describe_producers(wire, topic)[PID].current_txn_start_offset) == -1


def test_an_abort_is_listed_for_read_committed_and_a_retried_marker_writes_nothing(
    broker: BrokerProcess, topic: str
) -> None:
    with KafkaWire(broker.bootstrap) as wire:
        assert txn_produce(wire, topic, [b"gone-1", b"gone-2"], sequence=0) == (NONE, 0)
        assert marker(wire, topic, commit=False, version=0) == NONE  # v0: a Kafka 3.x coordinator's
        assert (
            marker(wire, topic, commit=False) == NONE
        )  # the coordinator retried: no second marker
        assert txn_produce(wire, topic, [b"kept"], sequence=2) == (NONE, 3)
        assert marker(wire, topic, commit=True) == NONE

        committed = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(committed.high_watermark) == 5
        assert int(committed.last_stable_offset) == 5
        assert aborted(committed) == [(PID, 0)]
        assert [b.base_offset for b in batches_in(committed.records)] == [0, 2, 3, 4]
        # A fetch starting after the aborted transaction's marker does not list it.
        assert aborted(fetch(wire, topic, 3, READ_COMMITTED)) == []


def test_a_marker_from_an_older_coordinator_or_producer_epoch_is_fenced(
    broker: BrokerProcess, topic: str
) -> None:
    with KafkaWire(broker.bootstrap) as wire:
        assert txn_produce(wire, topic, [b"a"], sequence=0) == (NONE, 0)
        assert marker(wire, topic, commit=True, coordinator_epoch=3) == NONE
        assert txn_produce(wire, topic, [b"b"], sequence=1) == (NONE, 2)
        assert marker(wire, topic, commit=True, coordinator_epoch=2) == COORDINATOR_FENCED
        # InitProducerId bumped the epoch and the coordinator aborts the zombie's transaction.
        assert marker(wire, topic, commit=False, epoch=1, coordinator_epoch=3) == NONE
        assert txn_produce(wire, topic, [b"zombie"], sequence=2, epoch=0) == (
            INVALID_PRODUCER_EPOCH,
            -1,
        )
        stale = marker(wire, topic, commit=False, epoch=0, coordinator_epoch=3)
        assert stale == INVALID_PRODUCER_EPOCH
        assert txn_produce(wire, topic, [b"new"], sequence=0, epoch=1) == (NONE, 4)
        committed = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(committed.last_stable_offset) == 4
        assert aborted(committed) == [(PID, 2)]


def test_transactional_batches_need_the_transactional_id_on_the_request(
    broker: BrokerProcess, topic: str
) -> None:
    with KafkaWire(broker.bootstrap) as wire:
        batch = make_batch(
            0, [b"x"], attributes=TRANSACTIONAL, producer_id=PID, producer_epoch=0, base_sequence=0
        )
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, batch)))
        assert code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert latest(wire, topic, READ_UNCOMMITTED) == 0


def test_an_open_transaction_survives_an_ownership_move(broker_cluster: BrokerCluster) -> None:
    """The owner dies with a transaction open; the next owner knows it from etcd: the LSO
    stays at its first offset and the coordinator's abort marker is written by the new owner."""
    topic = TOPIC
    first = broker_cluster.start()
    create_topics(first.bootstrap, [topic], partitions=1)
    with KafkaWire(first.bootstrap) as wire:
        assert plain_produce(wire, topic, [b"before"]) == 0
        assert txn_produce(wire, topic, [b"lost"], sequence=0) == (NONE, 1)
    first.kill()
    second = broker_cluster.start()
    with KafkaWire(second.bootstrap) as wire:
        assert marker_once_owned(wire, topic, commit=False) == NONE
        committed = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(committed.high_watermark) == 3
        assert int(committed.last_stable_offset) == 3
        assert aborted(committed) == [(PID, 1)]


def txn_produce_once_owned(
    wire: KafkaWire, topic: str, sequence: int, epoch: int, timeout_s: float = 30.0
) -> tuple[int, int]:
    """As a producer does: retry while the partition has no live owner, then the answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = txn_produce(wire, topic, [b"late"], sequence=sequence, epoch=epoch)
        if answer[0] != NOT_LEADER or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_a_newer_epochs_marker_fences_a_late_batch_where_nothing_was_open(
    broker_cluster: BrokerCluster,
) -> None:
    """Transaction protocol v2 (each EndTxn bumps the epoch): the partition is added to the
    producer's epoch-1 transaction, but its batch is still on its way (a retry through the
    proxy, an owner change) when the transaction ends. Its marker (epoch 2) finds nothing open
    here and is written all the same: the partition knows epoch 2 from then on, durably, so the
    late batch is refused by this owner and the next. Answered done without a write, the late
    batch opened a transaction no marker would end: read_committed stalled there for good, and
    the producer's later transactions continued it (never added here, never given a marker)."""
    topic = TOPIC
    first = broker_cluster.start()
    create_topics(first.bootstrap, [topic], partitions=1)
    with KafkaWire(first.bootstrap) as wire:
        assert txn_produce(wire, topic, [b"t0"], sequence=0, epoch=0) == (NONE, 0)
        assert marker(wire, topic, commit=True, epoch=1) == NONE  # EndTxn v5 bumped epoch 0 to 1
        assert marker(wire, topic, commit=False, epoch=2) == NONE  # epoch 1 ends, nothing open here
        assert txn_produce(wire, topic, [b"late"], sequence=0, epoch=1) == (
            INVALID_PRODUCER_EPOCH,
            -1,
        )
        assert latest(wire, topic, READ_COMMITTED) == latest(wire, topic, READ_UNCOMMITTED) == 3
    first.kill()
    second = broker_cluster.start()
    with KafkaWire(second.bootstrap) as wire:
        # The late batch again, at the next owner: the epoch came with the partition's state.
        assert txn_produce_once_owned(wire, topic, sequence=0, epoch=1) == (
            INVALID_PRODUCER_EPOCH,
            -1,
        )
        # The producer's next transaction (epoch 2, sequences from 0) opens and commits.
        assert txn_produce(wire, topic, [b"next"], sequence=0, epoch=2) == (NONE, 3)
        assert marker(wire, topic, commit=True, epoch=3) == NONE
        committed = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(committed.high_watermark) == 5
        assert int(committed.last_stable_offset) == 5
        assert aborted(committed) == []
        assert int(describe_producers(wire, topic)[PID].current_txn_start_offset) == -1


def test_only_the_owner_writes_markers(broker_cluster: BrokerCluster) -> None:
    topic = TOPIC
    owner = broker_cluster.start()
    create_topics(owner.bootstrap, [topic], partitions=1)
    other = broker_cluster.start()
    with KafkaWire(owner.bootstrap) as wire:
        assert txn_produce(wire, topic, [b"a"], sequence=0) == (NONE, 0)
    with KafkaWire(other.bootstrap) as wire:
        assert marker(wire, topic, commit=True) == NOT_LEADER
    with KafkaWire(owner.bootstrap) as wire:
        assert marker(wire, topic, commit=True) == NONE
        assert int(fetch(wire, topic, 0, READ_COMMITTED).last_stable_offset) == 2


# --- real consumers -----------------------------------------------------------------------------

COMMITTED_VALUES = [b"p0", b"c1", b"c2", b"p1", b"c3", b"after"]
ALL_VALUES = [b"p0", b"c1", b"c2", b"a1", b"p1", b"c3", b"o1", b"after"]


@pytest.fixture
def mixed_partition(broker: BrokerProcess, topic: str) -> BrokerProcess:
    """Committed, aborted and interleaved transactions of three producers, plain records, and
    a transaction aborted after a plain record landed behind it (offsets 0-11)."""
    with KafkaWire(broker.bootstrap) as wire:
        plain_produce(wire, topic, [b"p0"])
        assert txn_produce(wire, topic, [b"c1", b"c2"], sequence=0, pid=1)[0] == NONE
        assert txn_produce(wire, topic, [b"a1"], sequence=0, pid=2)[0] == NONE
        plain_produce(wire, topic, [b"p1"])
        assert marker(wire, topic, commit=True, pid=1) == NONE
        assert marker(wire, topic, commit=False, pid=2) == NONE
        assert txn_produce(wire, topic, [b"c3"], sequence=2, pid=1)[0] == NONE
        assert marker(wire, topic, commit=True, pid=1) == NONE
        assert txn_produce(wire, topic, [b"o1"], sequence=0, pid=3)[0] == NONE
        assert plain_produce(wire, topic, [b"after"]) == 10
        assert latest(wire, topic, READ_COMMITTED) == 9
        assert marker(wire, topic, commit=False, pid=3) == NONE
        assert latest(wire, topic, READ_COMMITTED) == 12
    return broker


def poll_values(
    poll: Callable[[], list[bytes]], at_end: Callable[[], bool], count: int
) -> list[bytes]:
    """Values polled until ``count`` arrived and the partition's end (its last stable offset
    under read_committed) was reached after them, so that one too many shows; or 30 s. (It
    polled a second more after the ``count``-th before.)"""
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        values += poll()
        if len(values) >= count and at_end():
            break
    return values


def consume_confluent(bootstrap: str, topic: str, isolation: str, count: int) -> list[bytes]:
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txn-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    eof = [False]  # the last event was the partition's end

    def poll() -> list[bytes]:
        message = consumer.poll(0.2)
        if message is None:
            return []
        error = message.error()
        eof[0] = error is not None and error.code() == KafkaError._PARTITION_EOF
        return [] if error else [message.value()]

    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        return poll_values(poll, lambda: eof[0], count)
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, topic: str, isolation: str, count: int) -> list[bytes]:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KafkaTopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        group_id=None,
    )

    def poll() -> list[bytes]:
        batches = consumer.poll(timeout_ms=200).values()
        return [record.value for records in batches for record in records]

    try:
        partition = KafkaTopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        end = consumer.end_offsets([partition])[partition]  # the LSO under read_committed
        return poll_values(poll, lambda: consumer.position(partition) >= end, count)
    finally:
        consumer.close()


@pytest.mark.parametrize("consume", [consume_confluent, consume_kafka_python])
def test_real_consumers_read_exactly_the_committed_records(
    mixed_partition: BrokerProcess, topic: str, consume: Any
) -> None:
    """Both clients skip control batches and drop aborted records themselves, from the
    aborted_transactions the broker lists; read_uncommitted sees every data record."""
    committed = consume(mixed_partition.bootstrap, topic, "read_committed", len(COMMITTED_VALUES))
    assert committed == COMMITTED_VALUES
    everything = consume(mixed_partition.bootstrap, topic, "read_uncommitted", len(ALL_VALUES))
    assert everything == ALL_VALUES


def test_read_committed_through_the_proxy(
    mixed_partition: BrokerProcess, topic: str, shared_cluster: BrokerCluster
) -> None:
    """The proxy forwards the isolation level and passes the LSO and the aborted transactions
    back as the owner gave them; DescribeProducers goes to the partition's owner."""
    proxy = start_proxy(shared_cluster)
    with KafkaWire(proxy.bootstrap) as wire:
        partition = fetch(wire, topic, 0, READ_COMMITTED)
        assert int(partition.last_stable_offset) == 12
        assert aborted(partition) == [(2, 3), (3, 9)]
        assert latest(wire, topic, READ_COMMITTED) == 12
        producers = describe_producers(wire, topic)  # split by partition owner, like Produce
        assert sorted(producers) == [1, 2, 3]
        assert int(producers[1].last_sequence) == 2
    committed = consume_confluent(proxy.bootstrap, topic, "read_committed", len(COMMITTED_VALUES))
    assert committed == COMMITTED_VALUES


def test_write_txn_markers_through_the_proxy_reach_every_owner(
    broker_cluster: BrokerCluster,
) -> None:
    """As ``kafka-transactions.sh abort`` sends it: WriteTxnMarkers to the one endpoint there
    is. The proxy splits each marker's partitions by owner (two brokers here) and answers in
    the client's order; the transactions end on every partition (LSO up to the high watermark)."""
    first, second = broker_cluster.start(), broker_cluster.start()
    topic, partitions = "proxied-markers", 4
    create_topics(first.bootstrap, [topic], partitions=partitions)
    proxy = start_proxy(broker_cluster)
    committing, aborting = 7001, 7002
    with KafkaWire(proxy.bootstrap) as wire:
        for partition in range(partitions):
            for pid in (committing, aborting):
                code, _ = produce_transactional(
                    wire, topic, partition, [b"v"], producer_id=pid, sequence=0
                )
                assert code == NONE
        body = {
            "markers": [
                {
                    "producer_id": pid,
                    "producer_epoch": 0,
                    "transaction_result": pid == committing,
                    "topics": [{"name": topic, "partition_indexes": [3, 1, 0, 2]}],
                    "coordinator_epoch": 0,
                }
                for pid in (committing, aborting)
            ]
        }
        response = wire.request(27, 1, body)
        answered = [
            (int(m.producer_id), int(p.partition_index), int(p.error_code))
            for m in response.markers
            for t in m.topics
            for p in t.partitions
        ]
        assert answered == [(pid, p, NONE) for pid in (committing, aborting) for p in (3, 1, 0, 2)]
        for partition in range(partitions):
            fetched = fetch_partition(
                wire.request(
                    FETCH,
                    12,
                    {**fetch_body(topic, partition, 0), "isolation_level": READ_COMMITTED},
                )
            )
            assert int(fetched.last_stable_offset) == int(fetched.high_watermark) == 4
            assert aborted(fetched) == [(aborting, 1)]
    for broker in (first, second):  # each owner got its share of the markers
        assert f"acquired {topic}-" in broker.log_path.read_text()
