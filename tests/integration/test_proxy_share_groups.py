"""Share consumers (KIP-932) through ``kafscale proxy``, the one endpoint, in front of three
brokers that each own some of the topic's partitions: real brokers, etcd, moto, and the share
consumers of librdkafka (confluent-kafka's ``ShareConsumer``) and of the Java client
(``KafkaShareConsumer``, kafka-clients 4.3), connected to the proxy only.

* two share consumers get every record exactly once (all acknowledged ACCEPT), none lost;
* RELEASE and REJECT reach each partition's owner: released records come again with their
  delivery count one higher, rejected ones never come back;
* a broker SIGKILLed under a running share consumer: consumption goes on once its leases
  moved, nothing is lost, and no record whose acknowledgement was confirmed comes again;
* a consumer that closes (or whose connection drops) releases what it holds at once: another
  member gets those records long before their acquisition lock would have run out;
* bad requests get Kafka's codes from the proxy (session epochs, unknown members and topic
  ids, the per-connection session limit), and the proxy advertises the share APIs and
  ``share.version`` as the brokers do.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer
from harness import children, topics
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.java_share import run_share_members
from harness.kafka_wire import KafkaWire, share_fetch_partitions
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.share import (
    Received,
    poll_some,
    poll_until,
    produce,
    produce_partitions,
    set_group_configs,
    stored_share_state,
    wait_stored,
)
from harness.share import share_consumer as new_share_consumer

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

BROKERS = 3
PARTITIONS = 6
EARLIEST = {"share.auto.offset.reset": "earliest"}
PROXY_NODE_ID = 1000
JAVA_SOURCE = Path(__file__).with_name("java") / "ShareMember.java"


class Proxied:
    def __init__(self, cluster: BrokerCluster, proxy: BrokerProcess) -> None:
        self.cluster = cluster
        self.proxy = proxy

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap

    def owners(self, topic: str) -> dict[int, int]:
        """partition -> the broker the proxy routes it to."""
        routes = self.proxy.status()["routes"]["partitions"]
        return {
            int(key.rsplit("/", 1)[1]): owner
            for key, owner in routes.items()
            if key.rsplit("/", 1)[0] == topic
        }

    def settled_owner(self, topic: str, partition: int) -> int:
        """The partition's owner once it is the one the cluster's stored assignment wants. A
        new partition is claimed on demand by whichever broker is asked first, and may then
        move to the owner the assignment gives it: a test talking to one broker directly must
        wait for that (one etcd connection for the wait: a loaded machine is slow to open one)."""

        async def wait() -> int:
            etcd = await Etcd.connect([self.cluster.etcd_url], timeout_s=60)
            try:
                deadline = time.monotonic() + 60
                while True:
                    kv = await etcd.get(keys.assignment_key(self.cluster.cluster))
                    wanted = None if kv is None else Assignment.from_json(kv.value).owners
                    owner = self.owners(topic).get(partition)
                    if owner is not None and wanted and wanted.get((topic, partition)) == owner:
                        return owner
                    assert time.monotonic() < deadline, f"{topic}/{partition} stays at {owner}"
                    await asyncio.sleep(0.1)
            finally:
                await etcd.close()

        return asyncio.run(wait())

    def spread_topic(self, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
        """``topic`` created, once every broker owns some of its partitions: the owners."""
        topics.create_topic(self.bootstrap, topic, partitions)
        deadline = time.monotonic() + 60
        while True:
            owners = self.owners(topic)
            if len(owners) == partitions and len(set(owners.values())) == BROKERS:
                return owners
            assert time.monotonic() < deadline, f"{topic} not spread over the brokers: {owners}"
            time.sleep(0.1)


def start_proxied(cluster: BrokerCluster) -> Proxied:
    for _ in range(BROKERS):
        cluster.start()
    return Proxied(cluster, start_proxy(cluster))


@pytest.fixture(scope="module")
def proxied(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxied]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("share-proxy"), "shareproxy"
    )
    try:
        yield start_proxied(cluster)
    finally:
        cluster.stop_all()


@pytest.fixture
def names(request: pytest.FixtureRequest) -> tuple[str, str]:
    """A topic and a group of this test's own."""
    suffix = f"{request.node.name[:30]}-{uuid.uuid4().hex[:6]}"
    return f"t-{suffix}", f"g-{suffix}"


