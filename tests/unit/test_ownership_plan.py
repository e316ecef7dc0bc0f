"""Following the desired assignment (``broker/ownership.py`` ``plan_ownership``): release what
another live broker should own, acquire what is ours and free, release everything when
draining (DESIGN §3.9-10)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.ownership import OwnershipPlan, TopicPartition, plan_ownership

pytestmark = pytest.mark.unit

ME = 1
tps = st.tuples(st.sampled_from(["orders", "audit", "x"]), st.integers(0, 15))
broker_ids = st.integers(0, 5)


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[set[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int], set[int]]:
    owned = draw(st.sets(tps, max_size=10))
    desired = draw(st.dictionaries(tps, broker_ids, max_size=20))
    holders = draw(st.dictionaries(tps, broker_ids, max_size=20))
    for tp in owned:
        holders[tp] = ME  # what we own we hold
    live = draw(st.sets(broker_ids, max_size=6)) | {ME}
    return owned, desired, holders, live


Situation = tuple[
    set[TopicPartition], dict[TopicPartition, int], dict[TopicPartition, int], set[int]
]


@given(situations())
def test_plan_properties(situation: Situation) -> None:
    owned, desired, holders, live = situation
    plan = plan_ownership(ME, owned, desired, holders, live, draining=False)
    assert plan.release == sorted(plan.release)
    assert plan.acquire == sorted(plan.acquire)
    assert set(plan.release) <= owned
    assert not set(plan.acquire) & owned
    for tp in plan.release:  # only to a live broker that should have it
        assert desired[tp] != ME and desired[tp] in live
    for tp in plan.acquire:  # only ours, and only when nobody else holds it
        assert desired[tp] == ME and holders.get(tp) in (None, ME)
    for tp in owned - set(plan.release):  # kept: ours, undecided, or wanted by a dead broker
        assert desired.get(tp) in (None, ME) or desired[tp] not in live
    for tp, want in desired.items():
        if want == ME and tp not in owned and tp not in holders:
            assert tp in plan.acquire


@given(situations())
def test_draining_releases_everything_and_acquires_nothing(situation: Situation) -> None:
    owned, desired, holders, live = situation
    plan = plan_ownership(ME, owned, desired, holders, live, draining=True)
    assert plan == OwnershipPlan(release=sorted(owned), acquire=[])


@given(situations())
def test_following_the_plan_reaches_a_fixed_point(situation: Situation) -> None:
    """After releasing and acquiring (when free), the plan asks for nothing more."""
    owned, desired, holders, live = situation
    plan = plan_ownership(ME, owned, desired, holders, live, draining=False)
    now_owned = (owned - set(plan.release)) | set(plan.acquire)
    now_holders = {tp: b for tp, b in holders.items() if tp not in plan.release}
    now_holders.update({tp: ME for tp in plan.acquire})
    again = plan_ownership(ME, now_owned, desired, now_holders, live, draining=False)
    assert again == OwnershipPlan(release=[], acquire=[])


def test_examples() -> None:
    owned = {("t", 0), ("t", 1), ("t", 2)}
    desired = {("t", 0): ME, ("t", 1): 2, ("t", 2): 3, ("t", 3): ME, ("t", 4): ME}
    holders = {("t", 0): ME, ("t", 1): ME, ("t", 2): ME, ("t", 4): 2}
    plan = plan_ownership(ME, owned, desired, holders, live={1, 2}, draining=False)
    # t-1 goes to live broker 2; t-2 stays (broker 3 is dead); t-4 waits for broker 2's lease.
    assert plan == OwnershipPlan(release=[("t", 1)], acquire=[("t", 3)])
