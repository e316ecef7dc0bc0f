"""Group size limits (``group.max.size``, ``group.consumer.max.size``): the pure decision and
the group state machines that ask it, driven directly with explicit time.

Kafka's rules (``GroupMetadataManager.acceptJoiningMember`` and ``throwIfConsumerGroupIsFull``):
a member the group has is never new, a static member back with its group.instance.id neither;
a classic group that rebalances counts the members that rejoined; pending member ids
(MEMBER_ID_REQUIRED) hold no seat; a consumer group counts its classic members too.
"""

from __future__ import annotations

import pytest
from harness.subscribed_groups import subscription
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.config import BrokerSettings, GroupSettings
from kafscale.broker.groups import migration, size_limits
from kafscale.broker.groups.consumer import ConsumerConfig, ConsumerGroup, HeartbeatRequest
from kafscale.broker.groups.coordinator import group_config
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
    SyncRequest,
)
from kafscale.broker.protocol.codec import encode_consumer_assignment
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

SESSION_MS = 10_000
REBALANCE_MS = 30_000
TOPICS = {"t": 4}
FULL = ErrorCode.GROUP_MAX_SIZE_REACHED


# --- the pure decision ----------------------------------------------------------------------------


@given(st.integers(1, 50), st.integers(0, 60), st.booleans())
def test_a_join_is_seated_while_there_is_room_or_when_the_member_has_a_seat(
    max_size: int, members: int, known: bool
) -> None:
    assert size_limits.admits_join(max_size, members, known) is (known or members < max_size)


@given(st.integers(1, 50), st.integers(0, 60), st.integers(0, 60), st.booleans(), st.booleans())
def test_a_rebalancing_classic_group_counts_the_members_that_rejoined(
    max_size: int, members: int, rejoined: int, known: bool, known_rejoined: bool
) -> None:
    def admits(rebalancing: bool) -> bool:
        return size_limits.admits_classic_join(
            max_size,
            rebalancing=rebalancing,
            members=members,
            rejoined=rejoined,
            known=known,
            known_rejoined=known and known_rejoined,
        )

    assert admits(rebalancing=False) is (known or members < max_size)
    assert admits(rebalancing=True) is ((known and known_rejoined) or rejoined < max_size)


def test_an_empty_group_seats_anyone_and_over_capacity_is_strictly_more() -> None:
    for max_size in (1, 2, size_limits.UNBOUNDED):
        assert size_limits.admits_classic_join(
            max_size, rebalancing=False, members=0, rejoined=0, known=False, known_rejoined=False
        )
        assert size_limits.admits_join(max_size, 0, known=False)
        assert not size_limits.over_capacity(max_size, max_size)
    assert size_limits.over_capacity(3, 2)


# --- settings -----------------------------------------------------------------------------------


def test_the_limits_default_to_kafkas_unbounded_and_reach_the_coordinator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = GroupSettings()
    assert defaults.max_size == defaults.consumer_max_size == 2**31 - 1 == size_limits.UNBOUNDED
    monkeypatch.setenv("KAFSCALE_GROUPS__MAX_SIZE", "2")
    monkeypatch.setenv("KAFSCALE_GROUPS__CONSUMER_MAX_SIZE", "3")
    groups = BrokerSettings().groups
    config = group_config(groups)
    assert (config.max_size, config.consumer_max_size) == (2, 3)
    with pytest.raises(ValueError):
        GroupSettings(max_size=0)


# --- classic groups -----------------------------------------------------------------------------


