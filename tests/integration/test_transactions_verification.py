"""KIP-890: a partition's owner verifies with the transaction coordinator before a
transactional batch opens a transaction on the partition.

A real transactional producer (confluent-kafka) writes and aborts; a batch of its transaction
that arrives after the abort (the late produce KIP-890 is about), and one for a partition never
added to a transaction, are refused with INVALID_TXN_STATE instead of opening a transaction
nobody will end: the last stable offset keeps up with the high watermark, and a read_committed
consumer keeps reading. Two brokers: the owners ask a coordinator on the other broker too.
With transaction protocol v2 (part 2) the owner adds the partition itself (Produce v12) and each
EndTxn v5 bumps the epoch, which fences the ended transaction's late batches.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.batches import make_batch
from harness.brokers import BrokerCluster, BrokerProcess
from harness.children import freeze
from harness.kafka_wire import (
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    KafkaWire,
    metadata_body,
    produce_body,
    produce_partition,
)
from harness.proxy import start_proxy
from harness.topics import create_topic
from harness.txn_wire import TRANSACTIONAL, produce_transactional

pytestmark = pytest.mark.integration

DESCRIBE_PRODUCERS = 61
NONE, NOT_LEADER, NOT_ENOUGH_REPLICAS, INVALID_TXN_STATE = 0, 6, 19, 48
READ_COMMITTED = 1
TOPIC = "verified"
TXN_ID = "late-writer"


def producer_of(owner: BrokerProcess, partition: int) -> tuple[int, int]:
    """(producer id, epoch) of the one producer ``partition`` remembers (DescribeProducers)."""
    with KafkaWire(owner.bootstrap) as wire:
        body = {"topics": [{"name": TOPIC, "partition_indexes": [partition]}]}
        result = wire.request(DESCRIBE_PRODUCERS, 0, body).topics[0].partitions[0]
    assert int(result.error_code) == NONE
    (producer,) = result.active_producers
    assert int(producer.current_txn_start_offset) == -1  # the abort closed its transaction
    return int(producer.producer_id), int(producer.producer_epoch)


def owner_of(brokers: list[BrokerProcess], partition: int) -> BrokerProcess:
    """The broker whose Metadata names it the leader of ``partition``."""
    with KafkaWire(brokers[0].bootstrap) as wire:
        response = wire.request(METADATA, 9, metadata_body([TOPIC]))
    (topic,) = response.topics
    leader = next(int(p.leader_id) for p in topic.partitions if int(p.partition_index) == partition)
    ports = {int(b.node_id): int(b.port) for b in response.brokers}
    return next(b for b in brokers if b.port == ports[leader])


def produce_late(
    brokers: list[BrokerProcess], partition: int, pid: int, epoch: int, sequence: int
) -> int:
    """The code the partition's owner answers a transactional batch of ``pid``."""
    for broker in brokers:
        with KafkaWire(broker.bootstrap) as wire:
            code, _ = produce_transactional(
                wire, TOPIC, partition, [b"late"], producer_id=pid, sequence=sequence,
                epoch=epoch, transactional_id=TXN_ID,
            )  # fmt: skip
        if code != NOT_LEADER:
            return code
    raise AssertionError(f"nobody owns {TOPIC}-{partition}")


def latest_stable(wire: KafkaWire, partition: int) -> int:
    """The read_committed end of ``partition`` (its last stable offset)."""
    body = {
        "replica_id": -1,
        "isolation_level": READ_COMMITTED,
        "topics": [
            {"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}
        ],
    }
    result = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
    assert int(result.error_code) == NONE
    return int(result.offset)


def read_committed(bootstrap: str, partition: int, expect: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "verified-reader",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, partition, 0)])
    values: list[bytes] = []
    try:
        for _ in range(100):
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value())
            if len(values) >= expect:
                break
    finally:
        consumer.close()
    return values