def values(n: int, prefix: str = "v") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def produce_everywhere(bootstrap: str, topic: str, per_partition: int, prefix: str) -> list[bytes]:
    batches = {p: values(per_partition, f"{prefix}-p{p}-") for p in range(PARTITIONS)}
    produce_partitions(bootstrap, topic, batches)
    return [value for batch in batches.values() for value in batch]


def share_consumer(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    return new_share_consumer(bootstrap, group, topic, log_level=3)


# --- every record once ----------------------------------------------------------------------


def test_two_share_consumers_through_the_proxy_get_every_record_once(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    first, second = Received(), Received()
    c1 = share_consumer(proxied.bootstrap, group, topic)
    c2 = share_consumer(proxied.bootstrap, group, topic)
    try:
        sent: list[bytes] = []
        for round_ in range(4):
            sent += produce_everywhere(proxied.bootstrap, topic, 20, f"r{round_}")
            poll_some(c1, first)
            poll_some(c2, second)
        deadline = time.monotonic() + 60
        while len(first.values) + len(second.values) < len(sent):
            assert time.monotonic() < deadline, f"{len(first.values) + len(second.values)} got"
            poll_some(c1, first)
            poll_some(c2, second)
        for _ in range(3):  # nothing more comes
            poll_some(c1, first)
            poll_some(c2, second)
    finally:
        c1.close()
        c2.close()
    got = first.values + second.values
    assert sorted(got) == sorted(sent)
    assert len(set(got)) == len(got)
    assert {count for _, _, count in first.records + second.records} == {1}


def _java_members(
    proxied: Proxied, names: tuple[str, str], mode: str, count: int, per_partition: int
) -> list[list[tuple[str, int, int]]]:
    """``count`` Java share consumers run at once until together they got every delivery of
    the ``per_partition`` records on each partition (twice each for "release-once"): the
    (value, offset, delivery count) each printed. Then nothing more can come: every
    share-partition's stored start is past its records (each acknowledged ACCEPT, durably),
    so none is left to deliver again."""
    topic, group = names
    deliveries = per_partition * PARTITIONS * (2 if mode == "release-once" else 1)
    args = [proxied.bootstrap, group, topic, mode]
    seen = run_share_members(JAVA_SOURCE, args, count, deliveries)
    cluster = proxied.cluster
    read = partial(stored_share_state, cluster.etcd_url, cluster.cluster, group, topic)
    for partition in range(PARTITIONS):
        try:
            wait_stored(partial(read, partition), lambda state: state["start"] == per_partition)
        except AssertionError as exc:  # what the members saw, to tell a lost ack from a repeat
            again = [d for member in seen for d in member if d[2] != 1]
            counts = [len(member) for member in seen]
            raise AssertionError(f"partition {partition}: {exc}; got {counts}, {again=}") from exc
    return seen


def test_java_share_consumers_through_the_proxy_get_every_record_once(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    sent = [v.decode() for v in produce_everywhere(proxied.bootstrap, topic, 50, "j")]
    seen = _java_members(proxied, names, "accept", 2, 50)
    got = [value for member in seen for value, _, _ in member]
    assert sorted(got) == sorted(sent) and len(set(got)) == len(got)
    assert {count for member in seen for _, _, count in member} == {1}


# --- RELEASE and REJECT -----------------------------------------------------------------------


def test_release_and_reject_through_the_proxy_reach_each_partitions_owner(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    sent = produce_everywhere(proxied.bootstrap, topic, 10, "x")
    rejected = set(sent[::2])
    got = Received()
    consumer = share_consumer(proxied.bootstrap, group, topic)
    try:
        # Everything released once: it comes again, counted twice.
        poll_until(
            consumer,
            got,
            lambda: len(got.records) >= len(sent),
            timeout_s=60,
            ack=AcknowledgeType.RELEASE,
        )
        deadline = time.monotonic() + 60
        while len(got.records) < 2 * len(sent):
            assert time.monotonic() < deadline, f"{len(got.records)} deliveries"
            for message in consumer.poll(0.5):
                if message.error() is not None:
                    continue
                value = message.value()
                got.records.append((value, message.offset(), message.delivery_count()))
                kind = AcknowledgeType.REJECT if value in rejected else AcknowledgeType.ACCEPT
                consumer.acknowledge(message, kind)
            consumer.commit_sync(30)
        # Rejected and accepted records never come back; new ones do.
        after = produce_everywhere(proxied.bootstrap, topic, 1, "after")
        poll_until(consumer, got, lambda: set(after) <= set(got.values), timeout_s=60)
        for _ in range(4):
            poll_some(consumer, got)
    finally:
        consumer.close()
    counts: dict[bytes, list[int]] = {}
    for value, _, count in got.records:
        counts.setdefault(value, []).append(count)
    assert counts == {**{v: [1, 2] for v in sent}, **{v: [1] for v in after}}


def test_java_share_consumer_through_the_proxy_gets_released_records_again(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    sent = produce_everywhere(proxied.bootstrap, topic, 5, "jr")
    (seen,) = _java_members(proxied, names, "release-once", 1, 5)
    by_value: dict[str, list[int]] = {}
    for value, _, count in seen:
        by_value.setdefault(value, []).append(count)
    assert by_value == {v.decode(): [1, 2] for v in sent}


# --- closing and dying consumers --------------------------------------------------------------

LONG_LOCK = {**EARLIEST, "share.record.lock.duration.ms": "600000"}  # 10 minutes


def test_a_consumer_closed_through_the_proxy_releases_its_records_at_once(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, LONG_LOCK)
    sent = produce_everywhere(proxied.bootstrap, topic, 10, "c")
    held = Received()
    holder = share_consumer(proxied.bootstrap, group, topic)
    try:
        poll_until(holder, held, lambda: len(held.records) > 0, ack=None)
    finally:
        holder.close()  # never acknowledged: released by the close, not by the 10-minute lock
    got = Received()
    other = share_consumer(proxied.bootstrap, group, topic)
    try:
        poll_until(other, got, lambda: len(got.records) >= len(sent), timeout_s=60)
    finally:
        other.close()
    assert sorted(got.values) == sorted(sent)
    again = {value for value, _, count in got.records if count == 2}
    assert again == set(held.values)


DYING_CONSUMER = textwrap.dedent(
    """
    import os, sys
    from confluent_kafka import ShareConsumer
    c = ShareConsumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([sys.argv[3]])
    got = []
    while not got:
        got = [m.value().decode() for m in c.poll(1.0) if m.error() is None]
    print(" ".join(got), flush=True)
    os._exit(0)  # dies holding its records: no acknowledgement, no close
    """
)


SHORT_SESSIONS = {
    "KAFSCALE_GROUPS__SHARE_SESSION_TIMEOUT_MS": "4000",
    "KAFSCALE_GROUPS__SHARE_HEARTBEAT_INTERVAL_MS": "500",
}
"""Member sessions of 4 s (Kafka's least is 45 s): a dead member leaves the group in seconds."""


@pytest.fixture
def short_sessions(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[Proxied]:
    """Brokers and a proxy of their own whose share group member sessions are short."""
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path, "shareshort", extra_env=SHORT_SESSIONS
    )
    try:
        yield start_proxied(cluster)
    finally:
        cluster.stop_all()


def test_records_of_a_consumer_whose_connection_drops_go_to_another_member(
    short_sessions: Proxied, names: tuple[str, str]
) -> None:
    proxied = short_sessions
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, LONG_LOCK)
    sent = produce_everywhere(proxied.bootstrap, topic, 10, "d")
    dying = children.run(
        [sys.executable, "-c", DYING_CONSUMER, proxied.bootstrap, group, topic],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dying.returncode == 0, dying.stderr[-2000:]
    held = {value.encode() for value in dying.stdout.split()}
    assert held
    got = Received()
    other = share_consumer(proxied.bootstrap, group, topic)
    try:
        # The dead member stays in the group, with its share of the partitions, until its
        # member session (4 s here) expires: what it held on the partitions the other member
        # gets at once comes at once, the rest only then; never after the 10-minute locks.
        poll_until(other, got, lambda: len(got.records) >= len(sent), timeout_s=60)
    finally:
        other.close()
    assert sorted(got.values) == sorted(sent)
    assert {value for value, _, count in got.records if count == 2} == held


# --- a broker crash ---------------------------------------------------------------------------

ROUNDS_AFTER_THE_MOVE = 10
"""Rounds the feed produces once the proxy routes none of the partitions to the crashed
broker. The feed used to run 40 rounds, whenever the crash: ~30 after the move, ~10 s."""


def test_a_share_consumer_behind_the_proxy_survives_a_broker_crash(
    broker_cluster: BrokerCluster, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied = start_proxied(broker_cluster)
    owners = proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    sent: list[bytes] = []
    rounds: list[int] = []  # the rounds produced (and flushed: acked), in order
    stop = threading.Event()

    def feed() -> None:  # a steady producer through the proxy, across the crash, until stopped
        while not stop.is_set():
            sent.extend(produce_everywhere(proxied.bootstrap, topic, 2, f"k{len(rounds)}"))
            rounds.append(len(rounds))
            time.sleep(0.2)

    deliveries: list[tuple[bytes, int, bool]] = []  # value, delivery count, ack confirmed
    consumer = share_consumer(proxied.bootstrap, group, topic)

    def poll_once() -> None:
        batch = []
        for message in consumer.poll(0.5):
            if message.error() is None:
                batch.append((message.value(), message.partition(), message.delivery_count()))
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        if not batch:
            return
        try:
            results = consumer.commit_sync(30)
            failed = {tp.partition for tp, error in results.items() if error is not None}
        except KafkaException:
            failed = {partition for _, partition, _ in batch}
        deliveries.extend((v, c, p not in failed) for v, p, c in batch)

    victim = next(b for b in broker_cluster.brokers[:BROKERS] if b.node_id in owners.values())
    feeder = threading.Thread(target=feed, name="feed")
    feeder.start()
    try:
        deadline = time.monotonic() + 60
        while len(deliveries) < 12 * PARTITIONS:
            assert time.monotonic() < deadline, f"{len(deliveries)} deliveries"
            poll_once()
        victim.kill()  # SIGKILL: its leases expire after the session TTL, then move
        deadline = time.monotonic() + 180
        moved_at: int | None = None  # rounds produced when the proxy routed nothing to it
        while moved_at is None or len(rounds) < moved_at + ROUNDS_AFTER_THE_MOVE:
            # consuming on while the partitions move, then while the feed goes on after
            assert time.monotonic() < deadline, f"{len(rounds)} rounds, moved at {moved_at}"
            assert feeder.is_alive(), "the producer failed"
            poll_once()
            routed = proxied.owners(topic)
            if moved_at is None and len(routed) == PARTITIONS:
                moved_at = None if victim.node_id in routed.values() else len(rounds)
        stop.set()
        feeder.join(timeout=60)
        assert not feeder.is_alive(), "the producer never finished"
        deadline = time.monotonic() + 120
        while not set(sent) <= {v for v, _, _ in deliveries}:
            missing = len(set(sent) - {v for v, _, _ in deliveries})
            assert time.monotonic() < deadline, f"{missing} records never delivered"
            poll_once()
        for _ in range(4):
            poll_once()
    finally:
        stop.set()
        feeder.join(timeout=60)
        consumer.close()
    assert len(sent) == len(rounds) * 2 * PARTITIONS  # every round acked in full
    assert {v for v, _, _ in deliveries} == set(sent)  # nothing lost
    confirmed: set[bytes] = set()
    for value, _, ok in deliveries:
        # A record comes again only if its acknowledgement was never confirmed.
        assert value not in confirmed, f"{value!r} came again after its acknowledgement"
        if ok:
            confirmed.add(value)


# --- bad input ---------------------------------------------------------------------------------


def _heartbeat(wire: KafkaWire, group: str, member: str, topic: str) -> Any:
    body = {
        "group_id": group,
        "member_id": member,
        "member_epoch": 0,
        "rack_id": None,
        "subscribed_topic_names": [topic],
    }
    return wire.request(76, 1, body)


def _fetch(
    wire: KafkaWire,
    group: str,
    member: str,
    epoch: int,
    partitions: list[tuple[Any, int]],
    acks: list[dict[str, Any]] | None = None,
) -> Any:
    """A ShareFetch of ``partitions``, ``acks`` for each, 500 records at most."""
    each = dict.fromkeys(partitions, acks or [])
    return share_fetch_partitions(wire, group, member, epoch, partitions, each, max_records=500)


def _partitions(response: Any) -> dict[tuple[Any, int], Any]:
    return {(t.topic_id, p.partition_index): p for t in response.responses for p in t.partitions}


def test_bad_share_requests_through_the_proxy_get_kafkas_codes(
    proxied: Proxied, names: tuple[str, str]
) -> None:
    topic, group = names
    proxied.spread_topic(topic)
    set_group_configs(proxied.bootstrap, group, EARLIEST)
    produce_everywhere(proxied.bootstrap, topic, 3, "b")
    with KafkaWire(proxied.bootstrap) as wire:
        versions = wire.request(
            18, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        advertised = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
        assert advertised[76] == (1, 1) and advertised[78] == (1, 2) and advertised[79] == (1, 2)
        assert ("share.version", 1) in {
            (f.name, f.max_version_level) for f in versions.finalized_features
        }
        joined = _heartbeat(wire, group, "m1", topic)
        assert joined.error_code == ErrorCode.NONE
        topic_id = joined.assignment.topic_partitions[0].topic_id
        everything = [(topic_id, p) for p in range(PARTITIONS)]
        ghost_topic = uuid.uuid4()
        # No session yet; acknowledgements on the opening request; empty member id.
        assert (
            _fetch(wire, group, "m1", 3, everything).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        )
        ack = {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}
        assert (
            _fetch(wire, group, "m1", 0, everything, [ack]).error_code == ErrorCode.INVALID_REQUEST
        )
        assert _fetch(wire, group, "", 0, everything).error_code == ErrorCode.INVALID_REQUEST
        # A session over every owner: all 18 records, leaders named as the proxy itself; an
        # unknown topic id answered once and not kept.
        opened = _fetch(wire, group, "m1", 0, [*everything, (ghost_topic, 0)])
        assert opened.error_code == ErrorCode.NONE
        parts = _partitions(opened)
        assert parts[(ghost_topic, 0)].error_code == ErrorCode.UNKNOWN_TOPIC_ID
        acquired = sum(
            a.last_offset - a.first_offset + 1
            for key in everything
            for a in parts[key].acquired_records
        )
        epoch = 1
        deadline = time.monotonic() + 60
        while acquired < 3 * PARTITIONS and time.monotonic() < deadline:
            # A partition may answer empty the first time.
            more = _fetch(wire, group, "m1", epoch, [])
            epoch += 1
            acquired += sum(
                a.last_offset - a.first_offset + 1
                for p in _partitions(more).values()
                for a in p.acquired_records
            )
        assert acquired == 3 * PARTITIONS
        assert {p.current_leader.leader_id for k, p in parts.items() if k != (ghost_topic, 0)} == {
            PROXY_NODE_ID
        }
        assert (ghost_topic, 0) not in _partitions(_fetch(wire, group, "m1", epoch, []))
        epoch += 1
        # Out-of-order epochs; a member the proxy never saw; epoch 0 ShareAcknowledge.
        assert _fetch(wire, group, "m1", epoch + 5, []).error_code == (
            ErrorCode.INVALID_SHARE_SESSION_EPOCH
        )
        assert (
            _fetch(wire, group, "stranger", 1, []).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        )
        acknowledge = {
            "group_id": group,
            "member_id": "m1",
            "share_session_epoch": 0,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [{"partition_index": 0, "acknowledgement_batches": [ack]}],
                }
            ],
        }
        assert wire.request(79, 1, acknowledge).error_code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
        # Acknowledging every partition through ShareAcknowledge: each goes to its owner.
        acknowledge["topics"] = [
            {
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition_index": p,
                        "acknowledgement_batches": [
                            {"first_offset": 0, "last_offset": 2, "acknowledge_types": [1]}
                        ],
                    }
                    for p in range(PARTITIONS)
                ],
            },
            {
                "topic_id": ghost_topic,
                "partitions": [{"partition_index": 0, "acknowledgement_batches": [ack]}],
            },
        ]
        acknowledge["share_session_epoch"] = epoch
        answered = _partitions(wire.request(79, 1, acknowledge))
        assert {k: p.error_code for k, p in answered.items()} == {
            **{key: ErrorCode.NONE for key in everything},
            (ghost_topic, 0): ErrorCode.UNKNOWN_TOPIC_ID,
        }
        epoch += 1
        # The per-connection session limit, then the sessions end with the connection.
        for n in range(15):
            assert _fetch(wire, group, f"extra-{n}", 0, []).error_code == ErrorCode.NONE
        assert _fetch(wire, group, "one-too-many", 0, []).error_code == (
            ErrorCode.SHARE_SESSION_LIMIT_REACHED
        )
        # Closing a session frees its place; its epoch is gone.
        closed = _fetch(wire, group, "m1", -1, [])
        assert closed.error_code == ErrorCode.NONE
        assert _fetch(wire, group, "m1", epoch + 1, []).error_code == (
            ErrorCode.SHARE_SESSION_NOT_FOUND
        )
        assert _fetch(wire, group, "one-too-many", 0, []).error_code == ErrorCode.NONE
        assert proxied.proxy.status()["share_sessions"] >= 16
    with KafkaWire(proxied.bootstrap) as wire:  # a new connection: nothing of the old one
        assert _fetch(wire, group, "extra-0", 1, []).error_code == ErrorCode.SHARE_SESSION_NOT_FOUND
        assert _fetch(wire, group, "extra-0", 0, []).error_code == ErrorCode.NONE
        deadline = time.monotonic() + 10  # the closed connection's sessions are gone
        while proxied.proxy.status()["share_sessions"] != 1:
            assert time.monotonic() < deadline, proxied.proxy.status()["share_sessions"]
            time.sleep(0.05)


# --- sessions reopened and partitions forgotten behind the proxy ---------------------------------

LONG_LOCKS = {**EARLIEST, "share.record.lock.duration.ms": "600000"}
ACCEPT_ALL = {"first_offset": 0, "last_offset": 4, "acknowledge_types": [1]}


def _one_partition_topic(proxied: Proxied, topic: str, group: str) -> str:
    """``topic`` with one partition holding five records; its owner's address."""
    topics.create_topic(proxied.bootstrap, topic, 1)
    set_group_configs(proxied.bootstrap, group, LONG_LOCKS)
    produce(proxied.bootstrap, topic, values(5))
    owner = proxied.settled_owner(topic, 0)  # the first owner may hand it over: not that one
    (broker,) = [b for b in proxied.cluster.brokers if b.node_id == owner]
    return broker.bootstrap


def _acquire_all(wire: KafkaWire, group: str, member: str, topic_id: Any) -> int:
    """The member's session opened and the five records acquired: the next epoch."""
    acquired, epoch, answer = 0, 0, None
    deadline = time.monotonic() + 60
    while acquired < 5:
        assert time.monotonic() < deadline, f"{acquired} records acquired; last: {answer}"
        answer = _fetch(wire, group, member, epoch, [(topic_id, 0)] if epoch == 0 else [])
        assert answer.error_code == ErrorCode.NONE, answer
        acquired += sum(
            a.last_offset - a.first_offset + 1
            for p in _partitions(answer).values()
            for a in p.acquired_records
        )
        epoch += 1
    return epoch


def _share_start(proxied: Proxied, group: str, topic: str) -> int | None:
    state = stored_share_state(proxied.cluster.etcd_url, proxied.cluster.cluster, group, topic, 0)
    return None if state is None else int(state["start"])


@pytest.mark.parametrize("behind", ["replaced", "closed"])
def test_acknowledgements_on_a_session_the_proxy_opens_again_get_kafkas_answer(
    proxied: Proxied, names: tuple[str, str], behind: str
) -> None:
    """The proxy's share session on a partition's owner is lost under it (here: the member's
    session there is replaced, or closed, by another connection of the member), and the client
    acknowledges the records it holds. The proxy opens its session there again and delivers
    the acknowledgements on it, and the client gets what Kafka gives: NONE while the member
    still holds the records (applied: the share-partition moves past them), and
    INVALID_RECORD_STATE once they were released (not NOT_LEADER_OR_FOLLOWER either way)."""
    topic, group = names
    owner = _one_partition_topic(proxied, topic, group)
    with KafkaWire(proxied.bootstrap) as wire, KafkaWire(owner) as direct:
        joined = _heartbeat(wire, group, "m", topic)
        topic_id = joined.assignment.topic_partitions[0].topic_id
        epoch = _acquire_all(wire, group, "m", topic_id)
        # The member's session on the owner, replaced past the proxy's epochs there.
        for direct_epoch in range(epoch + 3):
            assert _fetch(direct, group, "m", direct_epoch, []).error_code == ErrorCode.NONE
        if behind == "closed":  # the session ends: the member's records are released
            assert _fetch(direct, group, "m", -1, []).error_code == ErrorCode.NONE
        answer = _fetch(wire, group, "m", epoch, [(topic_id, 0)], [ACCEPT_ALL])
        assert answer.error_code == ErrorCode.NONE, answer
        acked = _partitions(answer)[(topic_id, 0)].acknowledge_error_code
        if behind == "replaced":
            assert acked == ErrorCode.NONE
            deadline = time.monotonic() + 60
            while _share_start(proxied, group, topic) != 5:
                assert time.monotonic() < deadline, "the acknowledgements were not stored"
                time.sleep(0.1)
        else:
            assert acked == ErrorCode.INVALID_RECORD_STATE


def _acknowledge(wire: KafkaWire, group: str, member: str, epoch: int, topic_id: Any) -> Any:
    body = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [{"partition_index": 0, "acknowledgement_batches": [ACCEPT_ALL]}],
            }
        ],
    }
    return wire.request(79, 1, body)


