"""OffsetFetch at a broker that does not coordinate the group answers from etcd.

Committed offsets live in etcd, and a coordinator acks a commit only once etcd holds it, so any
broker can answer OffsetFetch. It must: librdkafka (2.16, issue 5586) sends the OffsetFetch of a
new assignment to the broker it last found as the group's coordinator and, answered
NOT_COORDINATOR, only looks the coordinator up again; it never sends that OffsetFetch again, the
partitions stay "queried" and the consumer reads nothing for good. A group moves between
brokers (let go and taken by another, a drain, a stop) while a client holds on to the old
coordinator: an ``assign()`` user has no heartbeat that would ever look again.

Answered from etcd, the offsets are the coordinator's (a commit acked there is seen at once),
``require_stable`` (KIP-447) is told UNSTABLE_OFFSET_COMMIT while a transaction that sent
offsets is open, the read takes no lease, and the requests only a coordinator can answer keep
NOT_COORDINATOR (OffsetCommit, which clients retry; a v9 OffsetFetch naming a KIP-848 member's
epoch). A broker that cannot read etcd (the one taking the group over, during an etcd leader
election) answers COORDINATOR_LOAD_IN_PROGRESS, which librdkafka sends again, not
COORDINATOR_NOT_AVAILABLE, which strands it as NOT_COORDINATOR does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster, BrokerProcess, metric_value, new_cluster
from harness.etcd import harness_etcd
from harness.groups import GROUP_ENV, open_transaction
from harness.kafka_wire import KafkaWire, share_heartbeat
from harness.s3 import S3Endpoint
from harness.topics import create_topic

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
DEADLINE_S = 60.0  # generous: the machine is shared


@pytest.fixture(scope="module")
def two_brokers(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """Two brokers shared by the module's tests (each with its own topic and group)."""
    workdir: Path = tmp_path_factory.mktemp("offsets-elsewhere")
    cluster = new_cluster(etcd_server.client_url, s3_server, workdir, "elsewhere")
    try:
        cluster.start(**GROUP_ENV)
        cluster.start(**GROUP_ENV)
        yield cluster
    finally:
        cluster.stop_all()


def name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


def coordinator_of(broker: BrokerProcess, group: str) -> int:
    """FindCoordinator's answer at ``broker``: the group's lease holder, else its pick."""
    with KafkaWire(broker.bootstrap) as wire:
        found = wire.request(FIND_COORDINATOR, 1, {"key": group, "key_type": 0})
    assert found.error_code == ErrorCode.NONE
    return int(found.node_id)


def split(cluster: BrokerCluster, node_id: int) -> tuple[BrokerProcess, BrokerProcess]:
    """(the broker ``node_id``, the other one)."""
    first, second = cluster.brokers
    return (first, second) if first.node_id == node_id else (second, first)


def commit(broker: BrokerProcess, group: str, topic: str, offsets: dict[int, int]) -> list[int]:
    """OffsetCommit v8 of a consumer outside group management: each partition's error code."""
    partitions = [
        {"partition_index": p, "committed_offset": o, "committed_metadata": f"m{o}"}
        for p, o in offsets.items()
    ]
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [{"name": topic, "partitions": partitions}],
    }
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        answer = wire.request(OFFSET_COMMIT, 8, body)
    return [int(p.error_code) for t in answer.topics for p in t.partitions]


def fetch_v8(
    broker: BrokerProcess,
    group: str,
    topics: list[dict[str, Any]] | None,
    *,
    stable: bool = False,
    member: tuple[str | None, int] = (None, -1),
    version: int = 8,
) -> Any:
    """OffsetFetch v8/v9 of one group: the group's entry of the answer."""
    entry: dict[str, Any] = {"group_id": group, "topics": topics}
    if version >= 9:
        entry.update(member_id=member[0], member_epoch=member[1])
    body = {"groups": [entry], "require_stable": stable}
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        (answer,) = wire.request(OFFSET_FETCH, version, body).groups
    return answer


def offsets_of(group_answer: Any) -> dict[tuple[str, int], tuple[int, str, int]]:
    """(topic, partition): (offset, metadata, error code) of a group's (or v0-7's) answer."""
    return {
        (t.name, p.partition_index): (p.committed_offset, p.metadata or "", p.error_code)
        for t in group_answer.topics
        for p in t.partitions
    }


