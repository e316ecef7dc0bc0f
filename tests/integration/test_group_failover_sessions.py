"""A group taken on after its coordinator died runs its members' sessions from the lease's end.

Kafka's new coordinator loads a group at the failover and runs the loaded members' sessions
from then. Here a group is taken on at its first request, and after a coordinator froze or
died that first request is most often a member that gave its member id up at its own session
timeout and joins anew: the loaded record still names the old id, and a session from the load
held the rebalance a whole session more for that ghost. ``bench/chaos.py --seed 14`` (all
kinds, coord-stop among them: bench/README.md) lost ~5-10 s per coordinator move to it, and
51 s with a partition unassigned once three moves came in a row. Now the sessions run from
when this broker saw the lease go: a member that had not been heard of for a whole session
since is gone when the group is taken on, as it would be at Kafka's new coordinator.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness.brokers import new_cluster
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

JOIN_GROUP, SYNC_GROUP, FIND_COORDINATOR, DESCRIBE_GROUPS = 11, 14, 10, 15
SESSION_MS = 6_000  # Kafka's smallest allowed session
DEADLINE_S = 120.0  # generous: the machine is shared


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


def coordinator(bootstrap: str) -> int:
    with KafkaWire(bootstrap) as wire:
        answer = wire.request(FIND_COORDINATOR, 1, {"key": "g", "key_type": 0})
    return answer.node_id if answer.error_code == ErrorCode.NONE else -1


def test_members_of_a_dead_coordinator_are_not_waited_for_a_new_session(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "f", name=cluster_name
    )
    try:
        brokers = [cluster.start(), cluster.start()]
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
        deadline = time.monotonic() + DEADLINE_S
        while coordinator(survivor.bootstrap) in (first, -1):  # the dead lease expired
            assert time.monotonic() < deadline, survivor.tail()
            time.sleep(0.2)
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
