"""One classic consumer-group member's requests on the raw wire (``kafka_wire.KafkaWire``).

For tests that drive a coordinator step by step rather than through a client: a JoinGroup
parked across a fault (sent now, its answer read later), heartbeats answered while the
coordinator's etcd session is suspended (``test_session_lapse``, ``test_rebalance_resume``).
JoinGroup and SyncGroup v5, Heartbeat v4: member ids required, no group.instance.id, protocol
type ``consumer`` with one protocol, ``range``.
"""

from __future__ import annotations

from collections.abc import Mapping

from harness.kafka_wire import KafkaWire
from kafscale.broker.protocol.errors import ErrorCode

JOIN_GROUP, SYNC_GROUP, HEARTBEAT = 11, 14, 12
JOIN_VERSION = SYNC_VERSION = 5
HEARTBEAT_VERSION = 4


def join_body(
    group: str, member_id: str = "", *, session_ms: int, rebalance_ms: int
) -> dict[str, object]:
    """A JoinGroup body: a new member's (no member id: answered MEMBER_ID_REQUIRED with one)
    or a member's rejoin."""
    return {
        "group_id": group,
        "session_timeout": session_ms,
        "rebalance_timeout": rebalance_ms,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }


def sync_body(
    group: str, member_id: str, generation: int, assignments: Mapping[str, bytes] | None = None
) -> dict[str, object]:
    """A SyncGroup body: the leader's with ``assignments``, a follower's without."""
    return {
        "group_id": group,
        "generation_id": generation,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocol_name": "range",
        "assignments": [
            {"member_id": member, "assignment": assignment}
            for member, assignment in (assignments or {}).items()
        ],
    }


def heartbeat_code(wire: KafkaWire, group: str, member: str, generation: int) -> int:
    """The error code of one classic Heartbeat of ``member``."""
    body = {
        "group_id": group,
        "generation_id": generation,
        "member_id": member,
        "group_instance_id": None,
    }
    return int(wire.request(HEARTBEAT, HEARTBEAT_VERSION, body).error_code)


def member_id_required(wire: KafkaWire, group: str, *, session_ms: int, rebalance_ms: int) -> str:
    """The member id a new member is handed (MEMBER_ID_REQUIRED), to join with next."""
    body = join_body(group, session_ms=session_ms, rebalance_ms=rebalance_ms)
    answer = wire.request(JOIN_GROUP, JOIN_VERSION, body)
    assert answer.error_code == ErrorCode.MEMBER_ID_REQUIRED, answer
    return str(answer.member_id)


def stable_member(
    wire: KafkaWire, group: str, *, session_ms: int, rebalance_ms: int
) -> tuple[str, int]:
    """(member id, generation) of the only member of a Stable group: the member-id handshake,
    its join, then its SyncGroup (it leads, and assigns itself nothing)."""
    member = member_id_required(wire, group, session_ms=session_ms, rebalance_ms=rebalance_ms)
    body = join_body(group, member, session_ms=session_ms, rebalance_ms=rebalance_ms)
    answer = wire.request(JOIN_GROUP, JOIN_VERSION, body)
    assert answer.error_code == ErrorCode.NONE, answer
    sync = sync_body(group, member, answer.generation_id, {member: b""})
    assert wire.request(SYNC_GROUP, SYNC_VERSION, sync).error_code == ErrorCode.NONE
    return member, int(answer.generation_id)
