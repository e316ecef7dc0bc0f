"""A partition with more aborted transactions than its etcd state keeps: read_committed
consumers still see exactly the committed records, from offset 0, after an ownership move and
on a broker that never saw the partition.

Real broker processes on etcd and moto's S3 server, a real transactional producer and
read_committed consumer (confluent-kafka). The state's limit is lowered to 8
(``KAFSCALE_LOG__ABORTED_TXNS_IN_STATE``) so that 30+ aborts spill several index objects.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster
from harness.topics import create_topic

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.partition_state import PartitionState

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
    """Every value a read_committed consumer reads from offset 0: until ``expect`` arrived and
    a quiet second more (so that aborted records read as well would show), or 60 s."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **extra,
        }
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                values.append(message.value())
            if len(values) >= expect:
                deadline = min(deadline, time.monotonic() + 1)
    finally:
        consumer.close()
    return values


def partition_state(cluster: BrokerCluster) -> PartitionState:
    async def read() -> PartitionState:
        etcd = await Etcd.connect([cluster.etcd_url], timeout_s=5)
        try:
            entry = await etcd.get(keys.partition_state_key(cluster.cluster, TOPIC, 0))
            assert entry is not None
            return PartitionState.from_json(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def index_objects(cluster: BrokerCluster) -> list[str]:
    return [
        key
        for key in cluster.object_keys(f"{cluster.cluster}/topics/{TOPIC}/")
        if key.endswith(".atx")
    ]


def test_read_committed_sees_exactly_the_committed_records_past_the_state_limit(
    broker_cluster: BrokerCluster,
) -> None:
    first = broker_cluster.start(**ENV)
    create_topic(first.bootstrap, TOPIC, 1)
    expected = write_transactions(first.bootstrap, 40, "a")  # 30 aborted, 10 committed

    state = partition_state(broker_cluster)
    assert len(state.aborted_txns) <= LIMIT  # the etcd state stays bounded...
    assert len(state.aborted_txn_index) >= 2  # ...because the older aborts were spilled
    assert len(state.aborted_txns) + sum(r.txn_count for r in state.aborted_txn_index) == 30
    assert len(index_objects(broker_cluster)) == len(state.aborted_txn_index)
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
    assert moved.aborted_txn_index[: len(state.aborted_txn_index)] == state.aborted_txn_index
    assert len(moved.aborted_txns) + sum(r.txn_count for r in moved.aborted_txn_index) == 45
    assert read_committed(second.bootstrap, len(expected)) == expected

    # A broker that never read the partition learns the index objects from the state alone.
    second.kill()
    third = broker_cluster.start(**ENV)
    assert read_committed(third.bootstrap, len(expected)) == expected