class Classic:
    """A classic group with a member limit, and the answers its waiting joins got."""

    def __init__(self, max_size: int, group: Group | None = None, now: int = 0) -> None:
        config = GroupConfig(
            initial_rebalance_delay_ms=0, min_session_timeout_ms=1000, max_size=max_size
        )
        self.group = group or Group("g", config, now)
        self.now = now
        self.replies: dict[int, object] = {}
        self.fresh = 0

    def join(self, member_id: str = "", instance: str | None = None, version: int = 5) -> object:
        self.fresh += 1
        request = JoinRequest(
            member_id=member_id,
            group_instance_id=instance,
            client_id="c",
            client_host="/h",
            session_timeout_ms=SESSION_MS,
            rebalance_timeout_ms=REBALANCE_MS,
            protocol_type="consumer",
            protocols=(("range", b""),),
            require_known_member_id=version >= 4,
            supports_skip_assignment=False,
            fresh_id=f"id{self.fresh}",
        )
        result = self.group.join(self.now, request)
        self._drain()
        return result

    def answer(self, outcome: object) -> JoinResult:
        result = self.replies[outcome.ticket] if isinstance(outcome, Pending) else outcome
        assert isinstance(result, JoinResult)
        return result

    def sync_all(self, joined: list[JoinResult]) -> None:
        leader = next(r for r in joined if r.members)
        assignment = {m.member_id: m.member_id.encode() for m in leader.members}
        for result in joined:
            given = assignment if result is leader else {}
            request = SyncRequest(result.member_id, result.generation_id, None, None, None, given)
            self.group.sync(self.now, request)
            self._drain()
        assert self.group.state is GroupState.STABLE

    def advance(self, ms: int) -> None:
        """Fire every deadline up to ``ms`` from now, in order."""
        target = self.now + ms
        while (deadline := self.group.next_deadline_ms()) is not None and deadline <= target:
            self.now = max(self.now, deadline)
            self.group.tick(self.now)
            self._drain()
        self.now = target

    def _drain(self) -> None:
        for effect in self.group.take_effects():
            if isinstance(effect, Reply):
                self.replies[effect.ticket] = effect.result
            else:
                self.group.stored(self.now, effect.token, ErrorCode.NONE)
                self._drain()


def stable(h: Classic, count: int, instances: bool = False) -> list[str]:
    """``count`` members joined (v3: no member-id handshake) and synced; their ids."""
    waiting = [h.join(instance=f"i-{n}" if instances else None, version=3) for n in range(count)]
    h.advance(1)
    joined = [h.answer(w) for w in waiting]
    assert all(r.error is ErrorCode.NONE for r in joined)
    h.sync_all(joined)
    return [r.member_id for r in joined]


def test_a_full_classic_group_turns_a_new_member_away_and_keeps_its_members() -> None:
    h = Classic(max_size=2)
    members = stable(h, 2)
    generation = h.group.generation
    for version in (3, 5):  # with and without the member-id handshake
        refused = h.join(version=version)
        assert isinstance(refused, JoinResult)
        assert (refused.error, refused.member_id) == (FULL, "")
    assert not h.group.pending_members  # no member id handed out
    assert h.group.state is GroupState.STABLE and h.group.generation == generation
    assert sorted(h.group.members) == sorted(members)
    # Its members still rejoin (a leader's rejoin rebalances) and stay in.
    assert isinstance(h.join(members[0]), Pending)


def test_pending_member_ids_hold_no_seat_and_are_checked_when_they_come_back() -> None:
    h = Classic(max_size=2)
    old = stable(h, 1)[0]
    first, second = h.join(), h.join()
    assert isinstance(first, JoinResult) and isinstance(second, JoinResult)
    assert first.error is second.error is ErrorCode.MEMBER_ID_REQUIRED  # room for one: both asked
    assert isinstance(h.join(first.member_id), Pending)  # seated: the group rebalances
    assert isinstance(h.join(old), Pending)  # the old member rejoins: two rejoined, full
    late = h.join(second.member_id)
    assert isinstance(late, JoinResult) and (late.error, late.member_id) == (FULL, "")
    assert second.member_id not in h.group.pending_members
    joined = [h.answer(w) for w in h.replies.values() if isinstance(w, JoinResult)]
    assert len(h.group.members) == 2 and all(r.error is ErrorCode.NONE for r in joined)