@pytest.mark.parametrize("through", ["proxy", "broker"])
def test_a_forgotten_partition_s_records_stay_with_the_member_as_in_kafka(
    proxied: Proxied, names: tuple[str, str], through: str
) -> None:
    """A share consumer forgets (``forgotten_topics_data``) the one partition it fetches from
    an owner. Kafka's share-partition leader only drops it from the session: the member keeps
    the records it acquired there (until it acknowledges them or their lock runs out), and
    may still acknowledge them. So it is directly at the broker and through the proxy (which
    used to close its session on that owner, releasing them to other members)."""
    topic, group = names
    owner = _one_partition_topic(proxied, topic, group)
    address = proxied.bootstrap if through == "proxy" else owner
    with KafkaWire(address) as wire, KafkaWire(address) as other:
        joined = _heartbeat(wire, group, "m", topic)
        topic_id = joined.assignment.topic_partitions[0].topic_id
        epoch = _acquire_all(wire, group, "m", topic_id)
        forget = {
            "group_id": group,
            "member_id": "m",
            "share_session_epoch": epoch,
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "max_records": 500,
            "batch_size": 500,
            "topics": [],
            "forgotten_topics_data": [{"topic_id": topic_id, "partitions": [0]}],
        }
        assert wire.request(78, 1, forget).error_code == ErrorCode.NONE
        assert _heartbeat(other, group, "m2", topic).error_code == ErrorCode.NONE
        taken = _fetch(other, group, "m2", 0, [(topic_id, 0)])
        assert taken.error_code == ErrorCode.NONE, taken
        assert not _partitions(taken)[(topic_id, 0)].acquired_records
        acked = _acknowledge(wire, group, "m", epoch + 1, topic_id)
        assert acked.error_code == ErrorCode.NONE, acked
        assert _partitions(acked)[(topic_id, 0)].error_code == ErrorCode.NONE
    deadline = time.monotonic() + 60
    while _share_start(proxied, group, topic) != 5:
        assert time.monotonic() < deadline, "the acknowledgements were not stored"
        time.sleep(0.1)
