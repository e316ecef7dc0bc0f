"""A group taken on after its coordinator died runs its members' sessions from the lease's end.

Kafka's new coordinator loads a group at the failover and runs the loaded members' sessions
from then (``GroupMetadataManager.onLoaded``, classic and consumer-protocol groups alike). Here
a group is taken on at its first request, which may come well after the lease went:

* classic: after a coordinator froze or died, that first request is most often a member that
  gave its member id up at its own session timeout and joins anew: the loaded record still
  names the old id, and a session from the load held the rebalance a whole session more for
  that ghost. ``bench/chaos.py --seed 14`` (all kinds, coord-stop among them: bench/README.md)
  lost ~5-10 s per coordinator move to it, and 51 s with a partition unassigned once three
  moves came in a row;
* consumer protocol (KIP-848): the first request is the heartbeat of the first live member to
  find the new coordinator; a member that died with the old one kept its partitions a whole
  session after that, not after the lease went: the takeover's length more.

Now the sessions run from when this broker saw the lease go: a member that has not been heard of
for a whole session since is gone when the group is taken on, as it would be at Kafka's new
coordinator, and its partitions go to the live members then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness import children, topics
from harness.brokers import STEADY_SESSION_TTL_S, BrokerProcess, new_cluster
from harness.groups import QUIET, wait_for
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

JOIN_GROUP, SYNC_GROUP, FIND_COORDINATOR, DESCRIBE_GROUPS = 11, 14, 10, 15
SESSION_MS = 6_000  # Kafka's smallest allowed session
DEADLINE_S = 120.0  # generous: the machine is shared
STEADY = {"KAFSCALE_ETCD__SESSION_TTL_S": STEADY_SESSION_TTL_S}
"""Every test here: the harness's 4-s sessions were lost to starved keepalives at load 30-60
between FindCoordinator and the member's JoinGroup (which then got NOT_COORDINATOR), or moved
the group before its coordinator was killed. Each test waits for the dead broker's lease to
end (``await_lease_end``), whatever its length."""


def join(member_id: str = "") -> dict[str, object]:
    return {
        "group_id": "g",
        "session_timeout": SESSION_MS,
        "rebalance_timeout": SESSION_MS,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }


def coordinator(bootstrap: str, group: str = "g") -> int:
    with KafkaWire(bootstrap) as wire:
        answer = wire.request(FIND_COORDINATOR, 1, {"key": group, "key_type": 0})
    return answer.node_id if answer.error_code == ErrorCode.NONE else -1


def await_lease_end(survivor: BrokerProcess, group: str, dead: int) -> float:
    """When (monotonic) ``survivor`` first names another coordinator than the killed ``dead``:
    the dead broker's lease expired (the survivor saw it go no later than that)."""
    deadline = time.monotonic() + DEADLINE_S
    while coordinator(survivor.bootstrap, group) in (dead, -1):
        assert time.monotonic() < deadline, survivor.tail()
        time.sleep(0.2)
    return time.monotonic()


def test_members_of_a_dead_coordinator_are_not_waited_for_a_new_session(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "f", name=cluster_name
    )
    try:
        brokers = [cluster.start(**STEADY), cluster.start(**STEADY)]
        first = coordinator(brokers[0].bootstrap)
        with KafkaWire(brokers[0].bootstrap) as wire:
            ids = wire.request(3, 1, {"topics": []}).brokers  # Metadata: node id -> port
        port = next(b.port for b in ids if b.node_id == first)
        dead, survivor = sorted(brokers, key=lambda b: b.port != port)
        with KafkaWire(dead.bootstrap, timeout_s=60) as wire:
            required = wire.request(JOIN_GROUP, 5, join())
            member = required.member_id
            joined = wire.request(JOIN_GROUP, 5, join(member))
            assert joined.error_code == ErrorCode.NONE
            sync = {
                "group_id": "g",
                "generation_id": joined.generation_id,
                "member_id": member,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocol_name": "range",
                "assignments": [{"member_id": member, "assignment": b""}],
            }
            assert wire.request(SYNC_GROUP, 5, sync).error_code == ErrorCode.NONE
        dead.kill()  # the member's process hangs with it: it never heartbeats again
        await_lease_end(survivor, "g", first)
        time.sleep(SESSION_MS / 1000 + 2)  # a whole session without the member since
        with KafkaWire(survivor.bootstrap, timeout_s=60) as wire:
            # A new member's first JoinGroup: the survivor takes the group on.
            assert wire.request(JOIN_GROUP, 5, join()).error_code == ErrorCode.MEMBER_ID_REQUIRED
            described = wire.request(
                DESCRIBE_GROUPS, 3, {"groups": ["g"], "include_authorized_operations": False}
            ).groups[0]
        # The dead member is gone at once (before: a member for a new session from the load,
        # which a rebalance then waited for).
        assert [m.member_id for m in described.members] == [], (described, survivor.tail())
    finally:
        cluster.stop_all()


