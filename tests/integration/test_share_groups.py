"""Share groups (KIP-932, "queues for Kafka") with real brokers, etcd and real clients:
librdkafka's ``ShareConsumer`` (confluent-kafka 2.16), the Java ``KafkaShareConsumer`` and the
Java Admin client (kafka-clients 4.3), and raw requests where no client exposes a call.

* two consumers of one share group on one partition together receive every record exactly
  once when each acknowledges (ACCEPT), with librdkafka and with the Java client;
* a RELEASEd record comes back with its delivery count one higher; at the group's
  ``share.delivery.count.limit`` it is archived and never delivered again;
* records held by a consumer that dies (its connection closes) or whose acquisition lock
  expires go to another member;
* acknowledged records stay acknowledged across a broker crash and across a handoff to another
  broker (the partition's new owner reads the share-partition state from etcd), and records
  acquired but not acknowledged are delivered again;
* read_committed share groups never deliver aborted records or transaction markers;
* bad requests get Kafka's error codes; share groups are listed with type "share", described,
  their offsets described, altered and deleted while empty, and the group deleted.
"""

from __future__ import annotations

import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer
from confluent_kafka.admin import AdminClient
from harness import children, topics
from harness.brokers import BrokerCluster, BrokerProcess, running_cluster
from harness.java_client import java_program
from harness.java_share import run_share_members
from harness.kafka_wire import KafkaWire, heartbeat, share_fetch, share_heartbeat
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.share import (
    Received,
    poll_some,
    poll_until,
    produce,
    set_group_configs,
    share_consumer,
    stored_share_state,
    wait_stored,
)

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

EARLIEST = {"share.auto.offset.reset": "earliest"}


@pytest.fixture(scope="module")
def shared_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """One broker for the tests that neither stop, add nor reconfigure brokers nor list every
    group, each on a topic and with groups of its own (``topic``): a broker started for each
    cost ~1.5 s of the suite's time. The others have clusters of their own."""
    with running_cluster(etcd_server, s3_server, tmp_path_factory, "share") as cluster:
        yield cluster


@pytest.fixture
def broker(shared_cluster: BrokerCluster) -> BrokerProcess:
    return shared_cluster.brokers[0]


@pytest.fixture
def topic(broker: BrokerProcess) -> str:
    """A new one-partition topic on the shared broker; the test's groups are named after it."""
    name = f"q-{uuid.uuid4().hex[:8]}"
    topics.create_topic(broker.bootstrap, name, 1)
    return name


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def wait_settled(cluster: BrokerCluster, group: str, topic: str, end: int) -> None:
    """Until the share-partition's stored start is ``end``: every record before it acknowledged
    or archived, none left that the group could be given again. (The tests polled 1.5-2 s of
    quiet rounds for that before; one quiet poll after this still watches for a record
    delivered again.)"""
    read = partial(stored_share_state, cluster.etcd_url, cluster.cluster, group, topic, 0)
    wait_stored(read, lambda state: state["start"] == end)


