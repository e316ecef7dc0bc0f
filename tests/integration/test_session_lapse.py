"""A broker whose etcd session lapsed, seen from its clients.

Two cases. Its session really ended (the broker frozen past the TTL: etcd deleted everything
bound to it), and the broker must come back on a new one; or its keepalives went unanswered for
a TTL while etcd kept the lease (an etcd leader change extends every lease), and nothing was
taken from it: it must not act as owner meanwhile, and then resume without giving anything up
(``broker/metadata/session_lease.py``). A group it coordinates keeps its members then, though it
refused their heartbeats while suspended (``broker/groups/session_resume.py``).

The first case:
A broker frozen past its session's TTL (SIGSTOP, a stalled VM) wakes with its registration gone
from etcd, and from its own view of the cluster once the deletes reach it, until it has
registered again on a new session. Meanwhile it answered Metadata with no brokers at all and
every leader -1: librdkafka then dropped the broker from its list (failing what was queued on
it with ``_DESTROY_BROKER``, seen in a CI run of ``test_durability``'s watermark read), other
clients saw LEADER_NOT_AVAILABLE. A Kafka broker never answers Metadata without listing itself;
now neither does this one (``broker/metadata/listed_brokers.py``), and it names itself leader
of nothing while its session is not valid (``leaders.live_leaders``), even before its view has
heard of the deletes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster, new_cluster
from harness.classic_wire import heartbeat_code, stable_member
from harness.kafka_wire import (
    METADATA,
    PRODUCE,
    KafkaWire,
    metadata_body,
    produce_body,
    produce_partition,
)
from harness.s3 import S3Endpoint
from harness.tcp_relay import TcpRelay

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

TOPIC = "lapsed"
METADATA_VERSION = 12  # kafka-python's; librdkafka's v4 has the same brokers and leaders
WAIT_S = 120.0  # bound of each wait below (a loaded machine); none is a speed


def listed_and_leaders(answer: Any) -> tuple[set[tuple[int, str, int]], set[int]]:
    """(the brokers a Metadata answer lists, the leader ids it gives ``TOPIC``'s partitions)."""
    listed = {(int(b.node_id), str(b.host), int(b.port)) for b in answer.brokers}
    (topic,) = [t for t in answer.topics if t.name == TOPIC]
    return listed, {int(p.leader_id) for p in topic.partitions}


def leaders_of(wire: KafkaWire) -> set[int]:
    return listed_and_leaders(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))[1]


async def registration_lease(etcd: Etcd, cluster: str, node_id: int) -> int | None:
    kv = await etcd.get(keys.broker_key(cluster, node_id))
    return None if kv is None else kv.lease


async def until(check: Any, what: str, broker: BrokerProcess) -> None:
    """Wait until ``await check()`` is true (bounded by ``WAIT_S``)."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"{what}\n{broker.tail()}"
        await asyncio.sleep(0.05)


async def test_a_broker_woken_past_its_session_lists_itself_in_metadata(
    broker_cluster: BrokerCluster, etcd: Etcd
) -> None:
    broker = broker_cluster.start()
    cluster, me = broker_cluster.cluster, broker.node_id
    itself = (me, "127.0.0.1", broker.port)
    old_lease = await registration_lease(etcd, cluster, me)
    assert old_lease is not None
    with KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as wire:
        leaders_of(wire)  # auto-creates the topic; the broker claims its partitions on demand

        async def owns_all() -> bool:
            return leaders_of(wire) == {me}

        await until(owns_all, "the broker never led its topic", broker)
        os.kill(broker.pid, signal.SIGSTOP)
        try:

            async def registration_gone() -> bool:
                return await registration_lease(etcd, cluster, me) is None

            # The freeze must outlast the session (4 s): etcd deletes what was bound to it.
            await until(registration_gone, "etcd kept the frozen broker's session", broker)
            # Waiting in the socket: answered as soon as the broker runs again.
            wire.send(METADATA, METADATA_VERSION, metadata_body([TOPIC]))
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        answers = [wire.recv(METADATA, METADATA_VERSION)[1]]

        async def registered_again() -> bool:
            answers.append(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))
            return await registration_lease(etcd, cluster, me) not in (None, old_lease)

        await until(registered_again, "the broker never registered again", broker)
        answers.append(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))
    assert "etcd session lost" in broker.log_path.read_text(errors="replace")
    seen = [listed_and_leaders(answer) for answer in answers]
    # Before: no broker at all and every leader -1 while its registration was missing.
    assert all(itself in listed for listed, _ in seen), seen
    assert all(leaders <= {b[0] for b in listed} | {-1} for listed, leaders in seen), seen
    # Answered on waking, before it could register again: its view may still show the
    # ownership etcd deleted, yet it leads nothing (before: itself, for every partition).
    assert seen[0][1] == {-1}, seen


def partition_zero(wire: KafkaWire) -> tuple[int, int]:
    """(leader, leader epoch) of ``TOPIC``'s partition 0 in a Metadata answer."""
    answer = wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC]))
    (topic,) = [t for t in answer.topics if t.name == TOPIC]
    (p0,) = [p for p in topic.partitions if p.partition_index == 0]
    return int(p0.leader_id), int(p0.leader_epoch)


