"""The fault campaign's consumer-group checker finds what it counts (``bench/_chaos_group.py``):
acked records the group never got, committed offsets going back, a group that did not finish,
and the times a partition had no consumer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos_group import (
    Commit,
    Delivery,
    Ownership,
    backwards_in_commits,
    backwards_in_polls,
    check_group,
    long_silences,
    longest_silence_s,
)

pytestmark = pytest.mark.unit

ACKED = {b"a": (0, 0), b"b": (0, 1), b"c": (1, 0)}


def delivered(*records: tuple[int, int, bytes], at: float = 0.0) -> list[Delivery]:
    return [Delivery(at, 0, p, o, v) for p, o, v in records]


def commit(sent_at: float, done_at: float, offset: int, ok: bool = True) -> Commit:
    return Commit(sent_at, done_at, 0, 0, offset, ok)


def test_a_group_that_got_everything_and_finished_counts_nothing() -> None:
    deliveries = delivered((0, 0, b"a"), (0, 1, b"b"), (1, 0, b"c"))
    polls = [(1.0, {0: 1, 1: -1001}), (2.0, {0: 2, 1: 1})]
    counts = check_group(ACKED, deliveries, [commit(0, 1, 2)], polls, {0: 2, 1: 1})
    assert counts == {
        "group_undelivered": 0,
        "group_duplicates": 0,
        "group_backwards_fetched": 0,
        "group_backwards_committed": 0,
        "group_unfinished_partitions": 0,
    }


def test_a_gap_a_duplicate_and_an_unfinished_partition_are_counted() -> None:
    deliveries = delivered((0, 0, b"a"), (0, 0, b"a"), (1, 0, b"c"))
    polls = [(1.0, {0: 1, 1: 1})]
    counts = check_group(ACKED, deliveries, [], polls, {0: 2, 1: 1})
    assert counts["group_undelivered"] == 1  # b
    assert counts["group_duplicates"] == 1
    assert counts["group_unfinished_partitions"] == 1  # partition 0 committed 1, not 2


def test_an_offset_fetch_answer_below_an_earlier_one_is_backwards() -> None:
    assert backwards_in_polls([(1, {0: 5}), (2, {0: -1001}), (3, {0: 5}), (4, {0: 7})]) == 0
    assert backwards_in_polls([(1, {0: 5, 1: 3}), (2, {0: 4, 1: 3}), (3, {0: 6, 1: 2})]) == 2


def test_a_commit_is_backwards_only_if_a_higher_one_was_answered_before_it_was_sent() -> None:
    # sent after the commit of 10 was answered, with 8: back
    assert backwards_in_commits([commit(0, 1, 10), commit(2, 3, 8)]) == 1
    # in flight at once: not ordered, not counted
    assert backwards_in_commits([commit(0, 2, 10), commit(1, 3, 8)]) == 0
    # a refused commit moved nothing
    assert backwards_in_commits([commit(0, 1, 10), commit(2, 3, 8, ok=False)]) == 0
    # other partitions are apart
    other = Commit(2, 3, 1, 1, 8, True)
    assert backwards_in_commits([commit(0, 1, 10), other]) == 0


def test_ownership_gaps_count_from_each_partitions_first_assignment() -> None:
    owners = Ownership()
    owners.assign(0, [0, 1], now=5.0)  # the first join: not a gap
    owners.revoke(0, [0, 1], now=10.0)
    owners.assign(1, [0], now=12.5)
    owners.assign(0, [1], now=11.0)
    owners.revoke(1, [0], now=20.0)
    owners.close(now=21.0)  # partition 0 still unowned at the end
    assert owners.gaps == {0: [2.5, 1.0], 1: [1.0]}
    assert owners.longest_gap_s() == 2.5


def test_the_longest_silence_counts_the_window_edges() -> None:
    records = [Delivery(t, 0, 0, i, b"") for i, t in enumerate((1.0, 2.0, 6.0))]
    records.append(Delivery(9.5, 0, 1, 0, b""))
    assert longest_silence_s(records, 0.0, 10.0) == 9.5  # partition 1: 0 -> 9.5
    assert longest_silence_s(records[:3], 0.0, 7.0) == 4.0


def test_long_silences_name_the_partition_the_time_and_the_offsets_around() -> None:
    """What ``--keep`` writes beside the longest silence: each one over the bound, from the
    campaign's start, with the offsets delivered on either side (a window's edge has none)."""
    records = [Delivery(t, 0, 0, i, b"") for i, t in enumerate((1.0, 2.0, 6.0))]
    records.append(Delivery(9.5, 0, 1, 0, b""))
    found = long_silences(records, 0.0, 10.0, 3.0, origin=-5.0)
    assert found == [(0, 7.0, 4.0, 1, 2), (0, 11.0, 4.0, 2, None), (1, 5.0, 9.5, None, 0)]
    assert max(gap for _, _, gap, _, _ in found) == longest_silence_s(records, 0.0, 10.0)