def test_a_broker_that_is_not_the_coordinator_answers_the_committed_offsets(
    two_brokers: BrokerCluster,
) -> None:
    topic, group = name("t"), name("g")
    create_topic(two_brokers.bootstrap, topic, 3)
    assert commit(two_brokers.brokers[0], group, topic, {0: 5, 1: 7}) == [0, 0]
    holder, other = split(two_brokers, coordinator_of(two_brokers.brokers[0], group))
    asked = [{"name": topic, "partition_indexes": [0, 1, 2]}]

    answer = fetch_v8(other, group, asked)
    assert answer.error_code == ErrorCode.NONE  # NOT_COORDINATOR before
    assert offsets_of(answer) == {
        (topic, 0): (5, "m5", 0),
        (topic, 1): (7, "m7", 0),
        (topic, 2): (-1, "", 0),
    }
    every = fetch_v8(other, group, None)  # all of the group's offsets
    assert offsets_of(every) == {(topic, 0): (5, "m5", 0), (topic, 1): (7, "m7", 0)}
    # v7 (group error at the top) and v1 (errors per partition) alike
    body = {"group_id": group, "topics": asked, "require_stable": False}
    with KafkaWire(other.bootstrap) as wire:
        v7 = wire.request(OFFSET_FETCH, 7, body)
        v1 = wire.request(OFFSET_FETCH, 1, {"group_id": group, "topics": asked})
    assert v7.error_code == ErrorCode.NONE
    assert offsets_of(v7)[(topic, 1)] == (7, "m7", 0)
    assert offsets_of(v1)[(topic, 0)] == (5, "m5", 0)

    # A commit the coordinator acked is what the other broker answers next.
    assert commit(holder, group, topic, {1: 9}) == [0]
    assert offsets_of(fetch_v8(other, group, asked))[(topic, 1)] == (9, "m9", 0)

    # The reads took no lease: the group stays where it is, and what only its coordinator
    # can do is still refused elsewhere (OffsetCommit: librdkafka looks again and retries).
    assert coordinator_of(other, group) == holder.node_id
    assert commit(other, group, topic, {0: 6}) == [ErrorCode.NOT_COORDINATOR]
    # A KIP-848 member's epoch only its coordinator knows: NOT_COORDINATOR, as before.
    named = fetch_v8(other, group, asked, member=("someone", 3), version=9)
    assert named.error_code == ErrorCode.NOT_COORDINATOR
    anonymous = fetch_v8(other, group, asked, version=9)  # librdkafka's: null, -1
    assert offsets_of(anonymous)[(topic, 1)] == (9, "m9", 0)


def test_a_share_group_elsewhere_is_group_id_not_found_as_at_its_coordinator(
    two_brokers: BrokerCluster,
) -> None:
    """A share group keeps no committed offsets (KIP-932): its coordinator answers OffsetFetch
    GROUP_ID_NOT_FOUND (Kafka's ``ShareGroup.validateOffsetFetch``). The other broker, reading
    etcd, answered NONE with no offsets, as for a consumer group that committed none."""
    topic, group = name("t"), name("share")
    create_topic(two_brokers.bootstrap, topic, 1)
    holder, other = split(two_brokers, coordinator_of(two_brokers.brokers[0], group))
    with KafkaWire(holder.bootstrap) as wire:
        assert share_heartbeat(wire, group, "m1", 0, topic).error_code == ErrorCode.NONE
    asked = [{"name": topic, "partition_indexes": [0]}]
    assert fetch_v8(holder, group, asked).error_code == ErrorCode.GROUP_ID_NOT_FOUND

    elsewhere = fetch_v8(other, group, asked)
    assert (elsewhere.error_code, offsets_of(elsewhere)) == (ErrorCode.GROUP_ID_NOT_FOUND, {})
    assert fetch_v8(other, group, None).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    with KafkaWire(other.bootstrap) as wire:  # v1: no group-level error, each partition's
        v1 = wire.request(OFFSET_FETCH, 1, {"group_id": group, "topics": asked})
    assert offsets_of(v1) == {(topic, 0): (-1, "", ErrorCode.GROUP_ID_NOT_FOUND)}
    assert coordinator_of(other, group) == holder.node_id  # the reads took no lease


