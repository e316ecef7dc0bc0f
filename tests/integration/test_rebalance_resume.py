"""A classic rebalance whose coordinator's etcd session was suspended, then resumed.

A coordinator whose keepalives go unanswered for a TTL is suspended (etcd may still hold its
lease: ``broker/metadata/session_lease.py``): it answers every member NOT_COORDINATOR and its
group timers wait. A member told to rejoin could not meanwhile, so a rebalance whose join
deadline passed during the suspension waits a whole rebalance timeout again from the
resumption for the members it refused (``broker/groups/session_resume.py``), as a Kafka
coordinator that loads a group gives its members a whole rebalance timeout to rejoin.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness.classic_wire import (
    JOIN_GROUP,
    JOIN_VERSION,
    SYNC_GROUP,
    SYNC_VERSION,
    heartbeat_code,
    join_body,
    member_id_required,
    stable_member,
    sync_body,
)
from harness.groups import GROUP_ENV, wait_for
from harness.kafka_wire import KafkaWire
from harness.relayed_cluster import LOST, relayed_cluster
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

GROUP = "rejoined"
SESSION_MS = 6000  # Kafka's shortest session by default (group.min.session.timeout.ms)
REBALANCE_MS = 20_000
"""Longer than the broker's session TTL below: a join deadline set just before etcd's answers
are held back passes while the session is suspended (which starts at most a TTL after the last
answered keepalive), and well before the session would be lost (two TTLs after it)."""
TTL_S = 18
WAIT_S = 120.0  # bound of each wait below (a loaded machine); none is a speed


def join(wire: KafkaWire, member: str) -> None:
    """Send ``member``'s JoinGroup (its answer is read later: it may wait in the coordinator)."""
    body = join_body(GROUP, member, session_ms=SESSION_MS, rebalance_ms=REBALANCE_MS)
    wire.send(JOIN_GROUP, JOIN_VERSION, body)


def joined(wire: KafkaWire) -> tuple[int, int, str, set[str]]:
    """(error, generation, leader, members listed) of the JoinGroup answer ``wire`` waits for."""
    answer = wire.recv(JOIN_GROUP, JOIN_VERSION)[1]
    members = {str(m.member_id) for m in answer.members}
    return int(answer.error_code), int(answer.generation_id), str(answer.leader), members


def synced(leader: KafkaWire, follower: KafkaWire, ids: tuple[str, str], generation: int) -> None:
    """Both members' SyncGroup of ``generation``: the follower's waits for the leader's."""
    follower.send(SYNC_GROUP, SYNC_VERSION, sync_body(GROUP, ids[1], generation))
    assignments = {ids[0]: b"", ids[1]: b""}
    body = sync_body(GROUP, ids[0], generation, assignments)
    assert leader.request(SYNC_GROUP, SYNC_VERSION, body).error_code == ErrorCode.NONE
    assert follower.recv(SYNC_GROUP, SYNC_VERSION)[1].error_code == ErrorCode.NONE


def test_a_member_refused_past_the_rebalance_timeout_rejoins_the_same_rebalance(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """A group of two, a and b. a (the leader) rejoins: a rebalance waits for b. etcd's answers
    to the coordinator are then held back until its session is suspended and the rebalance
    timeout has passed; b, heartbeating, learns of the rebalance, then is refused
    (NOT_COORDINATOR), its JoinGroup too. When etcd's answers come the session resumes, and b's
    JoinGroup after it completes the rebalance it was asked to join: a and b in the next
    generation, Stable after their SyncGroups. Before: at the resumption the overdue join
    deadline completed the rebalance with a alone, and b's rejoin was answered
    UNKNOWN_MEMBER_ID (b must join anew: a second rebalance)."""
    with relayed_cluster(
        etcd_server,
        s3_server,
        tmp_path,
        cluster_name,
        KAFSCALE_ETCD__SESSION_TTL_S=str(TTL_S),
        **GROUP_ENV,
    ) as held:
        broker, log_says = held.broker, held.log_says
        with (
            KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as at_a,
            KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as at_b,
        ):
            a, _ = stable_member(at_a, GROUP, session_ms=SESSION_MS, rebalance_ms=REBALANCE_MS)
            b = member_id_required(at_b, GROUP, session_ms=SESSION_MS, rebalance_ms=REBALANCE_MS)
            join(at_b, b)  # waits for a to rejoin
            code = heartbeat_code(at_a, GROUP, a, 1)
            assert code == ErrorCode.REBALANCE_IN_PROGRESS, broker.tail()
            join(at_a, a)
            assert joined(at_a) == (ErrorCode.NONE, 2, a, {a, b}), broker.tail()
            assert joined(at_b)[:3] == (ErrorCode.NONE, 2, a), broker.tail()
            synced(at_a, at_b, (a, b), 2)

            join(at_a, a)  # the leader rejoins: a rebalance waits for b
            join_deadline = time.monotonic() + REBALANCE_MS / 1000
            with held.relay.holding_replies():  # a fault that must outlast the TTL: its length is
                codes = []  # the point

                def refused() -> bool:
                    """b's heartbeats, answered in memory until the session is suspended."""
                    codes.append(heartbeat_code(at_b, GROUP, b, 2))
                    time.sleep(0.5)
                    return codes[-1] == ErrorCode.NOT_COORDINATOR

                wait_for(refused, WAIT_S, "the keepalives kept being answered", broker.tail)
                assert set(codes) <= {ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.NOT_COORDINATOR}
                body = join_body(GROUP, b, session_ms=SESSION_MS, rebalance_ms=REBALANCE_MS)
                answer = at_b.request(JOIN_GROUP, JOIN_VERSION, body)
                assert answer.error_code == ErrorCode.NOT_COORDINATOR, broker.tail()
                time.sleep(max(join_deadline - time.monotonic(), 0) + 1)  # the deadline passes
                assert log_says("suspended") and not held.said_lost(), broker.tail()

            wait_for(
                held.resumed_or_lost,
                WAIT_S,
                "the broker neither resumed nor lost its session",
                broker.tail,
            )
            assert not log_says(LOST), broker.tail()
            # at once: a request meets the resumption even before the group's timers do
            join(at_b, b)
            error, generation, leader, _ = joined(at_b)
            assert ErrorCode(error).name == ErrorCode.NONE.name, broker.tail()
            assert (generation, leader) == (3, a)
            assert joined(at_a) == (ErrorCode.NONE, 3, a, {a, b})
            synced(at_a, at_b, (a, b), 3)
            assert heartbeat_code(at_b, GROUP, b, 3) == ErrorCode.NONE  # no rebalance after it