def test_two_consumers_on_one_partition_get_every_record_once(
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    group = f"workers-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    first, second = Received(), Received()
    c1 = share_consumer(broker.bootstrap, group, topic)
    c2 = share_consumer(broker.bootstrap, group, topic)
    try:
        sent: list[bytes] = []
        # Short polls in turn: whichever consumer the records went to, the other's poll does
        # not sit out half a second each round (the quiet rounds below keep theirs).
        for batch in range(6):
            new = values(50, f"b{batch}-")
            produce(broker.bootstrap, topic, new)
            sent += new
            poll_some(c1, first, timeout_s=0.1)
            poll_some(c2, second, timeout_s=0.1)
        deadline = time.monotonic() + 30
        while len(first.values) + len(second.values) < len(sent):
            assert time.monotonic() < deadline, "not everything was delivered"
            poll_some(c1, first, timeout_s=0.1)
            poll_some(c2, second, timeout_s=0.1)
        # Nothing more comes: every record was delivered once and acknowledged.
        wait_settled(shared_cluster, group, topic, len(sent))
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
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    group = f"g-{topic}"
    set_group_configs(broker.bootstrap, group, {**EARLIEST, "share.delivery.count.limit": "2"})
    produce(broker.bootstrap, topic, values(5))
    got = Received()
    consumer = share_consumer(broker.bootstrap, group, topic)
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 5, ack=AcknowledgeType.RELEASE)
        assert [c for _, _, c in got.records[:5]] == [1] * 5
        poll_until(consumer, got, lambda: len(got.records) >= 10, ack=AcknowledgeType.RELEASE)
        assert [(v, c) for v, _, c in got.records[5:]] == [(v, 2) for v in values(5)]
        # Released at the limit (2): archived, never delivered again; new records still are.
        produce(broker.bootstrap, topic, [b"after"])
        poll_until(consumer, got, lambda: got.values[-1:] == [b"after"])
        wait_settled(shared_cluster, group, topic, 6)  # 0-4 archived, 5 accepted
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
    broker: BrokerProcess, topic: str
) -> None:
    group = f"g-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    produce(broker.bootstrap, topic, values(20))
    dying = children.run(
        [sys.executable, "-c", DYING_CONSUMER, broker.bootstrap, group, topic],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dying.returncode == 0, dying.stderr[-2000:]
    held = int(dying.stdout.split()[0])
    assert held > 0
    got = Received()
    consumer = share_consumer(broker.bootstrap, group, topic)
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 20)
    finally:
        consumer.close()
    assert sorted(got.values) == sorted(values(20))
    # The dead consumer's records were delivered a second time (well before the 30 s lock).
    assert sum(1 for _, _, count in got.records if count == 2) == held


def test_an_expired_acquisition_lock_makes_records_available_to_another_member(
    broker: BrokerProcess, topic: str
) -> None:
    group = f"g-{topic}"
    set_group_configs(
        broker.bootstrap, group, {**EARLIEST, "share.record.lock.duration.ms": "1500"}
    )
    produce(broker.bootstrap, topic, values(10))
    slow, fast = Received(), Received()
    holder = share_consumer(broker.bootstrap, group, topic)
    other = share_consumer(broker.bootstrap, group, topic)
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
    # in etcd; wait for the round that carries the delivery counts (never a fixed sleep: a
    # loaded machine may take longer), so the new owner counts them.
    read = partial(stored_share_state, broker_cluster.etcd_url, broker_cluster.cluster, "g", "q", 0)
    wait_stored(read, lambda s: s["start"] == 30 and s["batches"] == [[30, 39, 1, 0]])
    port = broker.port
    broker.kill()  # SIGKILL: no handoff, no final flush
    restarted = broker_cluster.start(port=port)
    after = Received()
    consumer = share_consumer(restarted.bootstrap, "g", "q")
    try:
        poll_until(consumer, after, lambda: len(after.records) >= 10, timeout_s=60)
        wait_settled(broker_cluster, "g", "q", 40)
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


def test_a_topic_created_again_starts_its_share_partitions_over(
    broker_cluster: BrokerCluster,
) -> None:
    """A topic deleted and created again under its name is a new topic: a consumer that stays
    subscribed is sent its assignment again under the new topic id and gets the new records
    from the start; the old topic's share-partition state is not the new one's."""
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "q", 1)
    set_group_configs(broker.bootstrap, "again", EARLIEST)
    produce(broker.bootstrap, "q", values(8, "old"))
    got = Received()
    fast_metadata = {"topic.metadata.refresh.interval.ms": 500}
    consumer = share_consumer(broker.bootstrap, "again", "q", **fast_metadata)
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 8)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_topics(["q"])["q"].result(15)
        deadline = time.monotonic() + 30
        while "q" in admin.list_topics(timeout=5).topics:
            assert time.monotonic() < deadline, "the topic was not deleted"
            time.sleep(0.5)
        topics.create_topic(broker.bootstrap, "q", 1)
        produce(broker.bootstrap, "q", values(3, "new"))
        poll_until(consumer, got, lambda: len(got.records) >= 11, timeout_s=60)
    finally:
        consumer.close()
    assert got.values[8:] == values(3, "new")
    assert [count for _, _, count in got.records[8:]] == [1, 1, 1]


