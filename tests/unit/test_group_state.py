"""The classic group protocol state machine, driven directly with explicit time."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    GroupConfig,
    GroupRecord,
    GroupState,
    JoinRequest,
    JoinResult,
    MemberRecord,
    Pending,
    Reply,
    StaticRejoinStore,
    Store,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

DELAY_MS = 3000
SESSION_MS = 10_000
REBALANCE_MS = 30_000
RANGE = (("range", b"r"),)
FORM_MS = 2 * DELAY_MS
"""A new group forms after two delays: any second member extends the first (as in Kafka)."""


@dataclass
class Harness:
    """A group plus the replies and stores it produced; stores succeed unless told not to."""

    group: Group
    now: int = 0
    replies: dict[int, JoinResult | SyncResult] = field(default_factory=dict)
    stores: list[Store] = field(default_factory=list)
    store_error: ErrorCode = ErrorCode.NONE
    auto_store: bool = True
    fresh: int = 0

    def drain(self) -> None:
        while True:
            effects = self.group.take_effects()
            if not effects:
                return
            for effect in effects:
                if isinstance(effect, Reply):
                    assert effect.ticket not in self.replies, "a ticket answered twice"
                    self.replies[effect.ticket] = effect.result
                else:
                    self.stores.append(effect)
                    if self.auto_store:
                        self.group.stored(self.now, effect.token, self.store_error)

    def join(
        self,
        member_id: str = "",
        *,
        instance: str | None = None,
        protocols: tuple[tuple[str, bytes], ...] = RANGE,
        version: int = 5,
        client_id: str = "client",
        session_ms: int = SESSION_MS,
        protocol_type: str = "consumer",
    ) -> JoinResult | Pending:
        self.fresh += 1
        request = JoinRequest(
            member_id=member_id,
            group_instance_id=instance,
            client_id=client_id,
            client_host="/127.0.0.1",
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=REBALANCE_MS,
            protocol_type=protocol_type,
            protocols=protocols,
            require_known_member_id=version >= 4,
            supports_skip_assignment=version >= 9,
            fresh_id=f"id{self.fresh}",
        )
        result = self.group.join(self.now, request)
        self.drain()
        return result

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance: str | None = None,
    ) -> SyncResult | Pending:
        request = SyncRequest(member_id, generation, instance, None, None, assignments or {})
        result = self.group.sync(self.now, request)
        self.drain()
        return result

    def heartbeat(self, member_id: str, generation: int, instance: str | None = None) -> ErrorCode:
        error = self.group.heartbeat(self.now, member_id, instance, generation)
        self.drain()
        return error

    def leave(self, *members: tuple[str, str | None]) -> list[ErrorCode]:
        errors = self.group.leave(self.now, list(members))
        self.drain()
        return errors

    def advance(self, ms: int) -> None:
        target = self.now + ms
        while True:
            deadline = self.group.next_deadline_ms()
            if deadline is None or deadline > target:
                break
            self.now = max(self.now, deadline)
            self.group.tick(self.now)
            self.drain()
        self.now = target
        self.group.tick(self.now)
        self.drain()

    def answer(self, outcome: JoinResult | SyncResult | Pending) -> JoinResult | SyncResult:
        if isinstance(outcome, Pending):
            return self.replies[outcome.ticket]
        return outcome

    def joined(self, outcome: JoinResult | Pending) -> JoinResult:
        result = self.answer(outcome)
        assert isinstance(result, JoinResult)
        return result

    def synced(self, outcome: SyncResult | Pending) -> SyncResult:
        result = self.answer(outcome)
        assert isinstance(result, SyncResult)
        return result

    def new_member(self, **kwargs: object) -> str:
        """A member id from the MEMBER_ID_REQUIRED handshake; the member is then joining."""
        first = self.join(**kwargs)  # type: ignore[arg-type]
        assert isinstance(first, JoinResult) and first.error is ErrorCode.MEMBER_ID_REQUIRED
        return first.member_id


def make(delay_ms: int = DELAY_MS, min_session_ms: int = 1000) -> Harness:
    config = GroupConfig(initial_rebalance_delay_ms=delay_ms, min_session_timeout_ms=min_session_ms)
    return Harness(Group("g", config, 0))


def stable_group(h: Harness, count: int) -> tuple[list[str], int]:
    """``count`` members joined, synced with one partition each; (member ids, generation)."""
    pendings = []
    for _ in range(count):
        first = h.join(version=3)
        assert isinstance(first, Pending)
        pendings.append(first)
    h.advance(FORM_MS)
    results = [h.joined(p) for p in pendings]
    generation = results[0].generation_id
    leader = results[0].leader_id
    ids = [r.member_id for r in results]
    syncs = [h.sync(m, generation) for m in ids if m != leader]
    assignment = {m: f"p{i}".encode() for i, m in enumerate(ids)}
    syncs.append(h.sync(leader, generation, assignment))
    for s in syncs:
        assert h.synced(s).error is ErrorCode.NONE
    assert h.group.state is GroupState.STABLE
    return ids, generation


# --- join ---------------------------------------------------------------------------------------


def test_member_id_required_only_from_v4() -> None:
    h = make()
    first = h.join(version=4)
    assert isinstance(first, JoinResult)
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("client-")
    assert first.generation_id == -1
    assert h.group.state is GroupState.EMPTY and not h.group.members
    second = h.join(first.member_id, version=4)
    assert isinstance(second, Pending)
    old = h.join(version=3)
    assert isinstance(old, Pending), "v0-3 get a member id assigned directly"
    h.advance(FORM_MS)
    a, b = h.joined(second), h.joined(old)
    assert a.error is b.error is ErrorCode.NONE
    assert a.generation_id == b.generation_id == 1
    assert a.leader_id == b.leader_id == first.member_id
    assert {m.member_id for m in a.members} == {a.member_id, b.member_id}
    assert b.members == ()


def test_pending_member_expires_after_session_timeout() -> None:
    h = make()
    member = h.new_member(version=4, session_ms=5000)
    assert member in h.group.pending_members
    h.advance(5000)
    assert not h.group.pending_members
    late = h.join(member, version=4)
    assert isinstance(late, JoinResult) and late.error is ErrorCode.UNKNOWN_MEMBER_ID


def test_members_sharing_a_client_id_stay_distinct() -> None:
    h = make()
    ids, _ = stable_group(h, 3)
    assert len(set(ids)) == 3
    assert all(m.startswith("client-") for m in ids)
    assert len(h.group.members) == 3


def test_initial_delay_grows_while_new_members_arrive_then_stops_at_rebalance_timeout() -> None:
    h = make(delay_ms=1000)
    first = h.join(version=3)
    h.advance(900)
    h.join(version=3)  # new member during the delay of generation 0: one more delay
    h.advance(200)  # past the first delay: not complete, extended
    assert h.group.state is GroupState.PREPARING_REBALANCE
    h.advance(900)
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    assert h.joined(first).generation_id == 1  # type: ignore[arg-type]
    assert len(h.group.members) == 2


def test_rebalance_completes_early_when_everyone_rejoined() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    rejoin_a = h.join(ids[0])  # the leader rejoining forces a rebalance
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.heartbeat(ids[1], generation) is ErrorCode.REBALANCE_IN_PROGRESS
    rejoin_b = h.join(ids[1])
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    assert h.joined(rejoin_a).generation_id == h.joined(rejoin_b).generation_id == generation + 1


def test_follower_rejoin_with_same_metadata_in_stable_gets_current_generation() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    follower = ids[1]
    result = h.join(follower)
    assert isinstance(result, JoinResult)
    assert result.error is ErrorCode.NONE and result.generation_id == generation
    assert result.members == ()
    assert h.group.state is GroupState.STABLE


def test_protocol_chosen_by_vote_among_protocols_everyone_supports() -> None:
    h = make()
    both_rr = (("roundrobin", b"1"), ("range", b"2"))
    both_range = (("range", b"3"), ("roundrobin", b"4"))
    a = h.join(version=3, protocols=both_rr)
    b = h.join(version=3, protocols=both_range)
    c = h.join(version=3, protocols=(("roundrobin", b"5"), ("sticky", b"6")))
    h.advance(FORM_MS)
    assert h.joined(a).protocol_name == "roundrobin"  # range is not supported by c
    leader = h.joined(a)
    assert {m.metadata for m in leader.members} == {b"1", b"4", b"5"}
    h2 = make()
    x = h2.join(version=3, protocols=both_range)
    h2.join(version=3, protocols=both_range)
    h2.join(version=3, protocols=both_rr)
    h2.advance(FORM_MS)
    assert h2.joined(x).protocol_name == "range"  # two votes against one
    del b, c


def test_inconsistent_protocol_rejects_the_join_and_keeps_the_member() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    before = h.group.members[ids[1]].protocols
    rejected = h.join(ids[1], protocols=(("other", b""),))
    assert isinstance(rejected, JoinResult)
    assert rejected.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert rejected.member_id == ids[1]
    assert h.group.members[ids[1]].protocols == before
    assert h.group.state is GroupState.STABLE
    assert h.heartbeat(ids[1], generation) is ErrorCode.NONE
    newcomer = h.join(protocols=(("other", b""),))
    assert isinstance(newcomer, JoinResult)
    assert newcomer.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL and newcomer.member_id == ""
    wrong_type = h.join(protocol_type="connect")
    assert isinstance(wrong_type, JoinResult)
    assert wrong_type.error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert len(h.group.members) == 2


def test_invalid_session_timeout() -> None:
    h = make(min_session_ms=6000)
    result = h.join(session_ms=1000)
    assert isinstance(result, JoinResult) and result.error is ErrorCode.INVALID_SESSION_TIMEOUT


# --- sync ---------------------------------------------------------------------------------------


def test_followers_wait_for_the_leaders_assignment() -> None:
    h = make()
    a, b = h.join(version=3), h.join(version=3)
    h.advance(FORM_MS)
    leader, follower = h.joined(a), h.joined(b)
    waiting = h.sync(follower.member_id, follower.generation_id)
    assert isinstance(waiting, Pending) and waiting.ticket not in h.replies
    assert h.heartbeat(follower.member_id, follower.generation_id) is ErrorCode.NONE
    assignment = {leader.member_id: b"A", follower.member_id: b"B"}
    done = h.sync(leader.member_id, leader.generation_id, assignment)
    assert h.synced(waiting) == SyncResult(ErrorCode.NONE, "consumer", "range", b"B")
    assert h.synced(done).assignment == b"A"
    assert h.group.state is GroupState.STABLE
    again = h.sync(follower.member_id, follower.generation_id)
    assert h.synced(again).assignment == b"B"
    stored = h.stores[-1].record
    assert {m.member_id: m.assignment for m in stored.members} == assignment


def test_assignment_store_failure_sends_everyone_back_to_join() -> None:
    h = make()
    h.store_error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    a, b = h.join(version=3), h.join(version=3)
    h.advance(FORM_MS)
    leader, follower = h.joined(a), h.joined(b)
    waiting = h.sync(follower.member_id, follower.generation_id)
    h.sync(leader.member_id, leader.generation_id, {follower.member_id: b"B"})
    assert h.synced(waiting).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert h.group.state is GroupState.PREPARING_REBALANCE


def test_sync_errors() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    assert h.synced(h.sync("nobody", generation)).error is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.synced(h.sync(ids[0], generation - 1)).error is ErrorCode.ILLEGAL_GENERATION
    request = SyncRequest(ids[0], generation, None, "consumer", "roundrobin", {})
    assert h.synced(h.group.sync(h.now, request)).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    h.join(ids[0])
    assert h.synced(h.sync(ids[1], generation)).error is ErrorCode.REBALANCE_IN_PROGRESS


def test_missing_leader_sync_times_out_and_rebalances() -> None:
    h = make()
    a, b = h.join(version=3), h.join(version=3)
    h.advance(FORM_MS)
    leader, follower = h.joined(a), h.joined(b)
    waiting = h.sync(follower.member_id, follower.generation_id)
    for _ in range(REBALANCE_MS // (SESSION_MS // 2)):
        # The leader is alive (heartbeats) but never sends its assignment.
        assert h.heartbeat(leader.member_id, leader.generation_id) is ErrorCode.NONE
        h.advance(SESSION_MS // 2)
    assert h.synced(waiting).error is ErrorCode.REBALANCE_IN_PROGRESS
    assert leader.member_id not in h.group.members
    assert h.group.state is GroupState.PREPARING_REBALANCE


def test_leader_that_goes_silent_before_sync_expires() -> None:
    h = make()
    a, b = h.join(version=3), h.join(version=3)
    h.advance(FORM_MS)
    leader, follower = h.joined(a), h.joined(b)
    waiting = h.sync(follower.member_id, follower.generation_id)
    h.advance(SESSION_MS)
    assert leader.member_id not in h.group.members
    assert h.synced(waiting).error is ErrorCode.REBALANCE_IN_PROGRESS


# --- heartbeat and session expiry ---------------------------------------------------------------


def test_heartbeat_errors_only_when_truly_stale() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    assert h.heartbeat(ids[0], generation) is ErrorCode.NONE
    assert h.heartbeat(ids[0], generation - 1) is ErrorCode.ILLEGAL_GENERATION
    assert h.heartbeat("ghost", generation) is ErrorCode.UNKNOWN_MEMBER_ID
    h.join(ids[0])  # rebalance begins
    assert h.heartbeat(ids[1], generation) is ErrorCode.REBALANCE_IN_PROGRESS
    h.join(ids[1])  # everyone in: CompletingRebalance at generation + 1
    assert h.heartbeat(ids[1], generation + 1) is ErrorCode.NONE
    assert h.heartbeat(ids[1], generation) is ErrorCode.ILLEGAL_GENERATION


def test_silent_member_expires_and_the_rest_rebalance() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    for _ in range(4):
        h.advance(SESSION_MS // 2)
        assert h.heartbeat(ids[0], generation) in (ErrorCode.NONE, ErrorCode.REBALANCE_IN_PROGRESS)
    assert ids[1] not in h.group.members
    assert h.heartbeat(ids[0], generation) is ErrorCode.REBALANCE_IN_PROGRESS
    rejoin = h.join(ids[0])
    result = h.joined(rejoin)
    assert result.generation_id == generation + 1
    assert [m.member_id for m in result.members] == [ids[0]]


def test_member_not_rejoining_is_dropped_at_the_rebalance_timeout() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    rejoin = h.join(ids[0])
    for _ in range(REBALANCE_MS // (SESSION_MS // 2)):
        # Alive (heartbeats answered REBALANCE_IN_PROGRESS) but never rejoins.
        assert h.heartbeat(ids[1], generation) is ErrorCode.REBALANCE_IN_PROGRESS
        h.advance(SESSION_MS // 2)
    result = h.joined(rejoin)
    assert result.generation_id == generation + 1
    assert ids[1] not in h.group.members
    assert [m.member_id for m in result.members] == [ids[0]]


# --- leave ----------------------------------------------------------------------------------------


def test_leave_single_and_batch() -> None:
    h = make()
    ids, generation = stable_group(h, 3)
    assert h.leave((ids[2], None)) == [ErrorCode.NONE]
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.leave((ids[0], None), ("ghost", None)) == [
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_MEMBER_ID,
    ]
    rejoin = h.join(ids[1])
    result = h.joined(rejoin)
    assert result.leader_id == ids[1]  # the leader left: a rejoined member leads
    assert [m.member_id for m in result.members] == [ids[1]]
    assert h.leave((ids[1], None)) == [ErrorCode.NONE]
    assert h.group.state is GroupState.EMPTY
    assert h.group.generation == generation + 2
    assert h.stores[-1].record.members == ()


def test_leave_answers_a_waiting_join() -> None:
    h = make()
    ids, _ = stable_group(h, 2)
    waiting = h.join(ids[0])
    assert h.leave((ids[0], None)) == [ErrorCode.NONE]
    assert h.joined(waiting).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_pending_member_can_leave() -> None:
    h = make()
    member = h.new_member(version=4)
    assert h.leave((member, None)) == [ErrorCode.NONE]
    assert not h.group.pending_members


# --- static membership ----------------------------------------------------------------------------


def static_group(h: Harness, version: int = 5) -> tuple[str, str, int]:
    a = h.join(instance="i-a", version=version)
    b = h.join(instance="i-b", version=version)
    assert isinstance(a, Pending) and isinstance(b, Pending)
    h.advance(FORM_MS)
    ra, rb = h.joined(a), h.joined(b)
    h.sync(rb.member_id, rb.generation_id, instance="i-b")
    h.sync(ra.member_id, ra.generation_id, {ra.member_id: b"A", rb.member_id: b"B"}, "i-a")
    assert h.group.state is GroupState.STABLE
    assert ra.member_id.startswith("i-a-")
    return ra.member_id, rb.member_id, ra.generation_id


def test_static_member_restart_rejoins_without_rebalance() -> None:
    h = make()
    leader, follower, generation = static_group(h)
    restarted = h.join(instance="i-b")
    result = h.joined(restarted)
    assert result.error is ErrorCode.NONE
    assert result.generation_id == generation
    assert result.member_id != follower and result.member_id.startswith("i-b-")
    assert result.leader_id == leader and result.members == ()
    assert h.group.state is GroupState.STABLE
    assert isinstance(h.stores[-1].token, StaticRejoinStore)
    synced = h.synced(h.sync(result.member_id, generation, instance="i-b"))
    assert synced.assignment == b"B"
    # The old process is a duplicate now: fenced everywhere.
    assert h.heartbeat(follower, generation, "i-b") is ErrorCode.FENCED_INSTANCE_ID
    assert h.synced(h.sync(follower, generation, instance="i-b")).error is (
        ErrorCode.FENCED_INSTANCE_ID
    )
    rejoin_old = h.join(follower, instance="i-b")
    assert isinstance(rejoin_old, JoinResult)
    assert rejoin_old.error is ErrorCode.FENCED_INSTANCE_ID
    assert h.leave((follower, "i-b")) == [ErrorCode.FENCED_INSTANCE_ID]
    assert h.group.validate_commit(h.now, follower, "i-b", generation) is (
        ErrorCode.FENCED_INSTANCE_ID
    )


def test_static_leader_restart_pre_v9_reports_the_old_leader_id() -> None:
    h = make()
    leader, _, generation = static_group(h)
    restarted = h.joined(h.join(instance="i-a", version=5))
    assert restarted.generation_id == generation
    assert restarted.leader_id == leader != restarted.member_id  # so it does not assign
    assert h.group.leader_id == restarted.member_id
    assert not restarted.skip_assignment


def test_static_leader_restart_v9_skips_assignment() -> None:
    h = make()
    _, _, generation = static_group(h, version=9)
    restarted = h.joined(h.join(instance="i-a", version=9))
    assert restarted.skip_assignment
    assert restarted.leader_id == restarted.member_id
    assert len(restarted.members) == 2
    assert h.group.state is GroupState.STABLE and h.group.generation == generation


def test_static_rejoin_with_new_protocol_choice_rebalances() -> None:
    h = make()
    a = h.join(instance="i-a", protocols=(("range", b""), ("roundrobin", b"")))
    h.advance(FORM_MS)
    ra = h.joined(a)
    h.sync(ra.member_id, ra.generation_id, {ra.member_id: b"A"}, "i-a")
    waiting = h.join(instance="i-a", protocols=(("roundrobin", b""), ("range", b"")))
    assert isinstance(waiting, Pending)
    assert h.group.state is not GroupState.STABLE
    assert h.joined(waiting).protocol_name == "roundrobin"


def test_static_rejoin_store_failure_restores_the_old_member() -> None:
    h = make()
    _, follower, generation = static_group(h)
    h.store_error = ErrorCode.COORDINATOR_NOT_AVAILABLE
    result = h.joined(h.join(instance="i-b"))
    assert result.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert h.group.static_members["i-b"] == follower
    assert h.heartbeat(follower, generation, "i-b") is ErrorCode.NONE


def test_static_member_not_rejoining_stays_through_a_rebalance() -> None:
    h = make()
    leader, follower, generation = static_group(h)
    rejoin = h.join(leader, instance="i-a")
    for _ in range(REBALANCE_MS // (SESSION_MS // 2)):
        h.heartbeat(follower, generation, "i-b")  # alive, but never rejoins
        h.advance(SESSION_MS // 2)
    assert h.joined(rejoin).generation_id == generation + 1
    assert follower in h.group.members  # static members are not dropped for not rejoining


def test_leave_by_instance_id_without_member_id() -> None:
    h = make()
    _, follower, _ = static_group(h)
    assert h.leave(("", "i-b")) == [ErrorCode.NONE]
    assert follower not in h.group.members
    assert h.leave(("", "i-zzz")) == [ErrorCode.UNKNOWN_MEMBER_ID]


# --- offsets, delete, load, unload ----------------------------------------------------------------


def test_commit_validation() -> None:
    h = make()
    assert h.group.validate_commit(h.now, "", None, -1) is ErrorCode.NONE  # simple consumer
    ids, generation = stable_group(h, 2)
    assert h.group.validate_commit(h.now, "", None, -1) is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.group.validate_commit(h.now, ids[0], None, generation) is ErrorCode.NONE
    assert h.group.validate_commit(h.now, ids[0], None, generation - 1) is (
        ErrorCode.ILLEGAL_GENERATION
    )
    assert h.group.validate_commit(h.now, "ghost", None, generation) is ErrorCode.UNKNOWN_MEMBER_ID
    h.join(ids[0])
    h.join(ids[1])  # CompletingRebalance
    assert h.group.validate_commit(h.now, ids[0], None, generation + 1) is (
        ErrorCode.REBALANCE_IN_PROGRESS
    )


def test_delete_only_empty_groups() -> None:
    h = make()
    ids, _ = stable_group(h, 1)
    assert h.group.delete() is ErrorCode.NON_EMPTY_GROUP
    h.leave((ids[0], None))
    assert h.group.delete() is ErrorCode.NONE
    assert h.group.state is GroupState.DEAD
    assert h.group.delete() is ErrorCode.GROUP_ID_NOT_FOUND


def test_loaded_group_continues_at_its_generation() -> None:
    record = GroupRecord(
        protocol_type="consumer",
        generation=7,
        protocol_name="range",
        leader="m1",
        members=tuple(
            MemberRecord(m, None, "c", "/h", REBALANCE_MS, SESSION_MS, b"sub", m.encode())
            for m in ("m1", "m2")
        ),
    )
    group = Group.from_record("g", GroupConfig(), record, 1_000)
    h = Harness(group, now=1_000)
    assert group.state is GroupState.STABLE and group.leader_id == "m1"
    assert h.heartbeat("m1", 7) is ErrorCode.NONE
    assert h.synced(h.sync("m2", 7)).assignment == b"m2"
    h.advance(SESSION_MS // 2)
    assert h.heartbeat("m1", 7) is ErrorCode.NONE
    h.advance(SESSION_MS // 2 + 1)  # m2 never heartbeated here
    assert "m2" not in group.members
    assert h.group.record().generation == 7
    rejoin = h.join("m1", protocols=(("range", b"sub"),))
    assert h.joined(rejoin).generation_id == 8


def test_unload_tells_every_waiter_not_coordinator() -> None:
    h = make()
    h.join(version=3)
    b = h.join(version=3)
    h.advance(FORM_MS)
    follower = h.joined(b)
    waiting_sync = h.sync(follower.member_id, follower.generation_id)
    h.group.unload()
    h.drain()
    assert h.synced(waiting_sync).error is ErrorCode.NOT_COORDINATOR
    assert h.group.next_deadline_ms() is None
    dead = h.join(version=3)
    assert isinstance(dead, JoinResult) and dead.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    h2 = make()
    waiting_join = h2.join(version=3)
    h2.group.unload()
    h2.drain()
    assert h2.joined(waiting_join).error is ErrorCode.NOT_COORDINATOR


# --- the coordinator's etcd session suspended, then resumed ---------------------------------------


def resume_after(h: Harness, suspended_ms: int) -> None:
    """The coordinator's session was suspended for ``suspended_ms`` (no timer acted, every
    request was refused), then resumed: what the timer task does then (``timer_runtime``)."""
    h.now += suspended_ms
    h.group.resume_sessions(h.now)
    h.group.tick(h.now)
    h.drain()


def test_a_rebalance_refused_past_its_timeout_waits_for_its_members_again() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    rejoin_a = h.join(ids[0])  # the leader rejoins: b is to rejoin within the rebalance timeout
    resume_after(h, REBALANCE_MS + SESSION_MS)  # b's JoinGroup was refused meanwhile
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert ids[1] in h.group.members
    rejoin_b = h.join(ids[1])  # after the resumption: completes the rebalance at once
    a, b = h.joined(rejoin_a), h.joined(rejoin_b)
    assert a.generation_id == b.generation_id == generation + 1
    assert {m.member_id for m in a.members} == set(ids)


def test_a_member_that_never_rejoins_is_dropped_a_whole_rebalance_timeout_after_resuming() -> None:
    h = make()
    ids, generation = stable_group(h, 2)
    rejoin_a = h.join(ids[0])
    resume_after(h, REBALANCE_MS + SESSION_MS)
    for _ in range(REBALANCE_MS // (SESSION_MS // 2)):
        # Alive (heartbeats answered REBALANCE_IN_PROGRESS) but never rejoins.
        assert h.group.state is GroupState.PREPARING_REBALANCE
        assert h.heartbeat(ids[1], generation) is ErrorCode.REBALANCE_IN_PROGRESS
        h.advance(SESSION_MS // 2)
    result = h.joined(rejoin_a)
    assert result.generation_id == generation + 1
    assert [m.member_id for m in result.members] == [ids[0]]


def test_a_sync_refused_past_its_timeout_is_awaited_again() -> None:
    h = make()
    a, b = h.join(version=3), h.join(version=3)
    h.advance(FORM_MS)
    leader, follower = h.joined(a), h.joined(b)
    waiting = h.sync(follower.member_id, follower.generation_id)
    resume_after(h, REBALANCE_MS + SESSION_MS)  # the leader's SyncGroup was refused meanwhile
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    assignment = {leader.member_id: b"p0", follower.member_id: b"p1"}
    synced = h.synced(h.sync(leader.member_id, leader.generation_id, assignment))
    assert synced.error is ErrorCode.NONE and synced.assignment == b"p0"
    assert h.synced(waiting).assignment == b"p1"
    assert h.group.state is GroupState.STABLE


def test_an_initial_delay_refused_past_its_end_waits_one_delay_for_newcomers() -> None:
    h = make()
    first = h.join(version=3)
    resume_after(h, REBALANCE_MS + SESSION_MS)  # a second member's JoinGroup was refused
    assert h.group.state is GroupState.PREPARING_REBALANCE
    h.advance(DELAY_MS // 2)
    second = h.join(version=3)  # within the delay after the resumption: one more delay
    h.advance(DELAY_MS // 2)
    assert h.group.state is GroupState.PREPARING_REBALANCE
    h.advance(DELAY_MS)  # two delays from the resumption, not a rebalance timeout
    result = h.joined(first)
    assert result.generation_id == h.joined(second).generation_id == 1
    assert len(result.members) == 2


def test_a_member_id_handed_out_before_a_suspension_joins_the_rebalance_after_it() -> None:
    h = make()
    ids, generation = stable_group(h, 1)
    newcomer = h.new_member(version=4)  # its JoinGroup with the id is refused from now on
    rejoin = h.join(ids[0])  # the rebalance the newcomer's first join started
    resume_after(h, REBALANCE_MS + SESSION_MS)
    assert h.group.state is GroupState.PREPARING_REBALANCE
    joined = h.joined(h.join(newcomer, version=4))  # completes the rebalance at once
    assert joined.generation_id == h.joined(rejoin).generation_id == generation + 1
    assert set(h.group.members) == {ids[0], newcomer}