UNREADABLE = "kafscale_group_records_unreadable_total"


def corrupt_group(cluster: BrokerCluster, group: str) -> None:
    """A group whose metadata record does not decode (a broken restore, an ``etcdctl put``)."""

    async def write() -> None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            await etcd.put(keys.group_metadata_key(cluster.cluster, group), b"\xff not json")
        finally:
            await etcd.close()

    asyncio.run(write())


def test_an_unreadable_group_elsewhere_is_reported_as_at_its_coordinator(
    two_brokers: BrokerCluster,
) -> None:
    """A coordinator that meets a group record it cannot decode answers UNKNOWN_SERVER_ERROR,
    logs a WARNING naming the group and counts it (``kafscale_group_records_unreadable_total``),
    so an operator learns what to repair. The other broker answered the same code but said
    nothing and counted nothing: a client asking there left no trace. (The record goes bad
    under a coordinator that holds the group: a broker asked for a group nobody holds takes
    it on, and reports it as its coordinator.)"""
    topic, group = name("t"), name("bad")
    create_topic(two_brokers.bootstrap, topic, 1)
    assert commit(two_brokers.brokers[0], group, topic, {0: 5}) == [0]
    holder, other = split(two_brokers, coordinator_of(two_brokers.brokers[0], group))
    corrupt_group(two_brokers, group)
    before = metric_value(other, UNREADABLE)

    answer = fetch_v8(other, group, None)

    assert answer.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    assert metric_value(other, UNREADABLE) == before + 1
    reported = [
        line
        for line in other.log_path.read_text(errors="replace").splitlines()
        if f"group {group} is not served" in line
    ]
    assert len(reported) == 1 and "WARNING" in reported[0], reported
    assert coordinator_of(other, group) == holder.node_id  # the read took no lease


def test_require_stable_elsewhere_is_unstable_while_a_transaction_with_offsets_is_open(
    two_brokers: BrokerCluster,
) -> None:
    topic, group = name("t"), name("g")
    create_topic(two_brokers.bootstrap, topic, 2)
    bootstrap = two_brokers.bootstrap
    asked = [{"name": topic, "partition_indexes": [0, 1]}]
    with open_transaction(bootstrap, group, topic, 1, {0: 3}) as txn:
        _, other = split(two_brokers, coordinator_of(two_brokers.brokers[0], group))
        stable = fetch_v8(other, group, asked, stable=True)
        assert stable.error_code == ErrorCode.NONE  # NOT_COORDINATOR before
        assert offsets_of(stable) == {
            (topic, 0): (-1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT),
            (topic, 1): (-1, "", 0),
        }
        # read_uncommitted: the offset committed so far (none)
        assert offsets_of(fetch_v8(other, group, asked))[(topic, 0)] == (-1, "", 0)
        txn.commit_transaction(30)
    # Once the transaction's markers are written, its offset is the committed one everywhere.
    deadline = time.monotonic() + DEADLINE_S
    while (seen := offsets_of(fetch_v8(other, group, asked, stable=True)))[(topic, 0)][0] != 3:
        assert time.monotonic() < deadline, f"the transaction's offset: {seen}"
        time.sleep(0.1)
    assert seen[(topic, 0)] == (3, "", 0)


def stats_consumer(bootstrap: str, group: str) -> tuple[Consumer, list[dict[str, Any]]]:
    """A librdkafka consumer of ``group`` (no auto commit) and the statistics it reports every
    100 ms, which say where it thinks the group's coordinator is."""
    stats: list[dict[str, Any]] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.append(json.loads(text)),
        }
    )
    return consumer, stats


def coordinator_found(consumer: Consumer, stats: list[dict[str, Any]]) -> None:
    """Polls ``consumer`` until librdkafka's statistics show its group's coordinator found
    and connected (cgrp state "up")."""
    deadline = time.monotonic() + DEADLINE_S
    while not stats or stats[-1].get("cgrp", {}).get("state") != "up":
        assert time.monotonic() < deadline, stats[-1:] or "no statistics"
        consumer.poll(0.1)