def test_a_late_batch_after_an_abort_cannot_hang_the_partition(
    broker_cluster: BrokerCluster,
) -> None:
    brokers = [broker_cluster.start(), broker_cluster.start()]
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, TOPIC, 2)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": TXN_ID, "linger.ms": 0}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in (b"a0", b"a1", b"a2"):
        producer.produce(TOPIC, value, partition=0)
        producer.flush(30)  # one batch each: sequences 0, 1, 2
    producer.abort_transaction(30)
    pid, epoch = producer_of(owner_of(brokers, 0), 0)

    for partition, sequence in ((0, 3), (1, 0)):
        # Partition 0: the next batch of the aborted transaction, arriving late (its sequence
        # follows the aborted ones). Partition 1: never added to any transaction.
        assert produce_late(brokers, partition, pid, epoch, sequence) == INVALID_TXN_STATE

    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(TOPIC, b"after", partition=0)
    plain.flush(30)
    with KafkaWire(owner_of(brokers, 0).bootstrap) as wire:
        assert latest_stable(wire, 0) == 5  # 3 aborted records, the abort marker, "after"

    # The producer goes on: each transaction's first batch per partition is verified (at the
    # coordinator's broker or the other one), the later ones find the transaction open.
    for round_ in range(2):
        producer.begin_transaction()
        for i in range(10):
            producer.produce(TOPIC, b"r%d-%d" % (round_, i), partition=i % 2)
        producer.commit_transaction(30)
    for partition in range(2):
        expected = [b"r%d-%d" % (r, i) for r in range(2) for i in range(partition, 10, 2)]
        if partition == 0:
            expected.insert(0, b"after")
        assert read_committed(bootstrap, partition, len(expected)) == expected


# --- transaction protocol v2 on the wire --------------------------------------------------------

INIT, END_TXN, API_VERSIONS = 22, 26, 18
INVALID_PRODUCER_EPOCH = 47


def produce_v12(
    wire: KafkaWire, partition: int, pid: int, epoch: int, sequence: int, txn_id: str
) -> int:
    """A transactional batch as a v2 producer sends it: Produce v12, no AddPartitionsToTxn."""
    batch = make_batch(
        0, [b"v2"], attributes=TRANSACTIONAL, producer_id=pid, producer_epoch=epoch,
        base_sequence=sequence,
    )  # fmt: skip
    body = {**produce_body(TOPIC, partition, batch), "transactional_id": txn_id}
    return produce_partition(wire.request(PRODUCE, 12, body))[0]


def end_v5(wire: KafkaWire, pid: int, epoch: int, commit: bool) -> Any:
    body = {"transactional_id": "v2", "producer_id": pid, "producer_epoch": epoch,
            "committed": commit}  # fmt: skip
    return wire.request(END_TXN, 5, body)


def test_protocol_v2_adds_partitions_implicitly_and_fences_each_ended_transaction(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    create_topic(broker.bootstrap, TOPIC, 1)
    with KafkaWire(broker.bootstrap) as wire:
        features = wire.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                  "client_software_version": "1"})  # fmt: skip
        finalized = {str(f.name): int(f.max_version_level) for f in features.finalized_features}
        assert finalized == {"transaction.version": 2, "share.version": 1}
        init = wire.request(INIT, 5, {"transactional_id": "v2", "transaction_timeout": 30_000,
                                      "producer_id": -1, "producer_epoch": -1})  # fmt: skip
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        assert produce_v12(wire, 0, pid, epoch, 0, "v2") == NONE  # added by the owner
        end = end_v5(wire, pid, epoch, commit=False)
        assert int(end.error_code) == NONE
        assert (int(end.producer_id), int(end.producer_epoch)) == (pid, epoch + 1)
        # A late batch of the aborted transaction: its epoch is fenced by the abort marker.
        assert produce_v12(wire, 0, pid, epoch, 1, "v2") == INVALID_PRODUCER_EPOCH
        assert latest_stable(wire, 0) == 2  # the aborted record and its marker: nothing hangs
        # The next transaction runs at the new epoch, sequences from 0.
        assert produce_v12(wire, 0, pid, epoch + 1, 0, "v2") == NONE
        end = end_v5(wire, pid, epoch + 1, commit=True)
        assert (int(end.error_code), int(end.producer_epoch)) == (NONE, epoch + 2)
        assert latest_stable(wire, 0) == 4


def finalized_features(bootstrap: str) -> dict[str, int]:
    with KafkaWire(bootstrap) as wire:
        answer = wire.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                "client_software_version": "1"})  # fmt: skip
    return {str(f.name): int(f.max_version_level) for f in answer.finalized_features}


def test_a_rolling_upgrade_holds_clients_on_transaction_protocol_v1(
    broker_cluster: BrokerCluster,
) -> None:
    """``transactions.protocol_version=1`` on brokers and proxy: clients that know v2 (the Java
    client decides by the finalized feature) stay on v1 until every process serves v2."""
    held = {"KAFSCALE_TRANSACTIONS__PROTOCOL_VERSION": "1"}
    broker = broker_cluster.start(**held)
    proxy = start_proxy(broker_cluster, **held)
    # Share groups (KIP-932) are served by brokers and through the proxy alike.
    assert finalized_features(broker.bootstrap) == {"transaction.version": 1, "share.version": 1}
    assert finalized_features(proxy.bootstrap) == {"transaction.version": 1, "share.version": 1}
    assert finalized_features(start_proxy(broker_cluster).bootstrap) == {
        "transaction.version": 2,
        "share.version": 1,
    }


