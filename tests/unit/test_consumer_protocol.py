"""The consumer group protocol's pure parts: the assignors, reconciliation and the group's
heartbeat state machine (KIP-848).

Properties: every subscribed partition is assigned exactly once and only to a subscriber; with
one subscription for all, counts differ by at most one; and, driving the state machine with
random joins, heartbeats, revocation acknowledgements, leaves and expiries, no partition is
ever owned by two members (as the members themselves see it), and the group converges to its
target assignment once members keep heartbeating.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.broker.groups import assignors
from kafscale.broker.groups.consumer import (
    ConsumerConfig,
    ConsumerGroup,
    HeartbeatRequest,
    HeartbeatResult,
)
from kafscale.broker.groups.consumer_codec import restore, snapshot
from kafscale.broker.groups.reconcile import MemberAssignment, reconcile
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

TOPICS = {"a": 5, "b": 3, "c": 1}

subscriptions = st.dictionaries(
    st.sampled_from([f"m{i}" for i in range(8)]),
    st.frozensets(st.sampled_from(sorted(TOPICS)), min_size=1),
    min_size=1,
)


@settings(max_examples=300, deadline=None)
@given(subscriptions, st.sampled_from(assignors.ASSIGNORS), st.data())
def test_every_subscribed_partition_is_assigned_once(subs, assignor, data) -> None:
    current = {m: data.draw(st.frozensets(st.sampled_from(_all()))) for m in subs}
    result = assignors.assign(assignor, subs, TOPICS, current)
    assert set(result) == set(subs)
    owners: dict[tuple[str, int], str] = {}
    for member, partitions in result.items():
        for tp in partitions:
            assert tp not in owners, f"{tp} given to {owners[tp]} and {member}"
            assert tp[0] in subs[member], f"{member} got {tp} without subscribing"
            owners[tp] = member
    wanted = {(t, p) for topics in subs.values() for t in topics for p in range(TOPICS[t])}
    assert set(owners) == wanted


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.sampled_from(assignors.ASSIGNORS), st.data())
def test_one_subscription_is_balanced(members, assignor, data) -> None:
    subs = {f"m{i}": frozenset(TOPICS) for i in range(members)}
    current = {m: data.draw(st.frozensets(st.sampled_from(_all()))) for m in subs}
    counts = [len(p) for p in assignors.assign(assignor, subs, TOPICS, current).values()]
    if assignor == assignors.UNIFORM:
        assert max(counts) - min(counts) <= 1
    else:  # range balances each topic: per topic at most one apart
        assert max(counts) - min(counts) <= len(TOPICS)


def test_uniform_is_sticky_when_a_member_joins() -> None:
    subs = {"m0": frozenset({"a"}), "m1": frozenset({"a"})}
    first = assignors.assign_uniform(subs, {"a": 6}, {})
    second = assignors.assign_uniform({**subs, "m2": frozenset({"a"})}, {"a": 6}, first)
    assert second["m0"] <= first["m0"] and second["m1"] <= first["m1"]
    assert [len(second[m]) for m in ("m0", "m1", "m2")] == [2, 2, 2]


def test_range_gives_contiguous_ranges() -> None:
    subs = {"x": frozenset({"a"}), "y": frozenset({"a"})}
    result = assignors.assign_range(subs, {"a": 5})
    assert result == {"x": frozenset({("a", 0), ("a", 1), ("a", 2)}), "y": {("a", 3), ("a", 4)}}


def test_the_group_takes_the_assignor_most_members_ask_for() -> None:
    assert assignors.choose_assignor([None, None]) == "uniform"
    assert assignors.choose_assignor(["range", "range", "uniform"]) == "range"
    assert assignors.choose_assignor(["range", "uniform"]) == "uniform"


def test_reconcile_revokes_before_it_assigns() -> None:
    held = MemberAssignment(3, frozenset({("a", 0), ("a", 1)}))
    target = frozenset({("a", 1), ("a", 2)})
    step = reconcile(held, target, 4, frozenset({("a", 2)}), None)
    assert step == MemberAssignment(3, frozenset({("a", 1)}), frozenset({("a", 0)}))
    assert reconcile(step, target, 4, frozenset({("a", 2)}), None) == step  # not confirmed
    confirmed = reconcile(step, target, 4, frozenset({("a", 2)}), frozenset({("a", 1)}))
    assert confirmed == MemberAssignment(4, frozenset({("a", 1)}))  # a-2 still held elsewhere
    assert reconcile(confirmed, target, 4, frozenset(), None).assigned == target


# --- the state machine under random schedules -----------------------------------------------


class Client:
    """A member as the client sees it: what it owns is the last assignment it was sent."""

    def __init__(self, member_id: str) -> None:
        self.member_id = member_id
        self.epoch = 0
        self.owned: frozenset[tuple[str, int]] = frozenset()
        self.report: frozenset[tuple[str, int]] | None = frozenset()
        self.joined = False


def _request(client: Client, topics: tuple[str, ...] | None) -> HeartbeatRequest:
    return HeartbeatRequest(
        member_id=client.member_id,
        member_epoch=client.epoch,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=60_000 if client.epoch == 0 else -1,
        subscribed_topic_names=topics,
        subscribed_topic_regex=None,
        server_assignor=None,
        owned=client.report,
        client_id="c",
        client_host="/127.0.0.1",
        fresh_id="unused",
    )


def _absorb(client: Client, result: HeartbeatResult) -> None:
    if result.error is not ErrorCode.NONE:
        client.epoch, client.owned, client.report, client.joined = (
            0,
            frozenset(),
            frozenset(),
            False,
        )
        return
    client.joined = True
    client.epoch = result.member_epoch
    client.report = None
    if result.assignment is not None and result.assignment != client.owned:
        client.owned = result.assignment  # revoked ones dropped at once, new ones taken
        client.report = result.assignment


def _disjoint(clients: list[Client]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for client in clients:
        for tp in client.owned:
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {client.member_id}"
            seen[tp] = client.member_id


actions = st.lists(
    st.tuples(st.sampled_from(["beat", "beat", "beat", "leave", "tick"]), st.integers(0, 5)),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(actions, st.sampled_from(assignors.ASSIGNORS))
def test_no_partition_is_owned_twice_and_the_group_converges(steps, assignor) -> None:
    topics = {"a": 7, "b": 2}
    group = ConsumerGroup("g", ConsumerConfig(session_timeout_ms=10_000))
    clients = [Client(f"m{i}") for i in range(6)]
    now = 0
    for action, index in steps:
        client = clients[index]
        now += 100
        if action == "beat":
            names = ("a", "b") if client.epoch == 0 else None
            request = _request(client, names)
            if client.epoch == 0:
                request = HeartbeatRequest(**{**_fields(request), "server_assignor": assignor})
            _absorb(client, group.heartbeat(now, request, topics))
        elif action == "leave" and client.joined:
            leave = HeartbeatRequest(**{**_fields(_request(client, None)), "member_epoch": -1})
            group.heartbeat(now, leave, topics)
            client.epoch, client.owned, client.report, client.joined = (
                0,
                frozenset(),
                frozenset(),
                False,
            )
        elif action == "tick":
            now += 4_000
            for member_id in group.tick(now):
                gone = next(c for c in clients if c.member_id == member_id)
                gone.epoch, gone.owned, gone.report, gone.joined = (
                    0,
                    frozenset(),
                    frozenset(),
                    False,
                )
        _disjoint(clients)
    live = [c for c in clients if c.joined]
    for _ in range(4):  # a few rounds of heartbeats settle every revocation and assignment
        for client in live:
            now += 10
            _absorb(client, group.heartbeat(now, _request(client, None), topics))
            _disjoint(clients)
    if live:
        assert group.state == "Stable"
        owned = sorted(tp for c in live for tp in c.owned)
        assert owned == sorted((t, p) for t, n in topics.items() for p in range(n))


def _fields(request: HeartbeatRequest) -> dict[str, object]:
    return {name: getattr(request, name) for name in HeartbeatRequest.__dataclass_fields__}


def test_commits_need_the_current_member_epoch() -> None:
    group = ConsumerGroup("g", ConsumerConfig())
    client = Client("m0")
    _absorb(client, group.heartbeat(0, _request(client, ("a",)), {"a": 2}))
    assert group.validate_commit("m0", client.epoch, 9) is ErrorCode.NONE
    assert group.validate_commit("m0", client.epoch - 1, 9) is ErrorCode.STALE_MEMBER_EPOCH
    assert group.validate_commit("nobody", 1, 9) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.validate_commit("", -1, 9) is ErrorCode.NONE  # admin commit
    assert group.validate_fetch("m0", client.epoch + 1) is ErrorCode.STALE_MEMBER_EPOCH


def test_a_wrong_epoch_is_fenced_and_a_session_expires() -> None:
    group = ConsumerGroup("g", ConsumerConfig(session_timeout_ms=1000))
    client = Client("m0")
    _absorb(client, group.heartbeat(0, _request(client, ("a",)), {"a": 2}))
    client.epoch += 5
    assert group.heartbeat(10, _request(client, None), {"a": 2}).error is (
        ErrorCode.FENCED_MEMBER_EPOCH
    )
    assert group.tick(2000) == ["m0"]
    assert group.state == "Empty"


def test_a_static_member_comes_back_with_its_assignment() -> None:
    group = ConsumerGroup("g", ConsumerConfig())
    client = Client("m0")
    join = HeartbeatRequest(**{**_fields(_request(client, ("a",))), "instance_id": "i-1"})
    _absorb(client, group.heartbeat(0, join, {"a": 3}))
    epoch_before = group.group_epoch
    assert client.owned == {("a", 0), ("a", 1), ("a", 2)}
    leave = {**_fields(_request(client, None)), "instance_id": "i-1", "member_epoch": -2}
    assert group.heartbeat(10, HeartbeatRequest(**leave), {"a": 3}).error is ErrorCode.NONE
    rejoin = {**_fields(join), "member_id": "m0-new"}
    result = group.heartbeat(20, HeartbeatRequest(**rejoin), {"a": 3})
    assert result.error is ErrorCode.NONE and result.member_id == "m0-new"
    assert result.assignment == {("a", 0), ("a", 1), ("a", 2)}
    assert group.group_epoch == epoch_before  # no rebalance
    other = {**_fields(join), "member_id": "m0-third"}
    refused = group.heartbeat(30, HeartbeatRequest(**other), {"a": 3})
    assert refused.error is ErrorCode.UNRELEASED_INSTANCE_ID


def test_a_regex_subscription_follows_new_topics() -> None:
    group = ConsumerGroup("g", ConsumerConfig())
    client = Client("m0")
    join = HeartbeatRequest(
        **{**_fields(_request(client, None)), "subscribed_topic_regex": "orders-.*"}
    )
    _absorb(client, group.heartbeat(0, join, {"orders-eu": 1, "other": 4}))
    assert client.owned == {("orders-eu", 0)}
    _absorb(client, group.heartbeat(10, _request(client, None), {"orders-eu": 1, "orders-us": 1}))
    assert client.owned == {("orders-eu", 0), ("orders-us", 0)}


def _all() -> list[tuple[str, int]]:
    return [(t, p) for t, n in TOPICS.items() for p in range(n)]


def test_the_stored_state_restores_the_same_group() -> None:
    group = ConsumerGroup("g", ConsumerConfig())
    clients = [Client("m0"), Client("m1")]
    for client in clients:
        _absorb(client, group.heartbeat(0, _request(client, ("a",)), {"a": 5}))
    _absorb(clients[0], group.heartbeat(5, _request(clients[0], None), {"a": 5}))
    document = json.loads(json.dumps(snapshot(group)))
    restored = restore("g", document, ConsumerConfig(), 100)
    assert snapshot(restored) == snapshot(group)
    assert restored.state == group.state
    for client in clients:  # the members carry on at their epochs
        assert restored.heartbeat(200, _request(client, None), {"a": 5}).error is ErrorCode.NONE


def test_a_member_waiting_for_partitions_is_asked_back_sooner() -> None:
    group = ConsumerGroup("g", ConsumerConfig(heartbeat_interval_ms=500))
    first, second = Client("m0"), Client("m1")
    joined = group.heartbeat(0, _request(first, ("a",)), {"a": 2})
    _absorb(first, joined)
    assert joined.heartbeat_interval_ms == 500  # stable: it has all it should
    waiting = group.heartbeat(10, _request(second, ("a",)), {"a": 2})
    _absorb(second, waiting)
    assert waiting.assignment == frozenset()  # its partition is still m0's
    assert waiting.heartbeat_interval_ms == 100
