"""The Spark source reads what a read_committed consumer reads: committed transactions and
plain records, never an aborted transaction's records, the markers, or an open transaction."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import PRODUCE as PRODUCE_KEY
from harness.kafka_wire import KafkaWire, produce_body, produce_partition, while_leader_moves
from harness.spark import source_options
from harness.topics import create_topic
from harness.txn_wire import produce_transactional, write_marker

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]
TOPIC = "txn-source"


def test_batch_reads_skip_aborted_records_markers_and_open_transactions(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    # The test plays the coordinator (made-up producer ids): no KIP-890 check with a real one.
    broker = broker_cluster.start(KAFSCALE_TRANSACTIONS__PARTITION_VERIFICATION="false")
    create_topic(broker.bootstrap, TOPIC, 1)
    with KafkaWire(broker.bootstrap) as wire:

        def plain(value: bytes) -> None:
            body = produce_body(TOPIC, 0, make_batch(0, [value]))
            assert produce_partition(wire.request(PRODUCE_KEY, 9, body))[0] == 0

        def txn(values: list[bytes], pid: int, sequence: int) -> None:
            code, _ = produce_transactional(
                wire, TOPIC, 0, values, producer_id=pid, sequence=sequence
            )
            assert code == 0

        def end(pid: int, commit: bool) -> None:
            assert write_marker(wire, TOPIC, 0, producer_id=pid, commit=commit) == 0

        plain(b"p0")  # 0
        txn([b"c1", b"c2"], pid=1, sequence=0)  # 1-2
        txn([b"a1", b"a2"], pid=2, sequence=0)  # 3-4
        plain(b"p1")  # 5
        end(1, commit=True)  # 6
        txn([b"a3"], pid=2, sequence=2)  # 7
        end(2, commit=False)  # 8
        txn([b"c3"], pid=1, sequence=2)  # 9
        end(1, commit=True)  # 10
        plain(b"p2")  # 11
        txn([b"open"], pid=3, sequence=0)  # 12: still open
        plain(b"behind-open")  # 13

    def read() -> list[tuple[int, bytes]]:
        df = (
            spark.read.format("kafscale")
            .options(**source_options(broker_cluster))
            .option("subscribe", TOPIC)
            .load()
        )
        return sorted((r.offset, bytes(r.value)) for r in df.select("offset", "value").collect())

    assert read() == [
        (0, b"p0"),
        (1, b"c1"),
        (2, b"c2"),
        (5, b"p1"),
        (9, b"c3"),
        (11, b"p2"),
    ]
    with KafkaWire(broker.bootstrap) as wire:
        assert write_marker(wire, TOPIC, 0, producer_id=3, commit=True) == 0
    assert [v for _, v in read()][-3:] == [b"p2", b"open", b"behind-open"]


def test_aborted_records_stay_skipped_past_the_state_limit(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    """More aborted transactions than the partition state keeps (its limit lowered to 8): the
    older ones live in index objects, and the source skips their records all the same, also in
    small tasks and after the partition moved to another owner."""
    topic = "txn-many-aborts"
    env = {
        "KAFSCALE_LOG__ABORTED_TXNS_IN_STATE": "8",
        "KAFSCALE_TRANSACTIONS__PARTITION_VERIFICATION": "false",  # made-up producer ids
    }

    def write(bootstrap: str, first_pid: int, rounds: int) -> list[bytes]:
        committed: list[bytes] = []
        with KafkaWire(bootstrap) as wire:
            for i in range(rounds):
                pid = first_pid + i
                values = [b"%d-%d" % (pid, j) for j in range(2)]
                send = functools.partial(
                    produce_transactional, wire, topic, 0, values, producer_id=pid, sequence=0
                )
                code, _ = while_leader_moves(send)  # the second owner may not hold it yet
                assert code == 0
                commit = i % 4 == 3
                assert write_marker(wire, topic, 0, producer_id=pid, commit=commit) == 0
                committed += values if commit else []
        return committed

    def read(**options: str) -> list[bytes]:
        df = (
            spark.read.format("kafscale")
            .options(**source_options(broker_cluster), **options)
            .option("subscribe", topic)
            .load()
        )
        return [bytes(r.value) for r in df.select("offset", "value").orderBy("offset").collect()]

    first = broker_cluster.start(**env)
    create_topic(first.bootstrap, topic, 1)
    expected = write(first.bootstrap, 1000, 40)  # 30 aborted
    assert any(k.endswith(".atx") for k in broker_cluster.object_keys(broker_cluster.cluster))
    assert read() == expected
    assert read(minPartitions="6") == expected  # tasks of a few segments each

    second = broker_cluster.start(**env)
    first.stop()
    expected += write(second.bootstrap, 2000, 20)  # the new owner spills more
    assert read() == expected