def _leader(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=15)
    return int(metadata.topics[topic].partitions[0].leader)


def test_a_new_owner_continues_the_share_partition_after_a_handoff(
    broker_cluster: BrokerCluster,
) -> None:
    """Two brokers; the partition's owner stops (SIGTERM: handoff). The other broker takes
    the partition over and reads the share-partition from etcd: accepted records are never
    delivered again, the rest are."""
    first, second = broker_cluster.start(), broker_cluster.start()
    bootstrap = broker_cluster.bootstrap
    topics.create_topic(bootstrap, "q", 1)
    set_group_configs(bootstrap, "handoff", EARLIEST)
    produce(bootstrap, "q", values(20))
    accepted = Received()
    consumer = share_consumer(bootstrap, "handoff", "q")
    try:
        poll_until(consumer, accepted, lambda: len(accepted.records) >= 20)
    finally:
        consumer.close()
    produce(bootstrap, "q", values(5, "after"))
    owner = first if _leader(bootstrap, "q") == first.node_id else second
    survivor = second if owner is first else first
    owner.stop()
    deadline = time.monotonic() + 30
    while _leader(survivor.bootstrap, "q") != survivor.node_id:
        assert time.monotonic() < deadline, "the survivor never took the partition"
        time.sleep(0.2)
    rest = Received()
    consumer = share_consumer(survivor.bootstrap, "handoff", "q")
    try:
        poll_until(consumer, rest, lambda: len(rest.records) >= 5)
        wait_settled(broker_cluster, "handoff", "q", 25)
        poll_some(consumer, rest)
    finally:
        consumer.close()
    assert rest.values == values(5, "after")


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


def _share_fetch(
    wire: KafkaWire,
    member: str,
    epoch: int,
    topic_id: Any,
    acks: list[Any] | None = None,
    *,
    group: str,
) -> Any:
    """A ShareFetch of partition 0, ten records at most."""
    return share_fetch(wire, group, member, epoch, topic_id, acks={0: acks or []}, max_records=10)


