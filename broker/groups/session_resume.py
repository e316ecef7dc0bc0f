"""Members' timers when their coordinator's etcd session resumes: a pure decision.

A coordinator whose etcd session is suspended (``metadata/session_lease``: keepalives unanswered
for a TTL) answers every member NOT_COORDINATOR, and its group timers wait. If etcd then renews
the lease, it coordinates the group again with nothing taken from it. Its members could not
heartbeat meanwhile: the coordinator refused them. So a session that ran out while they were
refused says nothing about them, yet the timers expired every such member at the resumption and
the group rebalanced from scratch after an etcd hiccup that moved nothing (a 6-s session and the
default 10-s TTL are enough). Each now gets a whole session (and a revoking member its rebalance
timeout) from the resumption, as a Kafka coordinator gives the members of a group it loads
(``GroupMetadataManager.onLoaded``); a member that really died expires one session later.
"""

from __future__ import annotations


def resumed_deadline_ms(deadline_ms: int | None, now_ms: int, timeout_ms: int) -> int | None:
    """``deadline_ms`` moved to no earlier than a whole ``timeout_ms`` from ``now_ms`` (the
    resumption); None (no timer running) stays None."""
    if deadline_ms is None:
        return None
    return max(deadline_ms, now_ms + timeout_ms)
