"""A coordinator woken from a freeze longer than its etcd session hands out no generation.

A broker frozen past its session's TTL (SIGSTOP, a stalled VM, a long GC pause of a host) has
lost every group lease when it wakes: etcd deleted them with the session. Its keepalive task
notices on its own timer, but the group's timers ran in the same loop turn: a member whose
session had run out during the freeze was expired and the rebalance it held completed, so the
members waiting in JoinGroup were told a generation by a broker that no longer coordinated the
group (DESIGN §3.7: never coordinate without the lease). No coordinator ever stored that
generation: their SyncGroup met UNKNOWN_MEMBER_ID wherever the group was loaded next, and they
joined again from the start. ``bench/chaos.py --seed 14 --kinds ...,coord-stop`` showed it three
times in a row (bench/README.md): each time the coordinator woke, it answered JoinGroup with a
generation just before dropping the group. Now such a broker answers NOT_COORDINATOR and the
members find the group's coordinator, as they do after any move.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from harness.brokers import new_cluster
from harness.children import freeze
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

JOIN_GROUP, SYNC_GROUP = 11, 14
SESSION_MS = 10_000  # the member that holds the rebalance: expires during the freeze
FREEZE_S = 14.0  # past the harness's 4-s etcd session TTL and past SESSION_MS
WAITING_SESSION_MS = 60_000  # the member waiting in JoinGroup: outlives the freeze


def join(member_id: str = "", session_ms: int = SESSION_MS) -> dict[str, object]:
    return {
        "group_id": "g",
        "session_timeout": session_ms,
        "rebalance_timeout": session_ms,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }


def joined(wire: KafkaWire) -> tuple[str, int]:
    """Join the group as a new member (the member-id handshake); (member id, generation)."""
    required = wire.request(JOIN_GROUP, 5, join())
    assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
    answer = wire.request(JOIN_GROUP, 5, join(required.member_id))
    assert answer.error_code == ErrorCode.NONE
    return required.member_id, answer.generation_id


def test_a_woken_coordinator_past_its_session_answers_not_coordinator(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "w", name=cluster_name
    )
    try:
        broker = cluster.start()
        with (
            KafkaWire(broker.bootstrap, timeout_s=120) as first,
            KafkaWire(broker.bootstrap, timeout_s=120) as second,
        ):
            member, generation = joined(first)  # generation 1, stored with its assignment
            sync = {
                "group_id": "g",
                "generation_id": generation,
                "member_id": member,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocol_name": "range",
                "assignments": [{"member_id": member, "assignment": b""}],
            }
            assert first.request(SYNC_GROUP, 5, sync).error_code == ErrorCode.NONE
            # A second member joins: the rebalance waits for the first, which never rejoins
            # (its process hangs), until its session runs out.
            required = second.request(JOIN_GROUP, 5, join(session_ms=WAITING_SESSION_MS))
            second.send(JOIN_GROUP, 5, join(required.member_id, WAITING_SESSION_MS))
            freeze(broker.pid)  # FREEZE_S from when it stopped heartbeating its lease
            try:
                time.sleep(FREEZE_S)
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            _, answer = second.recv(JOIN_GROUP, 5)
        # Woken, the broker holds no lease for the group: the waiting member is sent to find
        # the coordinator (before: error 0 with generation 2, which no coordinator knew).
        assert (ErrorCode(answer.error_code).name, answer.generation_id) == (
            ErrorCode.NOT_COORDINATOR.name,
            -1,
        ), broker.tail()
        deadline = time.monotonic() + 120
        while "etcd session lost" not in broker.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, broker.tail()
            time.sleep(0.2)
    finally:
        cluster.stop_all()