def test_a_rebalance_seats_the_first_members_to_rejoin_and_drops_the_last() -> None:
    h = Classic(max_size=2)
    old = stable(h, 1)[0]
    # Two newcomers join at once (no handshake): the group rebalances, and while the old
    # member has not rejoined yet only one seat of two is taken: both are seated.
    newcomers = [h.join(version=3), h.join(version=3)]
    assert all(isinstance(n, Pending) for n in newcomers)
    assert len(h.group.members) == 3
    refused = h.join(old)  # the old member comes back last: its seat is gone
    assert isinstance(refused, JoinResult) and (refused.error, refused.member_id) == (FULL, "")
    assert old not in h.group.members
    # Everyone left has rejoined: the join phase completed with the two newcomers.
    joined = [h.answer(n) for n in newcomers]
    assert all(r.error is ErrorCode.NONE for r in joined)
    h.sync_all(joined)
    assert len(h.group.members) == 2
    late = h.join(version=3)
    assert isinstance(late, JoinResult) and late.error is FULL


def test_a_static_member_restarting_in_a_full_group_takes_its_own_seat_back() -> None:
    h = Classic(max_size=2)
    old = stable(h, 2, instances=True)
    restarted = h.answer(h.join(instance="i-1"))  # a new process: no member id, same instance
    assert restarted.error is ErrorCode.NONE and restarted.member_id != old[1]
    assert len(h.group.members) == 2 and h.group.static_members["i-1"] == restarted.member_id
    stranger = h.join(instance="i-9")
    assert isinstance(stranger, JoinResult) and stranger.error is FULL


def over_limit_record(names: tuple[str, ...]) -> GroupRecord:
    members = tuple(
        MemberRecord(m, None, "c", "/h", REBALANCE_MS, SESSION_MS, b"", m.encode()) for m in names
    )
    return GroupRecord("consumer", 7, "range", names[0], members)


def test_a_group_loaded_over_its_limit_rebalances_and_seats_only_the_first_to_rejoin() -> None:
    config = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1000, max_size=2)
    group = Group.from_record("g", config, over_limit_record(("m1", "m2", "m3")), 1_000)
    assert group.state is GroupState.PREPARING_REBALANCE
    h = Classic(2, group, now=1_000)
    assert h.group.heartbeat(h.now, "m3", None, 7) is ErrorCode.REBALANCE_IN_PROGRESS
    first, second = h.join("m3"), h.join("m1")
    refused = h.join("m2")
    assert isinstance(refused, JoinResult) and refused.error is FULL
    assert "m2" not in h.group.members
    results = [h.answer(first), h.answer(second)]
    assert all(r.error is ErrorCode.NONE and r.generation_id == 8 for r in results)
    h.sync_all(results)
    assert sorted(h.group.members) == ["m1", "m3"]


def test_a_group_within_its_limit_loads_stable() -> None:
    config = GroupConfig(max_size=3)
    group = Group.from_record("g", config, over_limit_record(("m1", "m2", "m3")), 0)
    assert group.state is GroupState.STABLE


# --- consumer-protocol (KIP-848) and mixed groups -----------------------------------------------


def heartbeat(member_id: str, epoch: int = 0, instance: str | None = None) -> HeartbeatRequest:
    return HeartbeatRequest(
        member_id=member_id,
        member_epoch=epoch,
        instance_id=instance,
        rack_id=None,
        rebalance_timeout_ms=REBALANCE_MS,
        subscribed_topic_names=("t",) if epoch == 0 else None,
        subscribed_topic_regex=None,
        server_assignor=None,
        owned=frozenset() if epoch == 0 else None,
        client_id="c",
        client_host="/h",
        fresh_id=f"fresh-{member_id}",
    )


def test_a_full_consumer_group_refuses_a_new_member_only() -> None:
    group = ConsumerGroup("g", ConsumerConfig(max_size=2))
    for name in ("a", "b"):
        assert group.heartbeat(0, heartbeat(name), TOPICS).error is ErrorCode.NONE
    refused = group.heartbeat(1, heartbeat("c"), TOPICS)
    assert refused.error is FULL and "2 members" in str(refused.message)
    assert set(group.members) == {"a", "b"}
    # A member rejoining with epoch 0 under its own id (fenced, restarted) is not new.
    assert group.heartbeat(2, heartbeat("a"), TOPICS).error is ErrorCode.NONE
    assert set(group.members) == {"a", "b"}


