"""The compaction fault campaign's checkers (``harness.compaction_faults``) catch each broken
rule: a checker that cannot fail would make the campaign prove nothing."""

from __future__ import annotations

import pytest
from harness.compaction_faults import (
    Ledger,
    Sent,
    check_log,
    check_store,
    latest_acked,
    tiling_gaps,
)

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import Cleaned, PartitionState, SegmentRef

pytestmark = pytest.mark.unit

WHERE = ("c", "t", "id", 0)


def ledger_of(*sends: tuple[bytes, bytes | None, int | None, bool]) -> Ledger:
    """(key, value, offset, acked) in send order, all on partition 0."""
    ledger = Ledger()
    for key, value, offset, acked in sends:
        at = ledger.send(Sent(key, value, 0))
        ledger.report(key, at, offset, acked)
    return ledger


CLEAN = {"wrong_latest": 0, "moved_latest": 0, "missing": 0, "not_increasing": 0}


def test_a_cleaned_log_with_each_keys_latest_value_in_place_passes() -> None:
    ledger = ledger_of((b"a", b"a1", 0, True), (b"b", b"b1", 1, True), (b"a", None, 2, True))
    assert latest_acked(ledger) == {b"a": None, b"b": b"b1"}
    read = {0: [(1, b"b", b"b1"), (2, b"a", None)]}
    assert check_log(ledger, read, {0: 2}) == CLEAN


def test_an_older_value_read_last_a_tombstone_lost_and_a_moved_record_are_caught() -> None:
    ledger = ledger_of((b"a", b"a1", 0, True), (b"a", b"a2", 1, True), (b"b", None, 2, True))
    assert check_log(ledger, {0: [(0, b"a", b"a1")]}, {0: 0})["wrong_latest"] == 2
    assert check_log(ledger, {0: [(2, b"b", None), (5, b"a", b"a2")]}, {0: 0})["moved_latest"] == 1


def test_a_record_missing_above_the_cleaned_point_and_offsets_out_of_order_are_caught() -> None:
    ledger = ledger_of((b"a", b"a1", 0, True), (b"b", b"b1", 1, True), (b"a", b"a2", 2, True))
    read = {0: [(1, b"b", b"b1"), (2, b"a", b"a2")]}
    assert check_log(ledger, read, {0: 0})["missing"] == 1  # a1 at 0 is above upto 0
    assert check_log(ledger, read, {0: 1}) == CLEAN  # cleaned away below upto 1
    twice = {0: [(1, b"b", b"b1"), (1, b"b", b"b1"), (2, b"a", b"a2")]}
    assert check_log(ledger, twice, {0: 1})["not_increasing"] == 1


def test_a_failed_send_after_the_latest_acked_may_be_read_last_and_no_offset_is_no_place() -> None:
    ledger = ledger_of((b"a", b"a1", 0, True), (b"a", b"a2", None, False))
    assert check_log(ledger, {0: [(1, b"a", b"a2")]}, {0: 1}) == CLEAN
    implicit = ledger_of((b"a", b"a1", None, True))  # acked without its offset
    assert check_log(implicit, {0: [(7, b"a", b"a1")]}, {0: 0}) == CLEAN


def _cleaned(generation: int, epoch: int, base: int) -> str:
    prefix = keys.cleaned_pass_prefix(*WHERE, generation, epoch)
    return keys.cleaned_object_key(prefix, base)


def test_the_store_check_names_orphans_and_missing_objects() -> None:
    state = PartitionState(
        high_watermark=30,
        cleaned=Cleaned(20, 2, 5),
        segments=[SegmentRef(20, 29, 5, 100, 0)],
    )
    kept = [_cleaned(2, 5, 0), _cleaned(2, 5, 10)]
    live = keys.segment_object_key(*WHERE, 20, 5)
    superseded = keys.segment_object_key(*WHERE, 10, 4)
    old = _cleaned(1, 5, 0)
    fenced = _cleaned(3, 4, 0)
    found = check_store(state, [*kept, live, superseded, old, fenced], WHERE)
    assert found.orphans == sorted([superseded, old, fenced])
    assert found.missing == []
    assert found.cleaned_keys == kept
    gone = check_store(state, [superseded], WHERE)
    assert gone.missing == [live, f"{keys.cleaned_pass_prefix(*WHERE, 2, 5)} (no cleaned object)"]


def test_cleaned_objects_must_tile_from_the_log_start_to_upto() -> None:
    assert tiling_gaps([(0, 0, 9), (10, 10, 19)], 0, 20) == []
    assert tiling_gaps([(0, 0, 8), (10, 10, 19)], 0, 20) == ["object 0 ends at 9, not at 10"]
    assert tiling_gaps([(5, 5, 19)], 0, 20) == ["first cleaned object begins at 5 > log start 0"]
    assert tiling_gaps([(0, 3, 19)], 0, 20) == ["object 0 says it begins at 3"]
    assert tiling_gaps([(0, 0, 9)], 0, 20) == ["object 0 ends at 10, not at 20"]
    assert tiling_gaps([], 0, 20) == ["no cleaned object below 20"]