# --- the consumer protocol (KIP-848) -------------------------------------------------------------

CONSUMER_SESSION_MS = 10_000
TAKEOVER_S = 5.0
"""How long after the lease went the live member first reaches the new coordinator (it is held
frozen until then): half a session, so it is still a member when it does, and a session from
the load would keep the dead member that much past one from the lease's end."""
CONSUMER_ENV = {
    **STEADY,
    "KAFSCALE_GROUPS__CONSUMER_SESSION_TIMEOUT_MS": str(CONSUMER_SESSION_MS),
    "KAFSCALE_GROUPS__CONSUMER_HEARTBEAT_INTERVAL_MS": "500",
}
MEMBER = """
import sys
from confluent_kafka import Consumer
bootstrap, group, topic, name, out = sys.argv[1:6]
log = open(out, "a", buffering=1)
def noting(kind):
    def note(consumer, partitions):
        log.write(kind + " " + ",".join(str(tp.partition) for tp in partitions) + "\\n")
    return note
consumer = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
    "client.id": name, "enable.auto.commit": False, "log_level": 2,
})
consumer.subscribe(
    [topic], on_assign=noting("assigned"), on_revoke=noting("revoked"), on_lost=noting("lost")
)
while True:
    consumer.poll(0.1)
"""
"""A librdkafka consumer-protocol member in a process of its own (to be SIGKILLed or frozen),
noting the partitions it is given and takes back in ``out``."""


