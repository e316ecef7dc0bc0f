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
of nothing once etcd may no longer hold its session (``leaders.live_leaders``: it sent no
keepalive for a TTL), even before its view has heard of the deletes.

In the second case every broker names the suspended one leader of what it owns, as etcd
does, and it refuses its partitions' produces and fetches with NOT_LEADER_OR_FOLLOWER until it
resumes (the last test).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.classic_wire import heartbeat_code, stable_member
from harness.etcd import registration_lease
from harness.kafka_wire import (
    FETCH,
    METADATA,
    PRODUCE,
    KafkaWire,
    fetch_body,
    fetch_partition,
    metadata_body,
    produce_body,
    produce_partition,
)
from harness.relayed_cluster import LOST, RelayedCluster, relayed_cluster
from harness.s3 import S3Endpoint
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.topics import create_topic
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


async def until(check: Any, what: str, broker: BrokerProcess) -> None:
    """Wait until ``await check()`` is true (bounded by ``WAIT_S``)."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"{what}\n{broker.tail()}"
        await asyncio.sleep(0.05)


async def until_resumed(held: RelayedCluster) -> None:
    """Wait for the relayed broker to resume its session (``RESUMED``); fail if it lost it."""

    async def resumed() -> bool:
        return held.resumed_or_lost()

    await until(resumed, "the broker neither resumed nor lost its session", held.broker)
    assert not held.log_says(LOST), held.broker.tail()


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
    with relayed_cluster(etcd_server, s3_server, tmp_path, cluster_name) as held:  # TTL: 4 s
        broker, log_says = held.broker, held.log_says
        lease = await registration_lease(etcd, held.cluster.cluster, broker.node_id)
        with KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as wire:
            partition_zero(wire)  # auto-creates the topic
            assert produced(wire, b"before") == ErrorCode.NONE  # claims partition 0
            leader, epoch = partition_zero(wire)
            assert leader == broker.node_id

            async def lapsed() -> bool:
                return log_says("suspended") or log_says("etcd session lost")

            # a fault that must outlast the TTL: its length is the point
            with held.relay.holding_replies():
                await until(lapsed, "the keepalives kept being answered", broker)
            await until_resumed(held)
            assert produced(wire, b"after") == ErrorCode.NONE, broker.tail()
            assert partition_zero(wire) == (leader, epoch)  # never given up nor claimed again
        assert await registration_lease(etcd, held.cluster.cluster, broker.node_id) == lease


GROUP = "resumed"
GROUP_SESSION_MS = 6000  # Kafka's shortest session by default (group.min.session.timeout.ms)
RESUMABLE_TTL_S = "12"  # the broker's session TTL here: a suspension longer than GROUP_SESSION_MS


@contextmanager
def member_of_a_relayed_coordinator(
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    cluster_name: str,
    tmp_path: Path,
    group: str,
    session_ms: int,
) -> Iterator[tuple[RelayedCluster, KafkaWire, str, int]]:
    """A ``relayed_cluster`` whose broker (session TTL ``RESUMABLE_TTL_S``) coordinates
    ``group``, with one Stable member (session ``session_ms``): the cluster, the member's
    connection, its member id and generation."""
    with (
        relayed_cluster(
            etcd_server,
            s3_server,
            tmp_path,
            cluster_name,
            KAFSCALE_ETCD__SESSION_TTL_S=RESUMABLE_TTL_S,
        ) as held,
        KafkaWire(held.broker.bootstrap, timeout_s=WAIT_S) as wire,
    ):
        member, generation = stable_member(
            wire, group, session_ms=session_ms, rebalance_ms=GROUP_SESSION_MS
        )
        yield held, wire, member, generation


async def heartbeat_until_refused(
    wire: KafkaWire, group: str, member: str, generation: int, broker: BrokerProcess
) -> float:
    """Heartbeat ``member`` once a second until its coordinator, its session suspended,
    refuses it (NOT_COORDINATOR; answered in memory while the session is valid); returns when
    the last accepted heartbeat was answered (``time.monotonic()``)."""
    accepted_at = time.monotonic()

    async def refused() -> bool:
        nonlocal accepted_at
        code = heartbeat_code(wire, group, member, generation)
        assert code in (ErrorCode.NONE, ErrorCode.NOT_COORDINATOR), broker.tail()
        if code == ErrorCode.NONE:
            accepted_at = time.monotonic()
            await asyncio.sleep(1)
        return code == ErrorCode.NOT_COORDINATOR

    await until(refused, "the keepalives kept being answered", broker)
    return accepted_at


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
    with member_of_a_relayed_coordinator(
        etcd_server, s3_server, cluster_name, tmp_path, GROUP, GROUP_SESSION_MS
    ) as (held, wire, member, generation):
        broker, log_says = held.broker, held.log_says
        assert heartbeat_code(wire, GROUP, member, generation) == ErrorCode.NONE
        with held.relay.holding_replies():
            await heartbeat_until_refused(wire, GROUP, member, generation, broker)
            assert log_says("suspended") and not held.said_lost(), broker.tail()
            # The member's session runs out while the coordinator refuses it; the
            # broker's own (12 s) is not over yet.
            await asyncio.sleep(GROUP_SESSION_MS / 1000 + 1)
        await until_resumed(held)
        # at once: a request meets the resumption even before the group's timers do
        answer = heartbeat_code(wire, GROUP, member, generation)
    assert ErrorCode(answer).name == ErrorCode.NONE.name, broker.tail()


SHORT_GROUP = "short-suspension"
LONG_SESSION_MS = 20_000
"""A member session longer than the suspension below: its deadline falls after the resumption."""
REFUSED_S = 5  # how long the member is refused after the first refusal: well within the TTL


async def test_a_suspension_shorter_than_a_members_session_still_gives_it_a_whole_one(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """The coordinator's session is suspended for a few seconds, and resumes before its
    member's session would have run out. The member was refused meanwhile, so it gets a whole
    session from the resumption: its heartbeat after its old deadline is accepted. Before: a
    group whose timer task did not wake during the suspension (its next deadline came after
    the resumption) kept the members' old deadlines, and the member was expired at its old
    deadline, though it could not heartbeat for seconds before it."""
    with member_of_a_relayed_coordinator(
        etcd_server, s3_server, cluster_name, tmp_path, SHORT_GROUP, LONG_SESSION_MS
    ) as (held, wire, member, generation):
        broker, log_says = held.broker, held.log_says
        with held.relay.holding_replies():
            accepted_at = await heartbeat_until_refused(
                wire, SHORT_GROUP, member, generation, broker
            )
            await asyncio.sleep(REFUSED_S)  # the member is refused for seconds: the point
            assert log_says("suspended") and not held.said_lost(), broker.tail()
        await until_resumed(held)
        old_deadline = accepted_at + LONG_SESSION_MS / 1000
        # Past the deadline the member had before the suspension (the broker set it before
        # answering that heartbeat): the time is the point.
        await asyncio.sleep(max(old_deadline - time.monotonic(), 0) + 1)
        answer = heartbeat_code(wire, SHORT_GROUP, member, generation)
    assert ErrorCode(answer).name == ErrorCode.NONE.name, broker.tail()


SHARED = "shared"  # the two-broker test's topic
SHARED_PARTITIONS = 4
SUSPENDABLE_TTL_S = "8"  # the window the checks below run in while one broker is suspended


def leaders_by_partition(wire: KafkaWire, topic: str) -> dict[int, int]:
    """{partition: leader id} of ``topic`` in one Metadata answer."""
    answer = wire.request(METADATA, METADATA_VERSION, metadata_body([topic], False))
    (entry,) = [t for t in answer.topics if t.name == topic]
    return {int(p.partition_index): int(p.leader_id) for p in entry.partitions}


async def lease_holders(etcd: Etcd, cluster: str, topic: str, partitions: int) -> dict[int, int]:
    """{partition: the broker whose lease key etcd holds} (partitions nobody holds left out)."""
    holders = {}
    for partition in range(partitions):
        kv = await etcd.get(keys.partition_lease_key(cluster, topic, partition))
        if kv is not None:
            holders[partition] = int(kv.value)
    return holders


def session_samples(broker: BrokerProcess) -> dict[str, float]:
    """The broker's session series on ``/metrics``: ``state=<phase>`` and the counters."""
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kafscale_session_lease_state":
                samples[f"state={sample.labels['state']}"] = sample.value
            elif sample.name.startswith("kafscale_session_lease_"):
                samples[sample.name] = sample.value
    return samples


