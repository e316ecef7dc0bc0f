"""Consumer groups with the real clients (kafka-python, aiokafka, confluent-kafka) against
several broker processes.

* members connected to different brokers, with different client libraries and one shared
  client.id, form one group with disjoint assignments covering every partition;
* members join, leave gracefully and are killed while records flow: no committed record is
  consumed again by a live member, and nothing is lost;
* cooperative-sticky rebalances are incremental (a member keeps what it is not asked to give);
* static members (group.instance.id) restart without a rebalance;
* the coordinator's broker is killed mid-consumption: the group carries on at another broker
  from its committed offsets.

Brokers run with a short initial rebalance delay and members with short sessions, so the
whole module stays well under two minutes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess, running_cluster
from harness.etcd import harness_etcd
from harness.groups import (
    GROUP_ENV,
    PARTITIONS,
    SHARED_CLIENT_ID,
    AioKafkaMember,
    ConfluentMember,
    Feed,
    KafkaPythonMember,
    Member,
    assert_no_committed_record_seen_twice,
    create_topic,
    report,
    running,
    split_evenly,
    wait_for_members,
)
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.groups.store import decode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration


def start_brokers(cluster: BrokerCluster, count: int) -> list[BrokerProcess]:
    return [cluster.start(**GROUP_ENV) for _ in range(count)]


@pytest.fixture(scope="module")
def two_brokers(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """Two brokers for the tests that neither kill nor add one, each with a topic and a group of
    its own: two brokers started for each cost ~3 s of the suite's time."""
    with running_cluster(
        etcd_server, s3_server, tmp_path_factory, "groups", brokers=2, extra_env=GROUP_ENV
    ) as cluster:
        yield cluster


def describe(bootstrap: str, group: str) -> Any:
    with KafkaWire(bootstrap.split(",")[0]) as wire:
        response = wire.request(10, 3, {"key": group, "key_type": 0})
        coordinator = f"{response.host}:{response.port}"
    with KafkaWire(coordinator) as wire:
        return wire.request(15, 5, {"groups": [group]}).groups[0]


def coordinator_of(bootstrap: str, group: str) -> int:
    with KafkaWire(bootstrap.split(",")[0]) as wire:
        return int(wire.request(10, 3, {"key": group, "key_type": 0}).node_id)


# --- tests ----------------------------------------------------------------------------------------


def test_members_of_three_clients_on_three_brokers_share_one_group(
    broker_cluster: BrokerCluster,
) -> None:
    brokers = start_brokers(broker_cluster, 3)
    topic, group = "mixed", "mixed-group"
    create_topic(broker_cluster.bootstrap, topic)
    feed = Feed(broker_cluster.bootstrap, topic)
    feed.produce(300)
    members: list[Member] = [
        KafkaPythonMember("kafka-python", brokers[0].bootstrap, group, topic),
        AioKafkaMember("aiokafka", brokers[1].bootstrap, group, topic),
        ConfluentMember("confluent", brokers[2].bootstrap, group, topic),
    ]
    with running(*members):
        wait_for_members(lambda: split_evenly(members), 45, "one group over all partitions")
        wait_for_members(
            lambda: len({v for m in members for v in m.values()}) >= 300, 30, "all records"
        )
        summary = describe(brokers[0].bootstrap, group)
        assert summary.group_state == "Stable"
        # aiokafka only speaks roundrobin: the protocol everyone supports wins the vote.
        assert summary.protocol_data == "roundrobin"
        assert len({m.member_id for m in summary.members}) == 3
        assert {m.client_id for m in summary.members} == {SHARED_CLIENT_ID}
    consumed = Counter(v for m in members for v in m.values())
    assert set(consumed) == set(range(300))
    assert_no_committed_record_seen_twice(members)
    report(members)


KILLABLE_MEMBER = """
import sys
from confluent_kafka import Consumer
bootstrap, group, topic, out = sys.argv[1:5]
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "client.id": "shared-client",
    "enable.auto.commit": False, "auto.offset.reset": "earliest",
    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "log_level": 2,
})
consumer.subscribe([topic])
with open(out, "a", buffering=1) as log:
    while True:
        message = consumer.poll(0.1)
        if message is None or message.error() is not None:
            continue
        # Noted before the commit: a record committed is always in the log.
        log.write(f"{message.partition()} {message.offset()} {int(message.value())}\\n")
        consumer.commit(message=message, asynchronous=False)
"""


