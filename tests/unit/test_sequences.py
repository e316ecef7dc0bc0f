"""Idempotent-producer sequence checks (``broker/storage/sequences.py``): a retried batch is
acked once with its first offset, gaps and stale epochs are refused with Kafka's codes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.partition_state import ProducerState
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.storage.sequences import (
    RECENT_BATCHES,
    Append,
    Duplicate,
    Reject,
    check_sequence,
)

pytestmark = pytest.mark.unit

LIMIT = 2**31
epochs = st.integers(0, 2**15 - 2)
sizes = st.lists(st.integers(1, 50), min_size=1, max_size=12)


def appended(
    epoch: int, first_seq: int, sizes: list[int], first_offset: int = 0
) -> list[ProducerState]:
    """What the partition remembers after appending batches of ``sizes`` records in order
    (the last five, oldest first). Sequences wrap at 2^31 as the producer's do."""
    recent: list[ProducerState] = []
    seq, offset = first_seq, first_offset
    for size in sizes:
        stamp = 1_700_000_000_000 + offset  # as in a LogAppendTime topic
        recent.append(ProducerState(epoch, seq, seq + size - 1, offset, append_time=stamp))
        seq = (seq + size) % LIMIT
        offset += size
    return recent[-RECENT_BATCHES:]


def next_seq(recent: list[ProducerState]) -> int:
    return (recent[-1].last_seq + 1) % LIMIT


def test_unknown_producer_appends() -> None:
    assert check_sequence([], 0, 0, 9) == Append()
    assert check_sequence([], 3, 1234, 1300) == Append()  # state expired: accept, as Kafka does


@given(epochs, st.integers(0, LIMIT - 1), sizes, st.integers(1, 50))
def test_next_sequence_appends(epoch: int, first: int, history: list[int], size: int) -> None:
    recent = appended(epoch, first, history)
    start = next_seq(recent)
    assert check_sequence(recent, epoch, start, start + size - 1) == Append()


@given(epochs, st.integers(0, LIMIT - 1), sizes, st.data())
def test_retry_of_a_recent_batch_is_a_duplicate_with_its_offset(
    epoch: int, first: int, history: list[int], data: st.DataObject
) -> None:
    recent = appended(epoch, first, history, first_offset=1000)
    retried = data.draw(st.sampled_from(recent))
    decision = check_sequence(recent, epoch, retried.first_seq, retried.last_seq)
    assert decision == Duplicate(retried.offset, retried.append_time)


def test_only_the_last_five_batches_are_recognised_as_duplicates() -> None:
    batches = appended(0, 0, [2] * 8)  # sequences 0-1, 2-3, ... 14-15; remembered from 6-7
    assert len(batches) == RECENT_BATCHES
    assert check_sequence(batches, 0, 6, 7) == Duplicate(6, 1_700_000_000_006)
    assert check_sequence(batches, 0, 14, 15) == Duplicate(14, 1_700_000_000_014)
    assert check_sequence(batches, 0, 4, 5) == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


@given(epochs, st.integers(0, LIMIT - 1), sizes, st.integers(1, 1000), st.integers(1, 50))
def test_gaps_are_out_of_order(
    epoch: int, first: int, history: list[int], gap: int, size: int
) -> None:
    recent = appended(epoch, first, history)
    start = (next_seq(recent) + gap) % LIMIT
    decision = check_sequence(recent, epoch, start, start + size - 1)
    assert decision == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


def test_partial_overlap_with_a_recent_batch_is_out_of_order() -> None:
    recent = appended(0, 0, [5, 5])  # 0-4, 5-9
    assert check_sequence(recent, 0, 5, 7) == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert check_sequence(recent, 0, 3, 9) == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)


@given(st.integers(1, 2**15 - 1), st.integers(0, LIMIT - 1), sizes, st.integers(0, LIMIT - 1))
def test_older_epoch_is_fenced(epoch: int, first: int, history: list[int], seq: int) -> None:
    recent = appended(epoch, first, history)
    decision = check_sequence(recent, epoch - 1, seq, seq)
    assert decision == Reject(ErrorCode.INVALID_PRODUCER_EPOCH)


@given(epochs, st.integers(0, LIMIT - 1), sizes, st.integers(1, 100), st.integers(1, 50))
def test_new_epoch_must_start_at_sequence_zero(
    epoch: int, first: int, history: list[int], bump: int, size: int
) -> None:
    recent = appended(epoch, first, history)
    assert check_sequence(recent, epoch + bump, 0, size - 1) == Append()
    continuing = next_seq(recent)
    if continuing != 0:
        decision = check_sequence(recent, epoch + bump, continuing, continuing + size - 1)
        assert decision == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert check_sequence(recent, epoch + bump, 1, size) == Reject(
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )


@given(st.integers(1, 60), st.integers(1, 50))
def test_sequence_wraps_at_two_to_the_31(before_wrap: int, size: int) -> None:
    """The producer continues at 0 after 2^31 - 1 (Kafka's DefaultRecordBatch.incrementSequence);
    the batch that crosses the boundary carries base sequence + last offset delta past it."""
    first = LIMIT - before_wrap
    recent = [ProducerState(0, first, first + before_wrap - 1, 500)]  # ends at exactly 2^31 - 1
    assert check_sequence(recent, 0, 0, size - 1) == Append()
    crossing = [ProducerState(0, first, first + before_wrap + 9, 500)]  # ends at 9, unwrapped
    assert check_sequence(crossing, 0, 10, 10 + size - 1) == Append()
    assert check_sequence(crossing, 0, first, first + before_wrap + 9) == Duplicate(500)
    assert check_sequence(recent, 0, 1, size) == Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
