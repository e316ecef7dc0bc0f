"""A partition with more aborted transactions than its etcd state keeps: read_committed
consumers still see exactly the committed records, from offset 0, after an ownership move, on
a broker that never saw the partition, and after DeleteRecords; index objects nobody references
are deleted.

Real broker processes on etcd and moto's S3 server, a real transactional producer and
read_committed consumer (confluent-kafka). The state's limit is lowered to 8
(``KAFSCALE_LOG__ABORTED_TXNS_IN_STATE``) so that 30+ aborts spill several index objects.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.etcd import harness_etcd
from harness.kafka_wire import PRODUCE, KafkaWire, produce_body, produce_partition
from harness.topics import create_topic
from harness.txn_wire import produce_transactional, write_marker

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import AbortedTxn, PartitionState
from kafscale.broker.storage.aborted_index import encode_aborted_index, object_key

pytestmark = pytest.mark.integration

TOPIC = "many-aborts"
LIMIT = 8
ENV = {
    "KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS": "200",
    "KAFSCALE_LOG__ABORTED_TXNS_IN_STATE": str(LIMIT),
}


def write_transactions(bootstrap: str, rounds: int, tag: str) -> list[bytes]:
    """``rounds`` transactions of three records, three of every four aborted (after their
    records reached the log); returns the committed values in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "many-aborts-writer",
            "transaction.timeout.ms": 30_000,
            "linger.ms": 2,
        }
    )
    producer.init_transactions(60)
    committed: list[bytes] = []
    for i in range(rounds):
        producer.begin_transaction()
        values = [b"%s-%d-%d" % (tag.encode(), i, j) for j in range(3)]
        for value in values:
            producer.produce(TOPIC, value, partition=0)
        if i % 4 == 3:
            producer.commit_transaction(60)
            committed += values
        else:
            producer.flush(60)
            producer.abort_transaction(60)
    producer.flush(60)
    return committed


def read_committed(bootstrap: str, expect: int, **extra: object) -> list[bytes]:
    """Every value a read_committed consumer reads from offset 0 (or the log start): until
    ``expect`` arrived and a quiet second more (so that aborted records read as well would
    show), or 60 s."""
    return [value for _, value in read_committed_at(bootstrap, expect, **extra)]