def _ack(first: int, last: int, kind: int = 1) -> dict[str, Any]:
    return {"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}


def test_bad_share_requests_get_kafkas_error_codes(broker: BrokerProcess, topic: str) -> None:
    group = f"bad-{topic}"
    other_group = f"classic-or-consumer-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    produce(broker.bootstrap, topic, values(5))
    with KafkaWire(broker.bootstrap) as wire:
        # Heartbeats: unknown member, a stale epoch, a join without topics, another type.
        ghost = share_heartbeat(wire, group, "ghost", 3, "q")
        assert ghost.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        joined = share_heartbeat(wire, group, "m1", 0, topic)
        assert (joined.error_code, joined.member_epoch) == (ErrorCode.NONE, 1)
        (assigned,) = joined.assignment.topic_partitions
        topic_id = assigned.topic_id
        stale = share_heartbeat(wire, group, "m1", 7, "q")
        assert stale.error_code == ErrorCode.FENCED_MEMBER_EPOCH
        empty = share_heartbeat(wire, group, "m2", 0, "q", subscribed_topic_names=[])
        assert empty.error_code == ErrorCode.INVALID_REQUEST
        heartbeat(wire, other_group, "c1", 0, subscribed_topic_names=[topic])
        other = share_heartbeat(wire, other_group, "m1", 0, topic)
        assert other.error_code == ErrorCode.GROUP_ID_NOT_FOUND
        consumer_hb = heartbeat(wire, group, "c1", 0, subscribed_topic_names=[topic])
        assert consumer_hb.error_code == ErrorCode.GROUP_ID_NOT_FOUND
        join = {
            "group_id": group,
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        }
        assert wire.request(11, 9, join).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        commit = {
            "group_id": group,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": None,
                        }
                    ],
                }
            ],
        }
        (committed,) = wire.request(8, 9, commit).topics[0].partitions
        assert committed.error_code == ErrorCode.GROUP_ID_NOT_FOUND
        # Sessions: none yet, then a wrong epoch; acknowledgements on the opening request.
        assert _share_fetch(wire, "m1", 4, topic_id, group=group).error_code == (
            ErrorCode.SHARE_SESSION_NOT_FOUND
        )
        opening_acks = _share_fetch(wire, "m1", 0, topic_id, [_ack(0, 0)], group=group)
        assert opening_acks.error_code == ErrorCode.INVALID_REQUEST
        fetched = _share_fetch(wire, "m1", 0, topic_id, group=group)
        (partition,) = fetched.responses[0].partitions
        assert [
            (a.first_offset, a.last_offset, a.delivery_count) for a in partition.acquired_records
        ] == [(0, 4, 1)]
        assert _share_fetch(wire, "m1", 5, topic_id, group=group).error_code == (
            ErrorCode.INVALID_SHARE_SESSION_EPOCH
        )
        # Acknowledging what this member does not hold: INVALID_RECORD_STATE, nothing changes.
        body = {
            "group_id": group,
            "member_id": "m1",
            "share_session_epoch": 1,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [{"partition_index": 0, "acknowledgement_batches": [_ack(3, 9)]}],
                }
            ],
        }
        (answer,) = wire.request(79, 1, body).responses[0].partitions
        assert answer.error_code == ErrorCode.INVALID_RECORD_STATE
        accepted = _share_fetch(wire, "m1", 2, topic_id, [_ack(0, 4)], group=group)
        (partition,) = accepted.responses[0].partitions
        assert partition.acknowledge_error_code == ErrorCode.NONE
        assert list(partition.acquired_records) == []
        # A broken acknowledgement type, and an epoch-0 ShareAcknowledge.
        broken = _share_fetch(wire, "m1", 3, topic_id, [_ack(0, 0, kind=9)], group=group)
        (partition,) = broken.responses[0].partitions
        assert partition.acknowledge_error_code == ErrorCode.INVALID_REQUEST
        # Overlapping or reversed batches: INVALID_REQUEST for the partition (Kafka's check).
        for epoch, acks in ((4, [_ack(0, 0), _ack(0, 0)]), (5, [_ack(3, 1)])):
            (partition,) = (
                _share_fetch(wire, "m1", epoch, topic_id, acks, group=group).responses[0].partitions
            )
            assert partition.acknowledge_error_code == ErrorCode.INVALID_REQUEST
        body["share_session_epoch"] = 0
        assert wire.request(79, 1, body).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        # The broker lives on.
        assert share_heartbeat(wire, group, "m1", 1, "q").error_code == ErrorCode.NONE


def test_share_group_offsets_are_described_with_their_lag(
    broker: BrokerProcess, topic: str
) -> None:
    """DescribeShareGroupOffsets: the start offset (SPSO) moves over accepted and rejected
    records at the window's start; the lag counts what is still to be done."""
    group = f"described-{topic}"
    nobody = f"nobody-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    produce(broker.bootstrap, topic, values(10))
    with KafkaWire(broker.bootstrap) as wire:
        joined = share_heartbeat(wire, group, "m1", 0, topic)
        topic_id = joined.assignment.topic_partitions[0].topic_id
        fetched = _share_fetch(wire, "m1", 0, topic_id, group=group)
        (partition,) = fetched.responses[0].partitions
        assert [(a.first_offset, a.last_offset) for a in partition.acquired_records] == [(0, 9)]
        acks = [_ack(0, 3), _ack(5, 5, kind=3)]
        acked = _share_fetch(wire, "m1", 1, topic_id, acks, group=group)
        assert acked.responses[0].partitions[0].acknowledge_error_code == ErrorCode.NONE
        body = {"groups": [{"group_id": group, "topics": None}]}
        (described,) = wire.request(90, 1, body).groups
        assert described.error_code == ErrorCode.NONE
        (described_topic,) = described.topics
        (offsets,) = described_topic.partitions
        assert (described_topic.topic_name, described_topic.topic_id) == (topic, topic_id)
        assert (offsets.start_offset, offsets.lag) == (4, 5)  # 4 and 6..9 to do, 5 rejected
        body = {"groups": [{"group_id": nobody, "topics": None}]}
        (missing,) = wire.request(90, 1, body).groups
        assert missing.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def _has(received: Received, count: int) -> bool:
    return len(received.records) >= count


