"""The fault campaign's checker finds every kind of damage it counts (``bench/chaos.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from chaos import Acked, Sent, check, describe_failure, failure_summary

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


def test_records_never_acked_are_reported_by_producer_error_and_window() -> None:
    """A run whose producer gave up on records says which producer and partition, with which
    librdkafka error, which sequences and when they were sent, and the last record acked
    before them (a seed-31 run ended with 1,110 records "not acked" and nothing more to go
    on: the producers' errors were not kept)."""
    acked = acked_of((0, 0, 0, 0), (2, 0, 2, 0), (2, 1, 2, 1))
    acked.last_acked[2] = Sent(1, 2, 10.5)
    acked.fail(2, "_MSG_TIMED_OUT", Sent(3, 2, 12.0))
    acked.fail(2, "_MSG_TIMED_OUT", Sent(2, 2, 11.0))
    acked.fail(2, "unflushed", Sent(4, 2, 13.0))
    acked.client_error(2, 14.0, "_ALL_BROKERS_DOWN", "3/3 brokers are down")
    acked.client_error(2, 14.5, "_TRANSPORT", "Connect to ipv4#127.0.0.1:1 failed")
    acked.client_error(1, 14.6, "_TRANSPORT", "Connect to ipv4#127.0.0.1:1 failed")
    summary = failure_summary(acked)
    assert acked.failed == 3
    assert summary == [
        {
            "producer": 2,
            "error": "_MSG_TIMED_OUT",
            "records": 2,
            "partitions": [2],
            "seqs": [2, 3],
            "sent_s": [11.0, 12.0],
            "last_acked": {"seq": 1, "sent_s": 10.5},
        },
        {
            "producer": 2,
            "error": "unflushed",
            "records": 1,
            "partitions": [2],
            "seqs": [4, 4],
            "sent_s": [13.0, 13.0],
            "last_acked": {"seq": 1, "sent_s": 10.5},
        },
    ]
    assert "producer 2 (partitions [2]): 2 records failed with _MSG_TIMED_OUT" in (
        describe_failure(summary[0])
    )
    assert [(e.producer, e.error) for e in acked.client_errors] == [
        (2, "_ALL_BROKERS_DOWN: 3/3 brokers are down")
    ]
    assert acked.counted_errors == {"_TRANSPORT": 2}  # every broker kill makes some


def test_the_last_acked_record_is_the_highest_sequence_acked() -> None:
    acked = Acked()
    acked.add(1, 5, b"p1-5", 1, 5, 2.5)
    acked.add(1, 4, b"p1-4", 1, 4, 2.0)  # reports may come out of order
    assert acked.last_acked[1] == Sent(5, 1, 2.5)
    assert failure_summary(acked) == []