def test_join_leave_and_kill_while_records_flow(two_brokers: BrokerCluster, tmp_path: Path) -> None:
    brokers = two_brokers.brokers
    topic, group = "churn", "churn-group"
    create_topic(two_brokers.bootstrap, topic)
    feed = Feed(two_brokers.bootstrap, topic)
    first = ConfluentMember("first", brokers[0].bootstrap, group, topic)
    second = ConfluentMember("second", brokers[1].bootstrap, group, topic)
    joiner = ConfluentMember("joiner", brokers[0].bootstrap, group, topic)
    log = tmp_path / "killed-member.log"
    killable = children.spawn(
        [sys.executable, "-c", KILLABLE_MEMBER, brokers[1].bootstrap, group, topic, str(log)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        feed.start()
        with running(first, second):
            members: list[Member] = [first, second]
            wait_for_members(
                lambda: len(first.consumed) + len(second.consumed) > 100, 30, "consuming"
            )
            joiner.start()  # a member joins
            wait_for_members(lambda: len(joiner.consumed) > 20, 30, "the new member consuming")
            second.stop()  # a member leaves gracefully
            members = [first, joiner]
            wait_for_members(
                lambda: log.exists() and log.stat().st_size > 0, 30, "killable consuming"
            )
            killable.send_signal(signal.SIGKILL)  # a member dies
            killable.wait(10)
            before = sum(len(m.consumed) for m in members)
            wait_for_members(
                lambda: sum(len(m.consumed) for m in members) > before + 200, 40, "carry on"
            )
            feed.stop()
            assert not feed.failed
            killed = {int(line.split()[2]) for line in log.read_text().splitlines()}

            def missing() -> list[int]:
                seen = {v for m in (first, second, joiner) for v in m.values()}
                return sorted(set(range(feed.sent)) - seen - killed)

            try:
                wait_for_members(lambda: not missing(), 40, "every record consumed")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; missing {missing()[:20]}") from exc
            joiner.stop()
    finally:
        killable.kill()
        killable.wait(10)
    assert_no_committed_record_seen_twice([first, second, joiner])
    report([first, second, joiner], killed)
    # The member that left handed its work over: nothing it committed came back.
    assert second.consumed and all(r.committed for r in second.consumed[-5:])


def test_cooperative_sticky_rebalances_are_incremental(two_brokers: BrokerCluster) -> None:
    brokers = two_brokers.brokers
    topic, group = "coop", "coop-group"
    create_topic(two_brokers.bootstrap, topic)
    feed = Feed(two_brokers.bootstrap, topic)
    feed.produce(600)
    cooperative = {"partition.assignment.strategy": "cooperative-sticky"}
    a = ConfluentMember("a", brokers[0].bootstrap, group, topic, cooperative)
    b = ConfluentMember("b", brokers[1].bootstrap, group, topic, cooperative)
    c = ConfluentMember("c", brokers[0].bootstrap, group, topic, cooperative)
    with running(a):
        wait_for_members(lambda: len(a.assignment) == PARTITIONS, 30, "a owning everything")
        with running(b):
            wait_for_members(lambda: split_evenly([a, b]), 30, "a and b sharing")
            with running(c):
                wait_for_members(lambda: split_evenly([a, b, c]), 30, "a, b and c sharing")
                feed.produce(300)
                # Distinct values: a record re-read after a rebalance (uncommitted) counts once.
                wait_for_members(
                    lambda: len({v for m in (a, b, c) for v in m.values()}) >= 900, 30, "all"
                )
                assert summary_protocol(brokers[0].bootstrap, group) == "cooperative-sticky"
    # Incremental: a only ever gave up some partitions, never all at once while others joined.
    assert a.assigned[0] == list(range(PARTITIONS))
    handed_over = a.revoked[: len(a.revoked) - 1]  # the last one is a's own leave
    assert handed_over and all(0 < len(r) < PARTITIONS for r in handed_over)
    assert set(v for m in (a, b, c) for v in m.values()) == set(range(900))
    assert_no_committed_record_seen_twice([a, b, c])
    report([a, b, c])


def summary_protocol(bootstrap: str, group: str) -> str:
    return str(describe(bootstrap, group).protocol_data)


def test_static_members_restart_without_a_rebalance(two_brokers: BrokerCluster) -> None:
    brokers = two_brokers.brokers
    topic, group = "static", "static-group"
    create_topic(two_brokers.bootstrap, topic)
    static = {"session.timeout.ms": 10_000}
    a = ConfluentMember(
        "a", brokers[0].bootstrap, group, topic, {**static, "group.instance.id": "a"}
    )
    b = ConfluentMember(
        "b", brokers[1].bootstrap, group, topic, {**static, "group.instance.id": "b"}
    )
    with running(a, b):
        wait_for_members(lambda: split_evenly([a, b]), 30, "a and b sharing")
        time.sleep(1)
        before = describe(brokers[0].bootstrap, group)
        a_calls, b_partitions = (len(a.assigned), len(a.revoked)), b.assignment
        b.stop()  # a static member does not leave the group when it closes
        b2 = ConfluentMember(
            "b2", brokers[0].bootstrap, group, topic, {**static, "group.instance.id": "b"}
        )
        with running(b2):
            wait_for_members(lambda: b2.assignment == b_partitions, 30, "b's partitions back")
            time.sleep(2)  # a rebalance, if any, would reach a within a heartbeat
            after = describe(brokers[0].bootstrap, group)
            assert (len(a.assigned), len(a.revoked)) == a_calls, "a saw no rebalance"
    old_ids = {m.group_instance_id: m.member_id for m in before.members}
    new_ids = {m.group_instance_id: m.member_id for m in after.members}
    assert set(new_ids) == {"a", "b"}
    assert new_ids["a"] == old_ids["a"] and new_ids["b"] != old_ids["b"]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_coordinator_lost_mid_consumption(broker_cluster: BrokerCluster, how: str) -> None:
    """SIGKILL: the lease expires after the session TTL; SIGTERM: it is handed over at once.

    Either way the new coordinator loads the group Stable at its generation: the members
    carry on without a rebalance, committing to the new coordinator.
    """
    brokers = start_brokers(broker_cluster, 3)
    topic, group = "failover", "failover-group"
    create_topic(broker_cluster.bootstrap, topic)
    bootstrap = broker_cluster.bootstrap
    feed = Feed(bootstrap, topic)
    feed.start()
    members: list[Member] = [
        KafkaPythonMember("kp-1", bootstrap, group, topic, {"session_timeout_ms": 15_000}),
        KafkaPythonMember("kp-2", bootstrap, group, topic, {"session_timeout_ms": 15_000}),
    ]
    with running(*members):
        wait_for_members(lambda: split_evenly(members), 45, "the group formed")
        wait_for_members(lambda: sum(len(m.consumed) for m in members) >= 200, 30, "consuming")
        victim_id = coordinator_of(bootstrap, group)
        victim = next(b for b in brokers if b.node_id == victim_id)
        survivors = [b for b in brokers if b is not victim]
        survivor_bootstrap = ",".join(b.bootstrap for b in survivors)
        committed_at_kill = committed_offsets(survivor_bootstrap, group, topic)
        generation_at_kill = stored_generation(broker_cluster, group)
        if how == "SIGKILL":
            victim.kill()
        else:
            victim.stop()
        at_kill = sum(len(m.consumed) for m in members)
        wait_for_members(
            lambda: coordinator_of(survivor_bootstrap, group) != victim_id, 30, "a new one"
        )
        wait_for_members(
            lambda: sum(len(m.consumed) for m in members) > at_kill + 400, 60, "carry on"
        )
        feed.stop()
        assert not feed.failed
        wait_for_members(
            lambda: {v for m in members for v in m.values()} >= set(range(feed.sent)),
            60,
            "every record consumed",
        )
        # No rebalance: the generation (stored at each completed rebalance) is the same.
        assert stored_generation(broker_cluster, group) == generation_at_kill
    report(members)
    # Anything consumed twice was consumed again from a committed offset, never from before.
    seen = Counter((r.partition, r.offset) for m in members for r in m.consumed)
    for (partition, offset), times in seen.items():
        if times > 1:
            assert offset >= committed_at_kill.get(partition, 0), (partition, offset)
    # The new coordinator has every commit: a fresh member of the group finds nothing to do.
    fresh = KafkaPythonMember("fresh", survivor_bootstrap, group, topic)
    with running(fresh):
        wait_for_members(lambda: bool(fresh.assignment), 30, "fresh member assigned")
        time.sleep(2)
    assert fresh.consumed == []


def stored_generation(cluster: BrokerCluster, group: str) -> int:
    """The generation of the group's last completed rebalance, as stored in etcd."""

    async def read() -> int:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            kv = await etcd.get(keys.group_metadata_key(cluster.cluster, group))
        finally:
            await etcd.close()
        assert kv is not None
        return decode_group(kv.value).generation

    return asyncio.run(read())


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    with KafkaWire(bootstrap.split(",")[0]) as wire:
        response = wire.request(10, 3, {"key": group, "key_type": 0})
        coordinator = f"{response.host}:{response.port}"
    with KafkaWire(coordinator) as wire:
        body = {"group_id": group, "topics": [{"name": topic, "partition_indexes": list(range(6))}]}
        fetched = wire.request(9, 7, {**body, "require_stable": False})
    return {p.partition_index: p.committed_offset for t in fetched.topics for p in t.partitions}