def test_read_committed_share_groups_never_deliver_aborted_records(
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    """``share.isolation.level`` read_committed: aborted transactions and the
    control records are archived by the share-partition, never delivered; read_uncommitted
    delivers the aborted records too (never the markers). Either way the start offset reaches
    the end once everything delivered is accepted."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in (b"aborted-1", b"aborted-2"):
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0  # in the log before the abort (else never sent at all)
    producer.abort_transaction(30)
    producer.begin_transaction()
    for value in (b"committed-1", b"committed-2"):
        producer.produce(topic, value=value, partition=0)
    producer.commit_transaction(30)
    produce(broker.bootstrap, topic, [b"plain"])
    expected = {
        "committed": [b"committed-1", b"committed-2", b"plain"],
        "uncommitted": [b"aborted-1", b"aborted-2", b"committed-1", b"committed-2", b"plain"],
    }
    for name, wanted in expected.items():
        group = f"{name}-{topic}"
        level = "read_committed" if name == "committed" else "read_uncommitted"
        set_group_configs(broker.bootstrap, group, {**EARLIEST, "share.isolation.level": level})
        got = Received()
        consumer = share_consumer(broker.bootstrap, group, topic)
        try:
            poll_until(consumer, got, partial(_has, got, len(wanted)))
            # 0-1 aborted, 2 its marker, 3-4 committed, 5 their marker, 6 plain: all done.
            wait_settled(shared_cluster, group, topic, 7)
            poll_some(consumer, got)
        finally:
            consumer.close()
        assert got.values == wanted
        with KafkaWire(broker.bootstrap) as wire:
            body = {"groups": [{"group_id": group, "topics": None}]}
            (offsets,) = wire.request(90, 1, body).groups[0].topics[0].partitions
        # 0-1 aborted, 2 its marker, 3-4 committed, 5 their marker, 6 plain: all done.
        assert (offsets.start_offset, offsets.lag) == (7, 0)


def _acquired(response: Any) -> list[tuple[int, int, int]]:
    (partition,) = response.responses[0].partitions
    return [(a.first_offset, a.last_offset, a.delivery_count) for a in partition.acquired_records]


def test_share_group_offsets_are_altered_and_deleted_while_the_group_is_empty(
    broker: BrokerProcess, topic: str
) -> None:
    group = f"adm-{topic}"
    consumers = f"consumers-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    produce(broker.bootstrap, topic, values(10))
    alter = {
        "group_id": group,
        "topics": [
            {"topic_name": topic, "partitions": [{"partition_index": 0, "start_offset": 3}]}
        ],
    }
    with KafkaWire(broker.bootstrap) as wire:
        topic_id = (
            share_heartbeat(wire, group, "m1", 0, topic).assignment.topic_partitions[0].topic_id
        )
        assert _acquired(_share_fetch(wire, "m1", 0, topic_id, group=group)) == [(0, 9, 1)]
        _share_fetch(wire, "m1", 1, topic_id, [_ack(0, 9)], group=group)
        assert wire.request(91, 0, alter).error_code == ErrorCode.NON_EMPTY_GROUP
        _share_fetch(wire, "m1", -1, topic_id, group=group)
        assert share_heartbeat(wire, group, "m1", -1, "q").error_code == ErrorCode.NONE
        altered = wire.request(91, 0, alter)
        assert altered.error_code == ErrorCode.NONE
        assert altered.responses[0].partitions[0].error_code == ErrorCode.NONE
        described = wire.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
        assert described.groups[0].topics[0].partitions[0].start_offset == 3
        # The next member starts at the altered offset, with fresh delivery counts.
        share_heartbeat(wire, group, "m2", 0, topic)
        assert _acquired(_share_fetch(wire, "m2", 0, topic_id, group=group)) == [(3, 9, 1)]
        _share_fetch(wire, "m2", 1, topic_id, [_ack(3, 9)], group=group)
        _share_fetch(wire, "m2", -1, topic_id, group=group)
        share_heartbeat(wire, group, "m2", -1, "q")
        deleted = wire.request(92, 0, {"group_id": group, "topics": [{"topic_name": topic}]})
        assert (deleted.error_code, deleted.responses[0].error_code) == (0, 0)
        described = wire.request(90, 1, {"groups": [{"group_id": group, "topics": None}]})
        assert list(described.groups[0].topics) == []
        # No state: the next member starts at share.auto.offset.reset (earliest here).
        share_heartbeat(wire, group, "m3", 0, topic)
        assert _acquired(_share_fetch(wire, "m3", 0, topic_id, group=group)) == [(0, 9, 1)]
        # Another group type's id is not a share group.
        heartbeat(wire, consumers, "c1", 0, subscribed_topic_names=[topic])
        other = wire.request(91, 0, {**alter, "group_id": consumers})
        assert other.error_code == ErrorCode.GROUP_ID_NOT_FOUND


# --- the Java client (KafkaShareConsumer, kafka-clients 4.3) ----------------------------------

JAVA_SOURCE = Path(__file__).with_name("java") / "ShareMember.java"


def _java_members(
    cluster: BrokerCluster,
    group: str,
    topic: str,
    mode: str,
    count: int,
    deliveries: int,
    sent: int,
) -> list[list[tuple[str, int, int]]]:
    """``count`` Java share consumers of ``group`` on ``topic`` run at once until together
    they got ``deliveries`` records: the (value, offset, delivery count) each printed. Then
    nothing more can come: the share-partition's stored start is past all ``sent`` records
    (every one acknowledged ACCEPT, durably), so none is left to deliver again."""
    bootstrap = cluster.brokers[0].bootstrap
    seen = run_share_members(JAVA_SOURCE, [bootstrap, group, topic, mode], count, deliveries)
    read = partial(stored_share_state, cluster.etcd_url, cluster.cluster, group, topic, 0)
    wait_stored(read, lambda state: state["start"] == sent)
    return seen


def test_java_share_consumers_split_one_partition_exactly_once(
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    group = f"java-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    sent = [v.decode() for v in values(300)]
    produce(broker.bootstrap, topic, [v.encode() for v in sent])
    seen = _java_members(shared_cluster, group, topic, "accept", 2, 300, 300)
    got = [value for member in seen for value, _, _ in member]
    assert sorted(got) == sorted(sent) and len(set(got)) == len(got)
    assert {count for member in seen for _, _, count in member} == {1}


def test_java_share_consumer_gets_released_records_again(
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    group = f"java-{topic}"
    set_group_configs(broker.bootstrap, group, EARLIEST)
    produce(broker.bootstrap, topic, values(20))
    (seen,) = _java_members(shared_cluster, group, topic, "release-once", 1, 40, 20)
    by_value: dict[str, list[int]] = {}
    for value, _, count in seen:
        by_value.setdefault(value, []).append(count)
    assert by_value == {v.decode(): [1, 2] for v in values(20)}


ADMIN_SOURCE = Path(__file__).with_name("java") / "ShareAdmin.java"


def _java_admin(*steps: str) -> list[list[str]]:
    """Each step ("describe,BOOTSTRAP,GROUP", "alter,BOOTSTRAP,GROUP,TOPIC,P,OFFSET", ...) run
    in order by one JVM: each step's lines, ending with "done" or "error ..."."""
    done = children.run(
        [*java_program(ADMIN_SOURCE, "ShareAdmin"), *steps],
        capture_output=True,
        text=True,
        timeout=120,
    )
    answers: list[list[str]] = [[]]
    for line in done.stdout.splitlines():
        answers[-1].append(line)
        if line == "done" or line.startswith("error "):
            answers.append([])
    assert done.returncode == 0 and len(answers) == len(steps) + 1, done.stderr[-3000:]
    return answers[:-1]


def test_the_java_admin_describes_alters_and_deletes_share_groups(
    shared_cluster: BrokerCluster, broker: BrokerProcess, topic: str
) -> None:
    """What ``kafka-share-groups.sh`` does through the Java Admin client: describe a share
    group, list its offsets (start offset and lag), alter and delete them, delete the group;
    the offset calls also through the proxy, which forwards them to the group's coordinator."""
    group = f"ops-{topic}"
    bootstrap = broker.bootstrap
    set_group_configs(bootstrap, group, EARLIEST)
    produce(bootstrap, topic, values(10))
    got = Received()
    consumer = share_consumer(bootstrap, group, topic)
    try:
        poll_until(consumer, got, lambda: len(got.records) >= 10)
        described, refused = _java_admin(
            f"describe,{bootstrap},{group}", f"alter,{bootstrap},{group},{topic},0,4"
        )
        assert described[0] == "group Stable 1 1"
        assert refused[0].startswith("error GroupNotEmptyException")
    finally:
        consumer.close()
    proxy = start_proxy(shared_cluster).bootstrap
    assert _java_admin(
        f"offsets,{bootstrap},{group}",
        f"alter,{proxy},{group},{topic},0,4",
        f"offsets,{proxy},{group}",
        f"describe,{proxy},{group}",
    ) == [
        [f"offset {topic} 0 10 0", "done"],
        ["done"],
        [f"offset {topic} 0 4 6", "done"],
        ["group Empty 0 2", "done"],
    ]
    again = Received()
    consumer = share_consumer(bootstrap, group, topic)
    try:
        poll_until(consumer, again, lambda: len(again.records) >= 6)
    finally:
        consumer.close()
    assert sorted(again.values) == sorted(values(10)[4:])
    deleted = _java_admin(
        f"delete-offsets,{bootstrap},{group},{topic}",
        f"offsets,{bootstrap},{group}",
        f"delete,{bootstrap},{group}",
        f"describe,{bootstrap},{group}",
    )
    assert deleted[:3] == [["done"], ["done"], ["done"]]
    assert deleted[3][0].startswith("error GroupIdNotFound")


def _part(index: int) -> dict[str, Any]:
    return {"partition_index": index, "acknowledgement_batches": []}


def test_a_share_session_keeps_only_partitions_that_exist(broker_cluster: BrokerCluster) -> None:
    """Unknown topic ids and partitions are answered UNKNOWN_TOPIC_ID once and never join the
    session: a later fetch of the session does not answer them again (nor keeps them in
    memory), and a partition named with acknowledgements but forgotten acquires nothing."""
    broker = broker_cluster.start()
    topics.create_topic(broker.bootstrap, "known", 1)
    set_group_configs(broker.bootstrap, "sessions", EARLIEST)
    produce(broker.bootstrap, "known", values(3))
    with KafkaWire(broker.bootstrap) as wire:
        joined = share_heartbeat(wire, "sessions", "m1", 0, "q", subscribed_topic_names=["known"])
        (assigned,) = joined.assignment.topic_partitions
        known = assigned.topic_id
        ghost = uuid.uuid4()
        body = {
            "group_id": "sessions",
            "member_id": "m1",
            "share_session_epoch": 0,
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "max_records": 10,
            "batch_size": 10,
            "topics": [
                {"topic_id": known, "partitions": [_part(0), _part(7)]},
                {"topic_id": ghost, "partitions": [_part(0)]},
            ],
            "forgotten_topics_data": [],
        }
        first = wire.request(78, 1, body)
        answered = {
            (t.topic_id, p.partition_index): p.error_code
            for t in first.responses
            for p in t.partitions
        }
        assert answered == {
            (known, 0): ErrorCode.NONE,
            (known, 7): ErrorCode.UNKNOWN_TOPIC_ID,
            (ghost, 0): ErrorCode.UNKNOWN_TOPIC_ID,
        }
        body.update(share_session_epoch=1, topics=[])
        second = wire.request(78, 1, body)
        assert second.error_code == ErrorCode.NONE
        again = {(t.topic_id, p.partition_index) for t in second.responses for p in t.partitions}
        assert again <= {(known, 0)}
        # Forgotten with its acknowledgements: they count, nothing more is acquired there.
        (acquired,) = first.responses[0].partitions[0].acquired_records
        body.update(
            share_session_epoch=2,
            topics=[
                {
                    "topic_id": known,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "acknowledgement_batches": [
                                _ack(acquired.first_offset, acquired.last_offset, kind=2)
                            ],
                        }
                    ],
                }
            ],
            forgotten_topics_data=[{"topic_id": known, "partitions": [0]}],
        )
        third = wire.request(78, 1, body)
        (partition,) = third.responses[0].partitions
        assert partition.acknowledge_error_code == ErrorCode.NONE
        assert list(partition.acquired_records) == []
        # A group nobody joined gets no share session or share-partition (nor any state in
        # etcd): its member is not in the group.
        stranger = _share_fetch(wire, "m9", 0, known, group="nobody")
        assert stranger.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert not [k for k in broker_cluster.etcd_keys("share-state/") if "nobody" in k]