def refusals(wire: KafkaWire, partitions: list[int]) -> tuple[list[int], list[int]]:
    """(the error codes of a Produce, of a Fetch from offset 0) to each of ``partitions``."""
    produced = [
        produce_partition(
            wire.request(PRODUCE, 9, produce_body(SHARED, p, make_batch(0, [b"suspended"])))
        )[0]
        for p in partitions
    ]
    fetched = [
        int(fetch_partition(wire.request(FETCH, 11, fetch_body(SHARED, p, 0))).error_code)
        for p in partitions
    ]
    return produced, fetched


async def test_a_suspended_owner_is_named_by_every_broker_and_refuses_until_it_resumes(
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    cluster_name: str,
    tmp_path: Path,
    etcd: Etcd,
) -> None:
    """Two brokers; etcd's answers to one of them (S) are held back past its TTL while its
    keepalives still renew the lease in etcd. The other broker (B), reading etcd, names S
    leader of what S owns; so does S: every Metadata answer is the same, and a client sent to
    S by either is sent back to S. S refuses Produce and Fetch for its own partitions with
    NOT_LEADER_OR_FOLLOWER (retriable, nothing written) and serves them again once it
    resumes; ``/metrics`` shows the suspension. Before: S named B leader of its partitions,
    and B, where etcd says S owns them, refused and named S: a client went back and forth
    between two brokers; and S's metrics read as a healthy session."""
    with relayed_cluster(
        etcd_server,
        s3_server,
        tmp_path,
        cluster_name,
        KAFSCALE_ETCD__SESSION_TTL_S=SUSPENDABLE_TTL_S,
    ) as held:
        cluster, suspended, log_says = held.cluster, held.broker, held.log_says
        other = cluster.start(
            KAFSCALE_ETCD__ENDPOINTS=json.dumps([etcd_server.client_url]),
            KAFSCALE_ETCD__SESSION_TTL_S=SUSPENDABLE_TTL_S,
        )
        me = suspended.node_id
        await create_topic(etcd, cluster.cluster, SHARED, SHARED_PARTITIONS, {})

        with (
            KafkaWire(suspended.bootstrap, timeout_s=WAIT_S) as at_s,
            KafkaWire(other.bootstrap, timeout_s=WAIT_S) as at_b,
        ):
            wires = {me: at_s, other.node_id: at_b}

            async def all_owned() -> bool:
                """Every partition held in etcd, some by S (each produced to where Metadata
                sends a client, which claims it on demand)."""
                holders = await lease_holders(etcd, cluster.cluster, SHARED, SHARED_PARTITIONS)
                for partition, leader in leaders_by_partition(at_s, SHARED).items():
                    if partition not in holders and leader in wires:
                        body = produce_body(SHARED, partition, make_batch(0, [b"first"]))
                        wires[leader].request(PRODUCE, 9, body)  # claims it, or tried again
                return len(holders) == SHARED_PARTITIONS and me in holders.values()

            await until(all_owned, "the partitions never all had an owner, some S", suspended)
            holders = await lease_holders(etcd, cluster.cluster, SHARED, SHARED_PARTITIONS)
            mine = sorted(p for p, holder in holders.items() if holder == me)

            async def lapsed() -> bool:
                return log_says("suspended")

            # a fault that must outlast the TTL: its length is the point
            with held.relay.holding_replies():
                await until(lapsed, "the keepalives kept being answered", suspended)
                # etcd still holds S's keys: both name S where it owns, and agree everywhere.
                from_s = leaders_by_partition(at_s, SHARED)
                from_b = leaders_by_partition(at_b, SHARED)
                assert from_b == holders, (from_b, holders)
                assert from_s == from_b, (from_s, from_b, suspended.tail())
                produced, fetched = refusals(at_s, mine)
                during = session_samples(suspended)
                assert not held.said_lost(), suspended.tail()  # the checks ran while suspended
            not_leader = ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert produced == fetched == [not_leader] * len(mine), (produced, fetched)
            assert during["state=suspended"] == 1, during
            assert during["state=valid"] == during["state=lost"] == 0, during
            await until_resumed(held)
            for partition in mine:
                body = produce_body(SHARED, partition, make_batch(0, [b"after"]))
                assert produce_partition(at_s.request(PRODUCE, 9, body))[0] == ErrorCode.NONE
            after = session_samples(suspended)
        assert after["state=valid"] == 1, after
        assert after["kafscale_session_lease_suspensions_total"] == 1, after
        assert after["kafscale_session_lease_resumptions_total"] == 1, after