def test_a_consumer_group_over_its_limit_keeps_a_member_rejoining_under_its_id() -> None:
    group = ConsumerGroup("g", ConsumerConfig())
    for name in ("a", "b", "c"):
        group.heartbeat(0, heartbeat(name), TOPICS)
    group.config = ConsumerConfig(max_size=2)  # the limit lowered under a live group
    assert group.heartbeat(1, heartbeat("c"), TOPICS).error is ErrorCode.NONE
    assert "c" in group.members
    assert group.heartbeat(1, heartbeat("d"), TOPICS).error is FULL


def test_a_static_member_back_under_a_new_id_in_a_full_consumer_group_is_not_new() -> None:
    group = ConsumerGroup("g", ConsumerConfig(max_size=2))
    group.heartbeat(0, heartbeat("a", instance="i-a"), TOPICS)
    joined = group.heartbeat(0, heartbeat("b", instance="i-b"), TOPICS)
    left = group.heartbeat(1, heartbeat("b", -2, "i-b"), TOPICS)  # a static leave: seat kept
    assert joined.error is left.error is ErrorCode.NONE
    back = group.heartbeat(2, heartbeat("b2", instance="i-b"), TOPICS)
    assert back.error is ErrorCode.NONE and set(group.members) == {"a", "b2"}


def mixed_group(max_size: int) -> ConsumerGroup:
    """A consumer group of one consumer-protocol member ``k`` and one classic member ``c1``."""
    group = ConsumerGroup("g", ConsumerConfig(max_size=max_size))
    assert group.heartbeat(0, heartbeat("k"), TOPICS).error is ErrorCode.NONE
    assert migration.join(group, 1, classic_join("c1"), TOPICS).error is ErrorCode.NONE
    return group


def classic_join(member_id: str, instance: str | None = None) -> JoinRequest:
    return JoinRequest(
        member_id=member_id,
        group_instance_id=instance,
        client_id="c",
        client_host="/h",
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=REBALANCE_MS,
        protocol_type="consumer",
        protocols=(("range", subscription(["t"])),),
        require_known_member_id=True,
        supports_skip_assignment=True,
        fresh_id="x",
    )


def test_a_mixed_group_counts_its_classic_members() -> None:
    group = mixed_group(max_size=2)
    refused = group.heartbeat(2, heartbeat("k2"), TOPICS)
    assert refused.error is FULL
    # A classic newcomer is refused before being handed a member id, as Kafka does.
    classic = migration.join(group, 3, classic_join(""), TOPICS)
    assert (classic.error, classic.member_id) == (FULL, "")
    # The classic member itself rejoins.
    assert migration.join(group, 4, classic_join("c1"), TOPICS).error is ErrorCode.NONE


def test_a_group_is_not_converted_past_the_other_protocols_limit() -> None:
    # Upgrade: a classic group of two may not become a consumer group of at most one.
    record = GroupRecord(
        "consumer",
        7,
        "range",
        "c1",
        tuple(
            MemberRecord(
                name, None, "c", "/h", REBALANCE_MS, SESSION_MS, classic_join(name).protocols[0][1],
                encode_consumer_assignment(frozenset()),
            )
            for name in ("c1", "c2")
        ),
    )  # fmt: skip
    classic = Group.from_record("g", GroupConfig(), record, 0)
    assert "group.consumer.max.size" in str(
        migration.upgrade_refusal(classic, ConsumerConfig(max_size=1))
    )
    # Downgrade: two classic members left in a consumer group stay there if a classic group
    # may hold only one.
    group = mixed_group(max_size=3)
    assert migration.join(group, 2, classic_join("c2"), TOPICS).error is ErrorCode.NONE
    group.heartbeat(3, heartbeat("k", -1), TOPICS)
    assert not migration.should_downgrade(group, classic_max_size=1)
    assert migration.should_downgrade(group, classic_max_size=2)
