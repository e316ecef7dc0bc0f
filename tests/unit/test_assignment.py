"""Properties of the partition assignment (DESIGN §3.10): balanced, sticky, minimal, stable."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kafscale.broker.metadata.assignment import (
    Assignment,
    TopicPartition,
    count_moves,
    decide_assignment,
)
from kafscale.broker.metadata.leaders import leader_for, stable_pick

pytestmark = pytest.mark.unit

topic_names = st.sampled_from(["orders", "audit", "clicks", "a.b-c_d"])
partition_lists = st.lists(st.tuples(topic_names, st.integers(0, 11)), max_size=40)
broker_lists = st.lists(st.integers(0, 9), min_size=1, max_size=7)


@st.composite
def situations(
    draw: st.DrawFn,
) -> tuple[list[TopicPartition], list[int], dict[TopicPartition, int]]:
    """Partitions, live brokers, and an arbitrary previous owner map (dead owners included)."""
    partitions = draw(partition_lists)
    brokers = draw(broker_lists)
    owners = st.integers(0, 12)
    previous = draw(
        st.dictionaries(st.sampled_from(partitions), owners) if partitions else st.just({})
    )
    return partitions, brokers, previous


def assert_balanced(result: Mapping[TopicPartition, int], brokers: Sequence[int]) -> None:
    counts = Counter(result.values())
    per_broker = [counts.get(b, 0) for b in set(brokers)]
    assert max(per_broker) - min(per_broker) <= 1


def minimal_moves_by_brute_force(
    partitions: Sequence[TopicPartition],
    brokers: Sequence[int],
    previous: Mapping[TopicPartition, int],
) -> int:
    """Fewest moves over every balanced assignment (small inputs only)."""
    wanted, live = sorted(set(partitions)), sorted(set(brokers))
    best = len(wanted)
    for owners in itertools.product(live, repeat=len(wanted)):
        counts = [owners.count(b) for b in live]
        if max(counts) - min(counts) <= 1:
            best = min(best, count_moves(previous, dict(zip(wanted, owners, strict=True))))
    return best


@given(situations())
def test_every_partition_goes_once_to_a_live_broker_and_counts_balance(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
) -> None:
    partitions, brokers, previous = situation
    result = decide_assignment(partitions, brokers, previous)
    assert set(result) == set(partitions)
    assert set(result.values()) <= set(brokers)
    assert_balanced(result, brokers)


@given(situations(), st.randoms(use_true_random=False))
def test_same_input_in_any_order_gives_the_same_result(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
    rng: random.Random,
) -> None:
    partitions, brokers, previous = situation
    shuffled_partitions, shuffled_brokers = partitions[:], brokers[:]
    rng.shuffle(shuffled_partitions)
    rng.shuffle(shuffled_brokers)
    items = list(previous.items())
    rng.shuffle(items)
    expected = decide_assignment(partitions, brokers, previous)
    actual = decide_assignment(shuffled_partitions, shuffled_brokers, dict(items))
    assert actual == expected


@given(situations())
def test_no_moves_when_nothing_changed(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
) -> None:
    partitions, brokers, previous = situation
    settled = decide_assignment(partitions, brokers, previous)
    assert decide_assignment(partitions, brokers, settled) == settled


@given(situations(), st.integers(10, 20))
def test_adding_a_broker_moves_only_what_it_must_take(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
    newcomer: int,
) -> None:
    partitions, brokers, previous = situation
    before = decide_assignment(partitions, brokers, previous)
    after = decide_assignment(partitions, [*brokers, newcomer], before)
    moved = [tp for tp in before if before[tp] != after[tp]]
    assert all(after[tp] == newcomer for tp in moved)
    # Balance forces the newcomer to take at least n // (m + 1); it takes no more than needed.
    floor = len(set(partitions)) // (len(set(brokers)) + 1)
    assert floor <= len(moved) <= floor + 1
    assert_balanced(after, [*brokers, newcomer])


@given(situations(), st.data())
def test_removing_a_broker_moves_only_its_partitions(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
    data: st.DataObject,
) -> None:
    partitions, brokers, previous = situation
    live = sorted(set(brokers))
    before = decide_assignment(partitions, live, previous)
    leaving = data.draw(st.sampled_from(live))
    remaining = [b for b in live if b != leaving]
    after = decide_assignment(partitions, remaining, before)
    moved = {tp for tp in before if before[tp] != after.get(tp)}
    assert moved == {tp for tp, owner in before.items() if owner == leaving}


@settings(max_examples=150)
@given(
    st.lists(st.tuples(st.just("t"), st.integers(0, 6)), max_size=7),
    st.lists(st.integers(0, 3), min_size=1, max_size=3),
    st.data(),
)
def test_moves_are_the_fewest_any_balanced_assignment_needs(
    partitions: list[TopicPartition], brokers: list[int], data: st.DataObject
) -> None:
    owners = st.dictionaries(st.sampled_from(partitions), st.integers(0, 4))
    previous = data.draw(owners) if partitions else {}
    result = decide_assignment(partitions, brokers, previous)
    assert count_moves(previous, result) == minimal_moves_by_brute_force(
        partitions, brokers, previous
    )


@given(situations(), st.integers(1, 3))
def test_a_new_topic_goes_to_the_brokers_metadata_named_before_the_assignment(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]], rounds: int
) -> None:
    """Whoever claimed a new partition on demand keeps it: no handoff when the assignment lands.

    A topic of ``rounds * m`` partitions leaves every broker room for its share, so each new
    partition must go where ``leader_for`` sent its first produce (no owner, no assignment).
    """
    partitions, brokers, previous = situation
    live = sorted(set(brokers))
    settled = decide_assignment(partitions, live, previous)
    fresh = [("fresh", p) for p in range(rounds * len(live))]
    result = decide_assignment([*partitions, *fresh], live, settled)
    for tp in fresh:
        assert result[tp] == stable_pick(tp, live) == leader_for(tp, {}, settled, live, ())
    assert all(result[tp] == owner for tp, owner in settled.items())


@given(situations(), st.data())
def test_a_departed_brokers_partitions_stay_with_the_brokers_metadata_named_meanwhile(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]],
    data: st.DataObject,
) -> None:
    """Between a broker leaving and the next assignment, Metadata names a stable pick among the
    live brokers as the leader of each of its partitions (no live lease holder, the assigned
    owner gone), and that broker claims it at the first produce. The assignment then leaves it
    there, unless that broker's share is already full of partitions with as good a claim: its
    own, or others without a live owner whose stable pick it is. Never one dealt round-robin."""
    partitions, brokers, previous = situation
    live = sorted(set(brokers))
    assume(len(live) >= 2)
    settled = decide_assignment(partitions, live, previous)
    leaving = data.draw(st.sampled_from(live))
    remaining = [b for b in live if b != leaving]
    after = decide_assignment(partitions, remaining, settled)

    def has_a_claim(tp: TopicPartition, broker: int) -> bool:
        kept = settled[tp] == broker
        return kept or (settled[tp] == leaving and stable_pick(tp, remaining) == broker)

    for tp in (tp for tp, owner in settled.items() if owner == leaving):
        meanwhile = leader_for(tp, {}, settled, remaining, ())
        assert meanwhile == stable_pick(tp, remaining)
        if after[tp] != meanwhile:
            held = [other for other, broker in after.items() if broker == meanwhile]
            assert all(has_a_claim(other, meanwhile) for other in held), (tp, held)


@given(situations(), st.integers(0, 2**40))
def test_json_round_trip(
    situation: tuple[list[TopicPartition], list[int], dict[TopicPartition, int]], generation: int
) -> None:
    partitions, brokers, previous = situation
    assignment = Assignment(generation, decide_assignment(partitions, brokers, previous))
    assert Assignment.from_json(assignment.to_json()) == assignment


# --- examples -----------------------------------------------------------------------------------


def test_fresh_assignment_spreads_each_topic_from_its_stable_pick() -> None:
    # crc32("orders") % 3 == 2: partition 0 starts at the third broker, as Metadata names it.
    partitions = [("orders", p) for p in range(6)]
    assert decide_assignment(partitions, [3, 1, 2], {}) == {
        ("orders", 0): 3,
        ("orders", 1): 1,
        ("orders", 2): 2,
        ("orders", 3): 3,
        ("orders", 4): 1,
        ("orders", 5): 2,
    }


def test_no_brokers_means_no_owners() -> None:
    assert decide_assignment([("orders", 0)], [], {("orders", 0): 1}) == {}


def test_departed_brokers_partitions_move_and_nothing_else() -> None:
    # Broker 3's partitions go to their stable picks among [1, 2] (crc32("t") is even: t-3 to
    # broker 2, t-4 to broker 1), the brokers Metadata named while they had no live owner.
    previous = {("t", 0): 1, ("t", 1): 1, ("t", 2): 2, ("t", 3): 3, ("t", 4): 3}
    result = decide_assignment(list(previous), [1, 2], previous)
    assert result == {("t", 0): 1, ("t", 1): 1, ("t", 2): 2, ("t", 3): 2, ("t", 4): 1}
    assert count_moves(previous, result) == 2


def test_a_departed_brokers_partitions_go_where_metadata_sent_them_not_round_robin() -> None:
    # Three brokers, six partitions: broker 1 leaves; Metadata meanwhile names stable_pick among
    # [2, 3] for its partitions (crc32("audit") is odd: audit-0 to broker 3, audit-3 to 2), which
    # claim them; round-robin dealing would have swapped the two (four moves, not two).
    previous = {("audit", p): [1, 2, 3][p % 3] for p in range(6)}
    result = decide_assignment(list(previous), [2, 3], previous)
    for tp in (("audit", 0), ("audit", 3)):
        assert result[tp] == leader_for(tp, {}, previous, [2, 3], ()) == stable_pick(tp, [2, 3])
    assert result == {**previous, ("audit", 0): 3, ("audit", 3): 2}


def test_overloaded_broker_sheds_just_enough() -> None:
    previous = {("t", p): 1 for p in range(4)}
    result = decide_assignment(list(previous), [1, 2], previous)
    assert Counter(result.values()) == {1: 2, 2: 2}
    assert count_moves(previous, result) == 2


def test_json_format_is_documented_shape() -> None:
    assignment = Assignment(7, {("orders", 10): 2, ("orders", 2): 1, ("audit", 0): 1})
    assert assignment.to_json() == (
        b'{"version":1,"generation":7,"owners":{"audit/0":1,"orders/2":1,"orders/10":2}}'
    )


@pytest.mark.parametrize(
    "document",
    [
        b"[]",
        b'{"generation":"1","owners":{}}',
        b'{"generation":1,"owners":[]}',
        b'{"generation":1,"owners":{"orders":1}}',
        b'{"generation":1,"owners":{"orders/x":1}}',
        b'{"generation":1,"owners":{"orders/0":"1"}}',
        b'{"generation":true,"owners":{}}',
    ],
)
def test_malformed_json_is_rejected(document: bytes) -> None:
    with pytest.raises(ValueError, match="assignment"):
        Assignment.from_json(document)