def read_committed_at(bootstrap: str, expect: int, **extra: object) -> list[tuple[int, bytes]]:
    """(offset, value) of what ``read_committed`` reads."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **extra,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append((message.offset(), message.value()))
            if len(values) >= expect:
                deadline = min(deadline, time.monotonic() + 1)
    finally:
        consumer.close()
    return values


def partition_state(cluster: BrokerCluster) -> PartitionState:
    async def read() -> PartitionState:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(keys.partition_state_key(cluster.cluster, TOPIC, 0))
            assert entry is not None
            return PartitionState.from_json(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def index_objects(cluster: BrokerCluster) -> list[str]:
    return sorted(
        key
        for key in cluster.object_keys(f"{cluster.cluster}/topics/{TOPIC}/")
        if key.endswith(".atx")
    )


def referenced_objects(cluster: BrokerCluster, state: PartitionState) -> list[str]:
    """The index objects in the store once those ``state`` no longer references are deleted
    (an owner deletes them right after its commit), or after 10 s."""
    topic_id = cluster.object_keys(f"{cluster.cluster}/topics/{TOPIC}/")[0].split("/")[-3]
    wanted = sorted(
        object_key(cluster.cluster, TOPIC, topic_id, 0, ref) for ref in state.aborted_txn_index
    )
    deadline = time.monotonic() + 10
    while index_objects(cluster) != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return index_objects(cluster)


def delete_records(bootstrap: str, before: int) -> int:
    """The new log start after DeleteRecords, retried while the partition has no live owner."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 30
    while True:
        [future] = admin.delete_records([TopicPartition(TOPIC, 0, before)]).values()
        try:
            return int(future.result(30).low_watermark)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_read_committed_sees_exactly_the_committed_records_past_the_state_limit(
    broker_cluster: BrokerCluster,
) -> None:
    first = broker_cluster.start(**ENV)
    create_topic(first.bootstrap, TOPIC, 1)
    expected = write_transactions(first.bootstrap, 40, "a")  # 30 aborted, 10 committed

    state = partition_state(broker_cluster)
    assert len(state.aborted_txns) <= LIMIT  # the etcd state stays bounded...
    assert state.aborted_txn_index  # ...because the older aborts were spilled
    assert len(state.aborted_txns) + sum(r.txn_count for r in state.aborted_txn_index) == 30
    assert len(referenced_objects(broker_cluster, state)) == len(state.aborted_txn_index)
    assert read_committed(first.bootstrap, len(expected)) == expected
    # Small fetches: each lists the aborted transactions of its own range.
    small_fetches = {
        "message.max.bytes": 1000,
        "fetch.max.bytes": 1000,
        "max.partition.fetch.bytes": 300,
    }
    small = read_committed(first.bootstrap, len(expected), **small_fetches)
    assert small == expected

    # An ownership move: the new owner continues from the state (and spills more).
    second = broker_cluster.start(**ENV)
    first.stop()
    expected += write_transactions(second.bootstrap, 20, "b")  # 15 more aborted
    moved = partition_state(broker_cluster)
    assert moved.leader_epoch > state.leader_epoch
    assert max(r.epoch for r in moved.aborted_txn_index) == moved.leader_epoch
    assert len(moved.aborted_txns) + sum(r.txn_count for r in moved.aborted_txn_index) == 45
    assert len(referenced_objects(broker_cluster, moved)) == len(moved.aborted_txn_index)
    assert read_committed(second.bootstrap, len(expected)) == expected

    # A broker that never read the partition learns the index objects from the state alone.
    second.kill()
    third = broker_cluster.start(**ENV)
    everything = read_committed_at(third.bootstrap, len(expected))
    assert [value for _, value in everything] == expected

    # DeleteRecords past the oldest object's last marker: its reference and object go, and
    # read_committed from the new log start still sees exactly the committed records.
    oldest = moved.aborted_txn_index[0]
    assert delete_records(third.bootstrap, oldest.last_offset + 1) == oldest.last_offset + 1
    trimmed = partition_state(broker_cluster)
    assert oldest not in trimmed.aborted_txn_index
    assert len(referenced_objects(broker_cluster, trimmed)) == len(trimmed.aborted_txn_index)
    rest = [(o, v) for o, v in everything if o > oldest.last_offset]
    assert read_committed_at(third.bootstrap, len(rest)) == rest


def test_an_orphaned_index_object_is_deleted_by_the_next_owner(
    broker_cluster: BrokerCluster,
) -> None:
    """An index object an owner PUT but never committed (it died in between; planted here at
    the old epoch, above every referenced one) is deleted by the next owner's janitor, and the
    referenced objects stay."""
    # The test plays the coordinator (made-up producer ids): no KIP-890 check with a real one.
    first = broker_cluster.start(**ENV, KAFSCALE_TRANSACTIONS__PARTITION_VERIFICATION="false")
    create_topic(first.bootstrap, TOPIC, 1)
    with KafkaWire(first.bootstrap) as wire:
        for pid in range(1, 11):  # ten aborts: one spill at the limit of 8
            code, _ = produce_transactional(wire, TOPIC, 0, [b"x"], producer_id=pid, sequence=0)
            assert code == 0
            assert write_marker(wire, TOPIC, 0, producer_id=pid, commit=False) == 0
    state = partition_state(broker_cluster)
    referenced = referenced_objects(broker_cluster, state)
    assert len(referenced) == len(state.aborted_txn_index) == 1
    assert first.stop() == 0
    orphan = referenced[0].rsplit("/", 1)[0] + f"/{900:020d}-{950:020d}-e{state.leader_epoch}.atx"
    body = encode_aborted_index([AbortedTxn(99, 900, 950)])
    broker_cluster.s3.client().put_object(Bucket=broker_cluster.bucket, Key=orphan, Body=body)

    second = broker_cluster.start(**ENV, KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S="0.5")
    with KafkaWire(second.bootstrap) as wire:  # the second broker takes the partition
        body_ = produce_body(TOPIC, 0, make_batch(0, [b"plain"]))
        assert produce_partition(wire.request(PRODUCE, 9, body_))[0] == 0
    deadline = time.monotonic() + 15
    while orphan in index_objects(broker_cluster) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert index_objects(broker_cluster) == referenced