def _coordinators(bootstrap: str, groups: list[str]) -> dict[str, str]:
    """Each group's coordinator address (FindCoordinator v4, key type 0)."""
    with KafkaWire(bootstrap) as wire:
        found = wire.request(10, 4, {"key_type": 0, "coordinator_keys": groups})
    answer: dict[str, str] = {}
    for entry in found.coordinators:
        assert entry.error_code == ErrorCode.NONE, entry
        answer[str(entry.key)] = f"{entry.host}:{entry.port}"
    return answer


def _join_at_coordinator(bootstrap: str, group: str, member: str) -> Any:
    """A share group join sent to the group's coordinator, found again while it moves."""
    deadline = time.monotonic() + 60
    while True:
        address = _coordinators(bootstrap, [group])[group]
        with KafkaWire(address) as wire:
            answer = share_heartbeat(wire, group, member, 0, "q")
        if answer.error_code not in (
            ErrorCode.NOT_COORDINATOR,
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


def test_a_flood_of_invented_share_groups_stops_at_the_cluster_s_bound(
    broker_cluster: BrokerCluster,
) -> None:
    """ShareGroupHeartbeat joins with invented group ids, each sent to its own coordinator on
    two brokers: the cluster keeps at most ``groups.share_max_groups`` share groups (here 5,
    counted across both coordinators), answers the rest GROUP_MAX_SIZE_REACHED with a message
    naming the bound, and takes no group lease for them. Existing groups still take members,
    and deleting a group makes room for a new one."""
    bound = {"KAFSCALE_GROUPS__SHARE_MAX_GROUPS": "5"}
    first = broker_cluster.start(**bound)
    broker_cluster.start(**bound)
    topics.create_topic(first.bootstrap, "q", 1)
    bootstrap = first.bootstrap
    flood = [f"flood-{i}" for i in range(40)]
    homes = set(_coordinators(bootstrap, flood).values())
    assert len(homes) == 2, "the flood's groups should have both brokers as coordinators"
    answers = {group: _join_at_coordinator(bootstrap, group, f"m-{group}") for group in flood}
    accepted = [g for g, a in answers.items() if a.error_code == ErrorCode.NONE]
    refused = [g for g, a in answers.items() if a.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED]
    assert len(accepted) == 5 and len(refused) == 35, {g: a.error_code for g, a in answers.items()}
    assert "5 share groups" in str(answers[refused[0]].error_message)
    leased = {key.rsplit("/", 1)[-1] for key in broker_cluster.etcd_keys("leases/groups/")}
    assert not leased & set(refused), "refused group ids took group leases"
    # An existing share group still takes a new member; a new group is still refused.
    assert _join_at_coordinator(bootstrap, accepted[0], "second").error_code == ErrorCode.NONE
    late = _join_at_coordinator(bootstrap, "late", "m-late")
    assert late.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    # An emptied, deleted group makes room.
    gone = accepted[1]
    with KafkaWire(_coordinators(bootstrap, [gone])[gone]) as wire:
        joined = answers[gone]
        left = share_heartbeat(wire, gone, f"m-{gone}", -1, "q")
        assert left.error_code == ErrorCode.NONE and joined.member_epoch > 0
        assert _delete(wire, gone) is ErrorCode.NONE
    deadline = time.monotonic() + 60
    while (late := _join_at_coordinator(bootstrap, "late", "m-late")).error_code:
        assert late.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED, late
        assert time.monotonic() < deadline, "deleting a share group never made room"
        time.sleep(0.2)