def start_member(
    bootstrap: str, group: str, topic: str, name: str, out: Path
) -> subprocess.Popen[bytes]:
    return children.spawn(
        [sys.executable, "-c", MEMBER, bootstrap, group, topic, name, str(out)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def owned(out: Path) -> set[int]:
    """The partitions a member holds now, by its own callbacks."""
    held: set[int] = set()
    for line in out.read_text().splitlines() if out.exists() else ():
        kind, _, listed = line.partition(" ")
        partitions = {int(p) for p in listed.split(",") if p}
        held = held | partitions if kind == "assigned" else held - partitions
    return held


def describe_consumer_group(broker: BrokerProcess, group: str) -> Any:
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        request = {"group_ids": [group], "include_authorized_operations": False}
        (described,) = wire.request(69, 1, request).groups
    return described


def target_partitions(member: Any) -> set[int]:
    return {p for t in member.target_assignment.topic_partitions for p in t.partitions}


def test_a_consumer_group_member_that_died_with_its_coordinator_is_gone_a_session_after_the_lease(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """Two librdkafka members (``group.protocol=consumer``) share a topic; the coordinator's
    broker and one member are SIGKILLed together; the other member reaches the broker that
    takes the group on only ``TAKEOVER_S`` after the lease went. A session after the lease
    went, the dead member is gone and its partition is the live member's, not a whole session
    after the group was taken on."""
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "f", name=cluster_name
    )
    members: list[subprocess.Popen[bytes]] = []
    try:
        brokers = [cluster.start(**CONSUMER_ENV), cluster.start(**CONSUMER_ENV)]
        group, topic = "kip848-failover", "kip848-failover"
        topics.create_topic(brokers[0].bootstrap, topic, 2, log_level=QUIET)
        first = coordinator(brokers[0].bootstrap, group)
        dead_broker, survivor = sorted(brokers, key=lambda b: b.node_id != first)
        bootstrap = ",".join(b.bootstrap for b in brokers)
        dead_out, live_out = tmp_path / "dead.log", tmp_path / "live.log"
        dead = start_member(bootstrap, group, topic, "dead", dead_out)
        members.append(dead)
        wait_for(lambda: owned(dead_out) == {0, 1}, 60, "the first member to hold both")
        live = start_member(bootstrap, group, topic, "live", live_out)
        members.append(live)
        wait_for(
            lambda: len(owned(dead_out)) == 1 and len(owned(live_out)) == 1,
            60,
            "the members to hold a partition each",
        )
        live.send_signal(signal.SIGSTOP)  # reaches no coordinator until it is woken
        dead_broker.kill()
        dead.kill()  # the member dies with its coordinator: it never heartbeats again
        lease_gone = await_lease_end(survivor, group, first)
        time.sleep(TAKEOVER_S)  # the time is the point: a takeover that took this long
        live.send_signal(signal.SIGCONT)  # its heartbeat takes the group on at the survivor
        # The time is the point again: a session after the lease went (plus slack), and
        # TAKEOVER_S short of one after the group was taken on.
        time.sleep(max(lease_gone + CONSUMER_SESSION_MS / 1000 + 2 - time.monotonic(), 0))
        described = describe_consumer_group(survivor, group)
        # The dead member is gone, its partition the live member's to take (before: both
        # still listed, the dead one holding its partition until a session after the load).
        names = [m.client_id for m in described.members]
        assert "dead" not in names, (described, survivor.tail())
        for member in described.members:  # the live one, unless a slow waking cost it its place
            assert target_partitions(member) == {0, 1}, described
        wait_for(lambda: owned(live_out) == {0, 1}, 60, "the live member to hold both")
    finally:
        for member in members:
            member.kill()
            member.wait(10)
        cluster.stop_all()


# --- share groups (KIP-932) ----------------------------------------------------------------------

SHARE_ENV = {**STEADY, "KAFSCALE_GROUPS__SHARE_SESSION_TIMEOUT_MS": str(SESSION_MS)}


def share_join(wire: KafkaWire, group: str, member: str, topic: str) -> Any:
    """ShareGroupHeartbeat v1 joining ``group`` (epoch 0) as ``member``."""
    body = {"group_id": group, "member_id": member, "member_epoch": 0, "rack_id": None}
    return wire.request(76, 1, {**body, "subscribed_topic_names": [topic]})


def test_a_share_group_member_that_died_with_its_coordinator_is_gone_when_taken_on(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """A share group's member joins (ShareGroupHeartbeat) and dies with its coordinator; a
    member joining a whole session after the lease went (the survivor takes the group on) finds
    no other member there (before: the dead one, with a session from the load, sharing the
    partition it never reads)."""
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "f", name=cluster_name
    )
    try:
        brokers = [cluster.start(**SHARE_ENV), cluster.start(**SHARE_ENV)]
        group, topic = "share-failover", "share-failover"
        topics.create_topic(brokers[0].bootstrap, topic, 1, log_level=QUIET)
        first = coordinator(brokers[0].bootstrap, group)
        dead, survivor = sorted(brokers, key=lambda b: b.node_id != first)
        with KafkaWire(dead.bootstrap, timeout_s=60) as wire:
            assert share_join(wire, group, "gone", topic).error_code == ErrorCode.NONE
        dead.kill()  # the member's process hangs with it: it never heartbeats again
        await_lease_end(survivor, group, first)
        time.sleep(SESSION_MS / 1000 + 2)  # a whole session without the member since
        with KafkaWire(survivor.bootstrap, timeout_s=60) as wire:
            # A new member's first heartbeat: the survivor takes the group on.
            assert share_join(wire, group, "new", topic).error_code == ErrorCode.NONE
            body = {"group_ids": [group], "include_authorized_operations": False}
            (described,) = wire.request(77, 1, body).groups  # ShareGroupDescribe
        assert described.error_code == ErrorCode.NONE, described
        members = [m.member_id for m in described.members]
        assert members == ["new"], (described, survivor.tail())
    finally:
        cluster.stop_all()