def produced(wire: KafkaWire, value: bytes) -> int:
    """The error code of one produce to partition 0, first try."""
    body = produce_body(TOPIC, 0, make_batch(0, [value]))
    return produce_partition(wire.request(PRODUCE, 9, body))[0]


async def test_a_session_etcd_still_holds_after_unanswered_keepalives_is_kept(
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    cluster_name: str,
    tmp_path: Path,
    etcd: Etcd,
) -> None:
    """etcd applies the broker's requests but its answers are held back past the session TTL:
    the keepalives renew the lease in etcd, yet none is answered in time (as through an etcd
    election, whose new leader extends every lease). The broker stops acting as owner, and
    when the answers come it carries on with the same lease, registration and partitions.
    Before: its own timer ended the session; it gave every partition up and registered again
    on a new lease."""
    relay = TcpRelay("127.0.0.1", int(etcd_server.client_url.rsplit(":", 1)[1]))
    cluster = new_cluster(relay.url, s3_server, tmp_path, "held", name=cluster_name)
    try:
        broker = cluster.start(KAFSCALE_ETCD__TIMEOUT_S="1")  # the harness's TTL: 4 s
        lease = await registration_lease(etcd, cluster.cluster, broker.node_id)
        with KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as wire:
            partition_zero(wire)  # auto-creates the topic
            assert produced(wire, b"before") == ErrorCode.NONE  # claims partition 0
            leader, epoch = partition_zero(wire)
            assert leader == broker.node_id

            def log_says(text: str) -> bool:
                return text in broker.log_path.read_text(errors="replace")

            async def lapsed() -> bool:
                return log_says("suspended") or log_says("etcd session lost")

            with relay.holding_replies():  # a fault that must outlast the TTL: its length is
                await until(lapsed, "the keepalives kept being answered", broker)  # the point

            async def resumed() -> bool:
                return log_says("resumed") or log_says("etcd session lost")

            await until(resumed, "the broker neither resumed nor lost its session", broker)
            assert not log_says("etcd session lost"), broker.tail()
            assert produced(wire, b"after") == ErrorCode.NONE, broker.tail()
            assert partition_zero(wire) == (leader, epoch)  # never given up nor claimed again
        assert await registration_lease(etcd, cluster.cluster, broker.node_id) == lease
    finally:
        cluster.stop_all()
        relay.close()


GROUP = "resumed"
GROUP_SESSION_MS = 6000  # Kafka's shortest session by default (group.min.session.timeout.ms)
RESUMABLE_TTL_S = "12"  # the broker's session TTL here: a suspension longer than GROUP_SESSION_MS


async def test_a_coordinator_that_resumes_its_session_keeps_its_members(
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    cluster_name: str,
    tmp_path: Path,
    etcd: Etcd,
) -> None:
    """A coordinator whose session is suspended answers its members' heartbeats
    NOT_COORDINATOR; when etcd renews the lease it coordinates the group again, with nothing
    taken from it. Its members could not heartbeat meanwhile (the coordinator refused them), so
    each gets a whole session from the resumption, as at a Kafka coordinator that loads a
    group. Before: the group's timers expired, at the resumption, every member whose session
    had run out while it was refused, and the group rebalanced (its members rejoined from
    scratch) after an etcd hiccup that moved nothing."""
    relay = TcpRelay("127.0.0.1", int(etcd_server.client_url.rsplit(":", 1)[1]))
    cluster = new_cluster(relay.url, s3_server, tmp_path, "held", name=cluster_name)
    try:
        broker = cluster.start(
            KAFSCALE_ETCD__TIMEOUT_S="1", KAFSCALE_ETCD__SESSION_TTL_S=RESUMABLE_TTL_S
        )

        def log_says(text: str) -> bool:
            return text in broker.log_path.read_text(errors="replace")

        with KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as wire:
            member, generation = stable_member(
                wire, GROUP, session_ms=GROUP_SESSION_MS, rebalance_ms=GROUP_SESSION_MS
            )
            assert heartbeat_code(wire, GROUP, member, generation) == ErrorCode.NONE

            async def lapsed() -> bool:
                """Whether the session lapsed, the member heartbeating meanwhile (answered in
                memory while the session is valid)."""
                code = heartbeat_code(wire, GROUP, member, generation)
                assert code in (ErrorCode.NONE, ErrorCode.NOT_COORDINATOR), broker.tail()
                await asyncio.sleep(1)
                return code == ErrorCode.NOT_COORDINATOR

            with relay.holding_replies():
                await until(lapsed, "the keepalives kept being answered", broker)
                assert log_says("suspended") and not log_says("lost"), broker.tail()
                # The member's session runs out while the coordinator refuses it; the
                # broker's own (12 s) is not over yet.
                await asyncio.sleep(GROUP_SESSION_MS / 1000 + 1)

            async def resumed() -> bool:
                return log_says("resumed") or log_says("etcd session lost")

            await until(resumed, "the broker neither resumed nor lost its session", broker)
            assert not log_says("etcd session lost"), broker.tail()
            await asyncio.sleep(1)  # the group's timers, which look every 0.1 s, see the resumption
            answer = heartbeat_code(wire, GROUP, member, generation)
        assert ErrorCode(answer).name == ErrorCode.NONE.name, broker.tail()
    finally:
        cluster.stop_all()
        relay.close()
