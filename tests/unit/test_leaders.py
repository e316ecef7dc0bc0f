"""Which broker Metadata names as leader (``broker/metadata/leaders.py``): the live lease holder,
else the live desired owner, else a pick every broker agrees on (DESIGN §3.3, §3.10)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.leaders import (
    TopicPartition,
    leader_for,
    live_leaders,
    owner_refusal,
)

pytestmark = pytest.mark.unit

topics = st.sampled_from(["orders", "audit", "clicks", "a.b-c_d", "é"])
tps = st.tuples(topics, st.integers(0, 63))
broker_ids = st.integers(0, 12)
broker_sets = st.sets(broker_ids, max_size=8)


@st.composite
def views(
    draw: st.DrawFn,
) -> tuple[
    TopicPartition, dict[TopicPartition, int], dict[TopicPartition, int], set[int], set[int]
]:
    tp = draw(tps)
    owners = draw(st.dictionaries(tps, broker_ids, max_size=6))
    desired = draw(st.dictionaries(tps, broker_ids, max_size=6))
    if draw(st.booleans()):
        owners[tp] = draw(broker_ids)
    if draw(st.booleans()):
        desired[tp] = draw(broker_ids)
    live = draw(broker_sets)
    draining = draw(st.sets(broker_ids, max_size=4))
    return tp, owners, desired, live, draining


View = tuple[
    TopicPartition, dict[TopicPartition, int], dict[TopicPartition, int], set[int], set[int]
]


@given(views())
def test_leader_is_live_or_none(view: View) -> None:
    tp, owners, desired, live, draining = view
    leader = leader_for(tp, owners, desired, live, draining)
    if live:
        assert leader in live
    else:
        assert leader == -1


@given(views())
def test_live_lease_holder_wins(view: View) -> None:
    tp, owners, desired, live, draining = view
    if owners.get(tp) in live:
        assert leader_for(tp, owners, desired, live, draining) == owners[tp]


@given(views())
def test_without_holder_the_live_undrained_desired_owner_leads(view: View) -> None:
    tp, owners, desired, live, draining = view
    owners.pop(tp, None)
    want = desired.get(tp)
    if want is not None and want in live and want not in draining:
        assert leader_for(tp, owners, desired, live, draining) == want


@given(views())
def test_draining_brokers_are_not_picked_while_others_are_live(view: View) -> None:
    tp, owners, desired, live, draining = view
    owners.pop(tp, None)
    if live - draining:
        assert leader_for(tp, owners, desired, live, draining) not in draining


@given(views(), st.randoms(use_true_random=False))
def test_pick_is_independent_of_input_order(view: View, rng: random.Random) -> None:
    """Every broker computes the same leader for a leaderless partition."""
    tp, owners, desired, live, draining = view
    expected = leader_for(tp, owners, desired, live, draining)
    shuffled_live = list(live)
    rng.shuffle(shuffled_live)
    shuffled_draining = list(draining)
    rng.shuffle(shuffled_draining)
    assert leader_for(tp, owners, desired, shuffled_live, shuffled_draining) == expected
    assert leader_for(tp, owners, desired, frozenset(live), tuple(draining)) == expected


def test_all_draining_still_names_a_live_broker() -> None:
    assert leader_for(("t", 0), {}, {}, {1, 2}, {1, 2}) in {1, 2}


def test_dead_holder_falls_back_to_desired_owner() -> None:
    assert leader_for(("t", 0), {("t", 0): 9}, {("t", 0): 2}, {1, 2, 3}, set()) == 2


def test_no_live_broker_means_no_leader() -> None:
    assert leader_for(("t", 0), {("t", 0): 1}, {("t", 0): 1}, set(), set()) == -1


def test_leaderless_partitions_spread_over_brokers() -> None:
    live = {1, 2, 3}
    picks = {leader_for(("orders", p), {}, {}, live, set()) for p in range(30)}
    assert picks == live


@given(views(), broker_ids)
def test_a_broker_whose_lease_etcd_may_no_longer_hold_names_itself_leader_of_nothing(
    view: View, me: int
) -> None:
    """Woken past its TTL, its view may still show the ownership etcd deleted with the
    session (docs/architecture.md, "Ownership, handoff and failover")."""
    tp, owners, desired, live, draining = view
    owners[tp] = me
    leader = leader_for(tp, owners, desired, live_leaders(live, me, False), draining)
    assert leader != me
    assert leader in live or leader == -1


def test_a_broker_with_a_valid_session_is_live_as_registered() -> None:
    assert live_leaders({1, 2}, 1, True) == {1, 2}
    assert live_leaders({2}, 1, True) == {2}
    assert leader_for(("t", 0), {("t", 0): 1}, {}, live_leaders({1, 2}, 1, False), set()) == 2
    assert leader_for(("t", 0), {("t", 0): 1}, {}, live_leaders({1}, 1, False), set()) == -1


@given(views(), broker_ids, broker_ids)
def test_a_suspended_broker_whose_lease_etcd_may_hold_names_what_the_others_name(
    view: View, me: int, other: int
) -> None:
    """Its ownership keys are in etcd, so every other broker names it where it owns: naming
    another (as it did) sent clients between two brokers that both refused them."""
    tp, owners, desired, live, draining = view
    live = {*live, me, other}
    owners[tp] = me
    mine = leader_for(tp, owners, desired, live_leaders(live, me, True), draining)
    theirs = leader_for(tp, owners, desired, live_leaders(live, other, True), draining)
    assert mine == theirs == me


def test_an_owner_acts_only_while_it_accepts_and_its_session_is_valid() -> None:
    """A suspended owner refuses (NOT_LEADER_OR_FOLLOWER, nothing written) what it could not
    ack before etcd answers again; a client refreshes its metadata and comes back."""
    assert owner_refusal(("t", 0), True, True) is None
    assert "suspended" in (owner_refusal(("t", 0), True, False) or "")
    assert "handed over" in (owner_refusal(("t", 0), False, True) or "")
    assert "handed over" in (owner_refusal(("t", 0), False, False) or "")
