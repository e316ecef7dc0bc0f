"""Members' timers when their coordinator's etcd session resumes: pure decisions.

A coordinator whose etcd session is suspended (``metadata/session_lease``: keepalives unanswered
for a TTL) answers every member NOT_COORDINATOR, and its group timers wait. If etcd then renews
the lease, it coordinates the group again with nothing taken from it. Its members could not
heartbeat meanwhile: the coordinator refused them. So a session that ran out while they were
refused says nothing about them, yet the timers expired every such member at the resumption and
the group rebalanced from scratch after an etcd hiccup that moved nothing (a 6-s session and the
default 10-s TTL are enough). Each now gets a whole session (and a revoking member its rebalance
timeout) from the resumption, as a Kafka coordinator gives the members of a group it loads
(``GroupMetadataManager.onLoaded``); a member that really died expires one session later.

A classic rebalance waiting on its members is the same case: a member told to rejoin could not
(its JoinGroup, or its SyncGroup after the join, was refused too), so a join or sync deadline
that passed meanwhile completed the rebalance at the resumption without it, and it had to rejoin
and rebalance the group once more. A Kafka coordinator that loads a group mid-rebalance has only
the last stored generation, so the rebalance starts again when the members rejoin, with a whole
rebalance timeout from then; here the rebalance keeps the members already in and its phase gets
a whole timeout from the resumption (``resumed_join_deadline_ms``). It completes as soon as
everyone is in, so only a member that really died costs that time. A member id handed out with
MEMBER_ID_REQUIRED, which the join waits for too, gets a whole session. KIP-848 consumer groups
and share groups have no such group-wide phase (a consumer group's revocation timeout is per
member, above).

Every group coordinated on the session is moved, however its timers were scheduled. Before,
only a group whose timer task woke during the suspension noticed it: a suspension that ended
before the group's next deadline left its members only what remained of their sessions (a
member refused for 8 s whose deadline fell 1 s after the resumption expired 1 s later). The
session lease now tells when it last resumed (``SessionLease.resumed_at_ms``), and each group
compares that with the resumption it last moved its timers for, at each timer step and each
request (``resumption_to_apply``), and moves them from the resumption itself.
"""

from __future__ import annotations

from typing import overload


@overload
def resumed_deadline_ms(deadline_ms: int, now_ms: int, timeout_ms: int) -> int: ...


@overload
def resumed_deadline_ms(deadline_ms: int | None, now_ms: int, timeout_ms: int) -> int | None: ...


def resumed_deadline_ms(deadline_ms: int | None, now_ms: int, timeout_ms: int) -> int | None:
    """``deadline_ms`` moved to no earlier than a whole ``timeout_ms`` from ``now_ms`` (the
    resumption); None (no timer running) stays None."""
    if deadline_ms is None:
        return None
    return max(deadline_ms, now_ms + timeout_ms)


def resumed_join_deadline_ms(
    deadline_ms: int | None, now_ms: int, rebalance_timeout_ms: int, initial_delay_ms: int | None
) -> int | None:
    """A classic rebalance's join deadline at the resumption: a whole phase from ``now_ms``.

    The phase is the rebalance timeout, or, while a group that was Empty waits out its initial
    rebalance delay (``initial_delay_ms`` not None), that delay: such a join never completes
    early, so a whole rebalance timeout (minutes for the Java client) would hold every member
    already in that long; the refused newcomers arriving within the delay extend it as any new
    member does."""
    phase_ms = rebalance_timeout_ms if initial_delay_ms is None else initial_delay_ms
    return resumed_deadline_ms(deadline_ms, now_ms, phase_ms)


def resumption_to_apply(applied_ms: int | None, resumed_ms: int | None, now_ms: int) -> int | None:
    """From when a group's members' timers must be moved now, or None: the session's last
    resumption (``resumed_ms``) if the group has not moved them for it yet (``applied_ms``, the
    last one it did, or the session's last one when the group was taken on). Never later than
    ``now_ms``: a resumption is in the past, and a timer moved from the future would give more
    than a whole session."""
    if resumed_ms is None or resumed_ms == applied_ms:
        return None
    return min(resumed_ms, now_ms)
