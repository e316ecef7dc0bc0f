"""The aborted-transaction entries a compaction pass's commit drops, and the abort markers a pass
may remove (``metadata.aborted_index.kept_aborts_from`` / ``without_cleaned_aborts``).

A pass drops every aborted record below its ``upto``; its commit then drops the entries ending
below ``upto`` (nothing left for them to filter). A reader told of an aborted transaction whose
abort marker is gone skips the producer's later transactions (Kafka's Java client and
librdkafka stop skipping at the marker), so a pass removes an abort marker only if its entry goes
in the commit: never one inside an index object the commit keeps.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.aborted_index import (
    kept_aborts_from,
    spill_aborted,
    without_cleaned_aborts,
)
from kafscale.broker.metadata.partition_state import AbortedTxn, PartitionState, TxnIndexRef

pytestmark = pytest.mark.unit


def aborts(count: int, start: int = 0) -> tuple[AbortedTxn, ...]:
    return tuple(AbortedTxn(100 + i, start + 3 * i, start + 3 * i + 2) for i in range(count))


def test_the_commit_drops_the_entries_and_index_objects_wholly_below_upto() -> None:
    below, across = TxnIndexRef(0, 20, 1, 4), TxnIndexRef(21, 40, 1, 4)
    state = PartitionState(
        high_watermark=100,
        aborted_txns=(AbortedTxn(7, 41, 50), AbortedTxn(8, 45, 60)),
        aborted_txn_index=(below, across),
    )

    across_upto = without_cleaned_aborts(state, 35)
    past_all = without_cleaned_aborts(state, 55)

    assert across_upto.aborted_txn_index == (across,)  # it holds a marker at or after 35
    assert across_upto.aborted_txns == state.aborted_txns
    assert past_all.aborted_txn_index == ()
    assert past_all.aborted_txns == (AbortedTxn(8, 45, 60),)
    # abort markers from the first offset of an object the commit keeps on stay
    assert kept_aborts_from(state, 35) == 21
    assert kept_aborts_from(state, 10) == 0
    assert kept_aborts_from(state, 55) == 55


def test_a_spill_that_absorbs_a_dropped_object_into_a_kept_one_refuses_the_commit() -> None:
    """Between a pass's start and its commit a flush may spill: the new object absorbs the
    newest ones, reaching past ``upto``. An abort marker the pass removed would then keep its
    entry, so the commit (``last_removed_abort >= kept_aborts_from``) does not go through."""
    planned = PartitionState(
        high_watermark=200,
        aborted_txns=aborts(4, start=30),
        aborted_txn_index=(TxnIndexRef(0, 20, 1, 2),),
    )
    upto = 25
    removable_from = kept_aborts_from(planned, upto)
    assert removable_from == upto  # the object lies wholly below: its markers may go
    last_removed_abort = 20
    assert last_removed_abort < removable_from

    spilled, spill = spill_aborted(planned, limit=2)

    assert spill is not None and spill.absorbed  # the old object is in the new one
    assert last_removed_abort >= kept_aborts_from(spilled, upto)  # the commit refuses


@given(
    limit=st.integers(2, 8),
    steps=st.lists(st.integers(1, 5), max_size=30),
    upto=st.integers(0, 400),
)
def test_no_entry_of_a_removable_abort_marker_survives_the_commit(
    limit: int, steps: list[int], upto: int
) -> None:
    state = PartitionState(high_watermark=0)
    every: list[AbortedTxn] = []
    offset = 0
    for count in steps:
        new = aborts(count, start=offset)
        offset += 3 * count
        every += new
        state, _ = spill_aborted(replace(state, aborted_txns=(*state.aborted_txns, *new)), limit)

    bound = kept_aborts_from(state, upto)
    after = without_cleaned_aborts(state, upto)

    assert bound <= upto
    for txn in every:
        spilled_in = [
            r
            for r in after.aborted_txn_index
            if r.first_offset <= txn.first_offset and txn.last_offset <= r.last_offset
        ]
        if txn.last_offset < bound:  # a pass may remove its marker: no reader is told of it
            assert txn not in after.aborted_txns and not spilled_in
        if txn.last_offset >= upto:  # records the pass did not clean: still filtered
            assert txn in after.aborted_txns or spilled_in