# --- a partition taken over while the request is verified ---------------------------------------

FIND_COORDINATOR, INIT_PRODUCER_ID = 10, 22
LIST_OFFSETS_READ_UNCOMMITTED = 0


def coordinated_by(wire: KafkaWire, node_id: int) -> str:
    """A transactional id whose coordinator is broker ``node_id``."""
    for n in range(200):
        txn_id = f"taken-over-{n}"
        body = {"key_type": 1, "coordinator_keys": [txn_id]}
        (answer,) = wire.request(FIND_COORDINATOR, 4, body).coordinators
        if int(answer.error_code) == NONE and int(answer.node_id) == node_id:
            return txn_id
    raise AssertionError(f"no transactional id coordinated by broker {node_id}")


def ends(wire: KafkaWire, partition: int) -> tuple[int, int] | None:
    """(last stable offset, high watermark) of ``partition``; None while it has no owner."""
    answers = []
    for isolation in (READ_COMMITTED, LIST_OFFSETS_READ_UNCOMMITTED):
        body = {
            "replica_id": -1,
            "isolation_level": isolation,
            "topics": [
                {"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}
            ],
        }
        result = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
        answers.append((int(result.error_code), int(result.offset)))
    (lso_code, lso), (hw_code, hw) = answers
    if NOT_LEADER in (lso_code, hw_code):
        return None
    assert lso_code == hw_code == NONE, answers
    return lso, hw


def test_a_partition_taken_over_while_the_request_is_verified_is_not_written_unverified(
    broker_cluster: BrokerCluster,
) -> None:
    """Fails on the old main (bench/chaos_txn.py --via-proxy's stuck last stable offset): a
    Produce v12 (transaction protocol v2) for two partitions reached broker B, which owned one
    of them; the other's owner, A, was stopped. B's check skipped the partition it did not own
    ("refused by the append") and asked the coordinator (on A: no answer until B's timeout) to
    add the other; meanwhile A's session expired and B took A's partition over, and the append
    wrote its batch unverified, never added to the transaction: open for good, no marker ever
    came, read_committed stalled there. The partition now keeps the code it got at the check."""
    # The inter-broker timeout (the etcd timeout's, at least 5 s) outlasts A's session (4 s)
    # and B's take-over after it (well under a second; 6 s of margin here). B's produce waits
    # it out in full: the test's length, not a margin.
    broker_cluster.extra_env["KAFSCALE_ETCD__TIMEOUT_S"] = "10"
    a, b = broker_cluster.start(), broker_cluster.start()
    create_topic(broker_cluster.bootstrap, TOPIC, 4)
    deadline = time.monotonic() + 120
    while not (a.owned() and b.owned()):
        assert time.monotonic() < deadline, (a.owned(), b.owned())
        time.sleep(0.2)
    on_a = int(sorted(a.owned())[0].rsplit("-", 1)[1])
    on_b = int(sorted(b.owned())[0].rsplit("-", 1)[1])
    with KafkaWire(b.bootstrap) as wire:
        txn_id = coordinated_by(wire, a.node_id)
    with KafkaWire(a.bootstrap) as wire:
        init = wire.request(INIT_PRODUCER_ID, 5, {"transactional_id": txn_id,
                            "transaction_timeout": 60_000, "producer_id": -1,
                            "producer_epoch": -1})  # fmt: skip
        assert int(init.error_code) == NONE
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
    freeze(a.pid)  # stopped: the coordinator on A must not answer B
    try:
        batch = make_batch(
            0, [b"v2"], attributes=TRANSACTIONAL, producer_id=pid, producer_epoch=epoch,
            base_sequence=0,
        )  # fmt: skip
        body = {
            "transactional_id": txn_id,
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [
                {
                    "name": TOPIC,
                    "partition_data": [
                        {"index": on_a, "records": batch},
                        {"index": on_b, "records": batch},
                    ],
                }
            ],
        }
        with KafkaWire(b.bootstrap, timeout_s=60) as wire:
            response = wire.request(PRODUCE, 12, body)
        codes = {int(p.index): int(p.error_code) for p in response.responses[0].partition_responses}
    finally:
        a.kill()
    assert codes[on_b] == NOT_ENOUGH_REPLICAS  # the coordinator never answered
    assert codes[on_a] == NOT_LEADER  # not verified, so never appended
    with KafkaWire(b.bootstrap) as wire:
        deadline = time.monotonic() + 120
        while True:
            answer = ends(wire, on_a)
            if answer is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert answer is not None and answer[0] == answer[1]  # no transaction open on it
