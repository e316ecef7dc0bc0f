"""Share groups (KIP-932, "queues for Kafka") with real brokers, etcd and librdkafka's
``ShareConsumer`` (confluent-kafka 2.16):

* two consumers of one share group on one partition together receive every record exactly
  once when each acknowledges (ACCEPT);
* a RELEASEd record comes back with its delivery count one higher; at the group's
  ``share.delivery.count.limit`` it is archived and never delivered again;
* records held by a consumer that dies (its connection closes) or whose acquisition lock
  expires go to another member;
* acknowledged records stay acknowledged across a broker crash (the partition's new owner
  reads the share-partition state from etcd), and unacknowledged ones are delivered again;
* a share group is listed with type "share", described by ShareGroupDescribe, and deleted
  once empty.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType
from harness import topics
from harness.brokers import BrokerCluster
from harness.kafka_wire import KafkaWire
from harness.share import (
    Received,
    poll_some,
    poll_until,
    produce,
    set_group_configs,
    share_consumer,
)

from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

EARLIEST = {"share.auto.offset.reset": "earliest"}


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def test_two_consumers_on_one_partition_get_every_record_once(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "workers", EARLIEST)
    first, second = Received(), Received()
    c1 = share_consumer(broker.bootstrap, "workers", "q")
    c2 = share_consumer(broker.bootstrap, "workers", "q")
    try:
        sent: list[bytes] = []
        for batch in range(6):
            new = values(50, f"b{batch}-")
            produce(broker.bootstrap, "q", new)
            sent += new
            poll_some(c1, first)
            poll_some(c2, second)
        deadline = time.monotonic() + 30
        while len(first.values) + len(second.values) < len(sent):
            assert time.monotonic() < deadline, "not everything was delivered"
            poll_some(c1, first)
            poll_some(c2, second)
        # Nothing more comes: every record was delivered once and acknowledged.
        for _ in range(3):
            poll_some(c1, first)
            poll_some(c2, second)
    finally:
        c1.close()
        c2.close()
    got = first.values + second.values
    assert sorted(got) == sorted(sent)
    assert len(set(got)) == len(got)
    assert {count for _, _, count in first.records + second.records} == {1}


def test_released_records_come_back_and_the_delivery_limit_archives_them(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "g", {**EARLIEST, "share.delivery.count.limit": "2"})
    produce(broker.bootstrap, "q", values(5))
    got = Received()
    consumer = share_consumer(broker.bootstrap, "g", "q")
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 5, ack=AcknowledgeType.RELEASE)
        assert [c for _, _, c in got.records[:5]] == [1] * 5
        poll_until(consumer, got, lambda: len(got.records) >= 10, ack=AcknowledgeType.RELEASE)
        assert [(v, c) for v, _, c in got.records[5:]] == [(v, 2) for v in values(5)]
        # Released at the limit (2): archived, never delivered again; new records still are.
        produce(broker.bootstrap, "q", [b"after"])
        poll_until(consumer, got, lambda: got.values[-1:] == [b"after"])
        for _ in range(4):
            poll_some(consumer, got)
    finally:
        consumer.close()
    assert got.values[10:] == [b"after"]
    assert got.records[-1][1:] == (5, 1)


DYING_CONSUMER = textwrap.dedent(
    """
    import os, sys
    from confluent_kafka import ShareConsumer
    c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([sys.argv[3]])
    got = 0
    while got == 0:
        got = len([m for m in c.poll(1.0) if m.error() is None])
    print(got, flush=True)
    os._exit(0)  # dies holding its records: no acknowledgement, no leave
    """
)


def test_records_of_a_consumer_that_dies_go_to_another_member(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "g", EARLIEST)
    produce(broker.bootstrap, "q", values(20))
    dying = subprocess.run(
        [sys.executable, "-c", DYING_CONSUMER, broker.bootstrap, "g", "q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dying.returncode == 0, dying.stderr[-2000:]
    held = int(dying.stdout.split()[0])
    assert held > 0
    got = Received()
    consumer = share_consumer(broker.bootstrap, "g", "q")
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 20)
    finally:
        consumer.close()
    assert sorted(got.values) == sorted(values(20))
    # The dead consumer's records were delivered a second time (well before the 30 s lock).
    assert sum(1 for _, _, count in got.records if count == 2) == held


def test_an_expired_acquisition_lock_makes_records_available_to_another_member(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "g", {**EARLIEST, "share.record.lock.duration.ms": "1500"})
    produce(broker.bootstrap, "q", values(10))
    slow, fast = Received(), Received()
    holder = share_consumer(broker.bootstrap, "g", "q")
    other = share_consumer(broker.bootstrap, "g", "q")
    try:
        poll_until(holder, slow, lambda: len(slow.records) >= 10, ack=None)
        # ``holder`` stays connected and never acknowledges: its locks run out.
        poll_until(other, fast, lambda: len(fast.records) >= 10)
    finally:
        other.close()
        holder.close()
    assert sorted(fast.values) == sorted(values(10))
    assert {count for _, _, count in fast.records} == {2}


def test_acknowledged_records_stay_acknowledged_across_a_broker_crash(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "g", EARLIEST)
    produce(broker.bootstrap, "q", values(30))
    accepted = Received()
    consumer = share_consumer(broker.bootstrap, "g", "q")
    try:
        poll_until(consumer, accepted, lambda: len(accepted.records) >= 30)
    finally:
        consumer.close()
    produce(broker.bootstrap, "q", values(10, "late"))
    held = Received()
    holder = share_consumer(broker.bootstrap, "g", "q")
    poll_until(holder, held, lambda: len(held.records) >= 10, ack=None)
    # Acquisitions ride the next flush round (250 ms), acknowledgements are answered only once
    # in etcd; give the round its time, so the delivery counts are there too.
    time.sleep(1)
    port = broker.port
    broker.kill()  # SIGKILL: no handoff, no final flush
    restarted = broker_cluster.start(port=port)
    after = Received()
    consumer = share_consumer(restarted.bootstrap, "g", "q")
    try:
        poll_until(consumer, after, lambda: len(after.records) >= 10, timeout_s=60)
        for _ in range(3):
            poll_some(consumer, after)
    finally:
        consumer.close()
        holder.close()
    # Only the records that were acquired but not acknowledged come again, counted twice.
    assert sorted(after.values) == sorted(values(10, "late"))
    assert {count for _, _, count in after.records} == {2}


def _list_groups(wire: KafkaWire, types: list[str]) -> dict[str, tuple[str, str]]:
    body = {"states_filter": [], "types_filter": types}
    return {g.group_id: (g.group_state, g.group_type) for g in wire.request(16, 5, body).groups}


def _describe(wire: KafkaWire, group: str) -> Any:
    body = {"group_ids": [group], "include_authorized_operations": False}
    (described,) = wire.request(77, 1, body).groups
    return described


def _delete(wire: KafkaWire, group: str) -> ErrorCode:
    (result,) = wire.request(42, 2, {"groups_names": [group]}).results
    return ErrorCode(result.error_code)


def test_share_groups_are_listed_described_and_deleted(broker_cluster: BrokerCluster) -> None:
    """ListGroups (with its types filter), ShareGroupDescribe and DeleteGroups, on the wire:
    confluent-kafka's admin client has no share group calls."""
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 2)
    consumers = [share_consumer(broker.bootstrap, "listed", "q") for _ in range(3)]
    with KafkaWire(broker.bootstrap) as wire:
        try:
            deadline = time.monotonic() + 30
            while len(_describe(wire, "listed").members) < 3:
                assert time.monotonic() < deadline, _describe(wire, "listed")
                for consumer in consumers:
                    poll_some(consumer, Received(), timeout_s=0.2)
            assert _list_groups(wire, ["share"]) == {"listed": ("Stable", "share")}
            assert "listed" not in _list_groups(wire, ["consumer", "classic"])
            described = _describe(wire, "listed")
            assert (described.error_code, described.group_state) == (ErrorCode.NONE, "Stable")
            assert described.assignor_name == "simple"
            # Three members, two partitions: every partition assigned, one to two members.
            held = [
                (tp.topic_name, p)
                for m in described.members
                for tp in m.assignment.topic_partitions
                for p in tp.partitions
            ]
            assert sorted(set(held)) == [("q", 0), ("q", 1)] and len(held) == 3
            assert _delete(wire, "listed") is ErrorCode.NON_EMPTY_GROUP
        finally:
            for consumer in consumers:
                consumer.close()
        assert _list_groups(wire, ["share"]) == {"listed": ("Empty", "share")}
        assert _delete(wire, "listed") is ErrorCode.NONE
        assert _list_groups(wire, []) == {}
        assert _describe(wire, "listed").error_code == ErrorCode.GROUP_ID_NOT_FOUND
