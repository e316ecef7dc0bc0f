"""The fault campaign's checker finds every kind of damage it counts (``bench/chaos.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from chaos import Acked, check

pytestmark = pytest.mark.unit


def acked_of(*records: tuple[int, int, int, int]) -> Acked:
    """(producer, seq, partition, offset) -> what the producers were told."""
    acked = Acked()
    for producer, seq, partition, offset in records:
        acked.add(producer, seq, b"p%d-%d" % (producer, seq), partition, offset)
    return acked


ACKED = acked_of((0, 0, 0, 0), (0, 1, 0, 1), (0, 2, 0, 2))


def test_an_intact_log_counts_nothing() -> None:
    log = {0: [(0, b"p0-0"), (1, b"p0-1"), (2, b"p0-2")]}
    counts = check(ACKED, log, {0: 3})
    assert counts == {"lost": 0, "duplicated": 0, "misplaced": 0, "reordered": 0, "unread": 0}


def test_each_kind_of_damage_is_counted() -> None:
    assert check(ACKED, {0: [(0, b"p0-0"), (1, b"p0-1")]}, {0: 2})["lost"] == 1
    assert check(ACKED, {0: [(0, b"p0-0"), (1, b"x"), (2, b"p0-2")]}, {0: 3})["lost"] == 1
    dup = {0: [(0, b"p0-0"), (1, b"p0-1"), (2, b"p0-2"), (3, b"p0-2")]}
    assert check(ACKED, dup, {0: 4})["duplicated"] == 1
    moved = {0: [(0, b"p0-0"), (1, b"p0-2"), (2, b"p0-1")]}
    assert check(ACKED, moved, {0: 3})["misplaced"] == 2
    swapped = acked_of((0, 0, 0, 1), (0, 1, 0, 0))
    assert check(swapped, {0: [(0, b"p0-1"), (1, b"p0-0")]}, {0: 2})["reordered"] == 1


def test_offsets_not_reached_by_the_reader_are_unread_not_lost() -> None:
    counts = check(ACKED, {0: [(0, b"p0-0")]}, {0: 3})
    assert counts["unread"] == 2 and counts["lost"] == 0


def test_a_record_acked_without_an_offset_is_checked_by_its_partition() -> None:
    """librdkafka acks a batch implicitly when a later one succeeds, with no offset: the
    checker used to crash on it (TypeError) and lose the whole campaign's figures."""
    acked = acked_of((0, 0, 0, 0), (0, 1, 0, 1))
    acked.add(0, 2, b"p0-2", 0, None)
    intact = {0: [(0, b"p0-0"), (1, b"p0-1"), (2, b"p0-2")]}
    assert check(acked, intact, {0: 3}) == {
        "lost": 0, "duplicated": 0, "misplaced": 0, "reordered": 0, "unread": 0
    }  # fmt: skip
    assert check(acked, {0: [(0, b"p0-0"), (1, b"p0-1")]}, {0: 2})["lost"] == 1
    assert check(acked, {1: [(0, b"p0-2")], 0: intact[0][:2]}, {0: 2, 1: 1})["misplaced"] == 1