def values_read(consumer: Consumer, count: int) -> list[bytes]:
    """The values ``consumer`` delivers until it has ``count`` (or the deadline passes)."""
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def test_librdkafka_assign_after_the_group_moved_reads_from_the_committed_offset(
    two_brokers: BrokerCluster,
) -> None:
    """librdkafka 5586's reproducer: the consumer found broker A as the group's coordinator,
    then broker B took the group (here: a commit there while A held no lease), then the
    consumer is assigned a partition: its OffsetFetch goes to A. Answered NOT_COORDINATOR the
    partition was never fetched (the coordinator query that follows never resends it)."""
    topic, group = name("t"), name("g")
    create_topic(two_brokers.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": two_brokers.bootstrap})
    for i in range(8):
        producer.produce(topic, f"v{i}".encode(), partition=0)
    assert producer.flush(60) == 0
    picked, other = split(two_brokers, coordinator_of(two_brokers.brokers[0], group))

    consumer, stats = stats_consumer(two_brokers.bootstrap, group)
    try:
        coordinator_found(consumer, stats)  # at ``picked``: nobody holds the group yet
        assert commit(other, group, topic, {0: 5}) == [0]  # ``other`` takes the group
        assert coordinator_of(picked, group) == other.node_id
        consumer.assign([TopicPartition(topic, 0)])  # its OffsetFetch goes to ``picked``
        assert values_read(consumer, 3) == [b"v5", b"v6", b"v7"]
    finally:
        consumer.close()


def test_librdkafka_assign_while_the_new_coordinator_cannot_reach_etcd_reads_on_after(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """The group's coordinator stopped (its lease released) and the broker that takes the
    group over cannot reach etcd for a moment (an etcd leader election, say) while a consumer
    asks it for its new partition's committed offset. Answered COORDINATOR_NOT_AVAILABLE
    (librdkafka: look the coordinator up again, never resend) the partition was never
    fetched; COORDINATOR_LOAD_IN_PROGRESS is sent again until etcd answers."""
    cluster = new_cluster(
        etcd_server_private.client_url,
        s3_server,
        tmp_path,
        "elsewhere",
        name=cluster_name,
        # etcd calls give up after 1 s, the session lives 30 s: a pause of a few seconds is
        # an etcd that does not answer, not a session lost (test_group_offsets_between_sessions)
        extra_env={"KAFSCALE_ETCD__TIMEOUT_S": "1", "KAFSCALE_ETCD__SESSION_TTL_S": "30"},
    )
    try:
        old = cluster.start(**GROUP_ENV)
        taker = cluster.start(**GROUP_ENV)
        topic, group = name("t"), name("g")
        create_topic(cluster.bootstrap, topic, 1)
        producer = Producer({"bootstrap.servers": cluster.bootstrap})
        for i in range(8):
            producer.produce(topic, f"v{i}".encode(), partition=0)
        assert producer.flush(60) == 0
        assert commit(old, group, topic, {0: 5}) == [0]
        assert old.stop() == 0  # its group lease goes with it; ``taker`` is all that is left

        consumer, stats = stats_consumer(taker.bootstrap, group)
        try:
            coordinator_found(consumer, stats)
            etcd_pid = etcd_server_private.pid
            assert etcd_pid is not None
            os.kill(etcd_pid, signal.SIGSTOP)
            try:
                asked = [{"name": topic, "partition_indexes": [0]}]
                answer = fetch_v8(taker, group, asked)
                consumer.assign([TopicPartition(topic, 0)])
                for _ in range(6):  # 3 s: its OffsetFetch goes out and is answered meanwhile
                    consumer.poll(0.5)
            finally:
                os.kill(etcd_pid, signal.SIGCONT)
            # librdkafka sent its OffsetFetch again once etcd answered, and reads on from the
            # committed offset; the answer it retried (as a protocol client saw it):
            assert values_read(consumer, 3) == [b"v5", b"v6", b"v7"]
            assert answer.error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        finally:
            consumer.close()
    finally:
        cluster.stop_all()
