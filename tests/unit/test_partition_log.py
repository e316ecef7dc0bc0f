"""What a flush round takes from a partition's buffer: everything, or only whole segments.

A round started because one partition filled a segment takes only whole segments from every
partition; the rest stays buffered, in order, for the timer. What the round commits about
idempotent producers must describe the batches it carries and nothing after them: a producer
state that ran ahead of the committed data would make a retry of a lost batch look like a
duplicate after a failover.
"""

from __future__ import annotations

import asyncio

import pytest

from kafscale.broker.metadata.partition_state import PartitionState, ProducerState
from kafscale.broker.protocol.errors import StorageFailure
from kafscale.broker.protocol.record_batch import NO_PRODUCER_ID, BatchHeader
from kafscale.broker.storage.partition_log import (
    Ack,
    OwnedPartition,
    PendingBatch,
    cut_segments,
    whole_segments,
)

SEGMENT = 1000


def header(records: int, producer_id: int = NO_PRODUCER_ID, first_seq: int = -1) -> BatchHeader:
    return BatchHeader(
        base_offset=0,
        batch_length=0,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=records - 1,
        base_timestamp=0,
        max_timestamp=0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id != NO_PRODUCER_ID else -1,
        base_sequence=first_seq,
        record_count=records,
    )


def partition() -> OwnedPartition:
    state = PartitionState(high_watermark=100, leader_epoch=3, epochs=((3, 100),))
    return OwnedPartition("t", 0, "id", state, state_revision=1, lease_revision=1)


def sizes(chunks: list[list[PendingBatch]]) -> list[list[int]]:
    return [[len(batch.data) for batch in chunk] for chunk in chunks]


@pytest.mark.parametrize(
    ("batches", "whole", "rest"),
    [
        ([400, 400, 400], [[400, 400]], [400]),  # 400 + 400 + 400 > 1000: the first two are whole
        ([400, 600, 400], [[400, 600]], [400]),  # exactly full, then the start of the next
        ([400, 600], [[400, 600]], []),  # the last chunk is full: nothing left
        ([400, 500], [], [400, 500]),  # not a segment's worth yet
        ([1500, 10], [[1500]], [10]),  # an oversized batch is a segment of its own
        ([], [], []),
    ],
)
def test_whole_segments_leave_the_unfilled_last_one(
    batches: list[int], whole: list[list[int]], rest: list[int]
) -> None:
    loop = asyncio.new_event_loop()
    try:
        items = [PendingBatch(b"x" * n, 0, 0, 0, loop.create_future()) for n in batches]
        taken, left = whole_segments(cut_segments(items, SEGMENT), SEGMENT)
        assert sizes(taken) == whole
        assert [len(batch.data) for batch in left] == rest
    finally:
        loop.close()


async def test_a_size_round_takes_whole_segments_and_the_timer_takes_the_rest() -> None:
    owned = partition()
    for _ in range(5):
        owned.append(b"x" * 400, header(2))
    work = owned.take_flush_work(SEGMENT, whole_segments_only=True)
    assert work is not None
    assert [[b.base_offset for b in chunk] for chunk in work.chunks] == [[100, 102], [104, 106]]
    assert [b.base_offset for b in owned.pending] == [108]
    assert owned.pending_bytes == 400
    assert owned.take_flush_work(SEGMENT, whole_segments_only=True) is None  # 400 < a segment
    rest = owned.take_flush_work(SEGMENT)
    assert rest is not None and [[b.base_offset for b in c] for c in rest.chunks] == [[108]]
    assert owned.pending == [] and owned.pending_bytes == 0
    assert owned.in_flight == 2


async def test_a_partition_being_handed_over_gives_up_everything() -> None:
    owned = partition()
    for _ in range(3):
        owned.append(b"x" * 400, header(1))
    owned.accepting = False
    work = owned.take_flush_work(SEGMENT, whole_segments_only=True)
    assert work is not None and sum(len(chunk) for chunk in work.chunks) == 3
    assert owned.pending == []


async def test_producer_state_covers_only_the_batches_a_round_takes() -> None:
    owned = partition()
    pid = 42
    seq = 0
    for _ in range(4):  # two whole segments of two batches, 400 bytes each ...
        owned.append(b"x" * 400, header(5, pid, seq))
        seq += 5
    owned.append(b"x" * 400, header(5, pid, seq))  # ... and one batch left over
    work = owned.take_flush_work(SEGMENT, whole_segments_only=True)
    assert work is not None
    taken = work.producers[pid]
    assert [(p.first_seq, p.last_seq, p.offset) for p in taken] == [
        (0, 4, 100),
        (5, 9, 105),
        (10, 14, 110),
        (15, 19, 115),
    ]
    rest = owned.take_flush_work(SEGMENT)
    assert rest is not None
    assert [(p.first_seq, p.offset) for p in rest.producers[pid]] == [
        (0, 100),
        (5, 105),
        (10, 110),
        (15, 115),
        (20, 120),
    ]


async def test_a_round_without_a_producers_batches_leaves_its_state_alone() -> None:
    owned = partition()
    owned.append(b"x" * 600, header(1))
    owned.append(b"x" * 600, header(1, producer_id=7, first_seq=0))  # starts the next segment
    work = owned.take_flush_work(SEGMENT, whole_segments_only=True)
    assert work is not None and work.producers == {}  # producer 7's batch is still buffered
    rest = owned.take_flush_work(SEGMENT)
    assert rest is not None and rest.producers == {7: (ProducerState(0, 0, 0, 101),)}


async def test_a_retry_of_a_batch_on_its_way_is_answered_when_the_first_attempt_is() -> None:
    """The first attempt timed out while its upload was slow; the producer's retry must not be
    acked before the data is durable, and gets the first attempt's offset and append time."""
    owned = partition()
    first = owned.append(b"x" * 400, header(2, producer_id=7, first_seq=0), append_time=1234)
    retry = owned.append(b"x" * 400, header(2, producer_id=7, first_seq=0), append_time=5678)
    await asyncio.sleep(0)
    assert not retry.done()
    assert [b.base_offset for b in owned.pending] == [100]  # stored once
    first.set_result(Ack(100, 1234))  # what the flusher does once the round committed
    assert await retry == Ack(100, 1234)
    await asyncio.sleep(0)
    assert owned.unacked == {}  # forgotten once durable


async def test_a_retry_fails_with_its_first_attempt() -> None:
    owned = partition()
    owned.append(b"x" * 400, header(1, producer_id=7, first_seq=0))
    retry = owned.append(b"x" * 400, header(1, producer_id=7, first_seq=0))
    owned.fail_everything(StorageFailure("segment upload failed"))
    with pytest.raises(StorageFailure):
        await retry


async def test_cancelling_a_retry_leaves_the_first_attempt_alone() -> None:
    owned = partition()
    first = owned.append(b"x" * 400, header(1, producer_id=7, first_seq=0))
    owned.append(b"x" * 400, header(1, producer_id=7, first_seq=0)).cancel()
    await asyncio.sleep(0)
    assert not first.done()


async def test_a_retry_of_a_committed_batch_is_answered_at_once_as_the_first_was() -> None:
    """After a failover the new owner knows the batch only from the committed state."""
    state = PartitionState(
        high_watermark=102,
        leader_epoch=3,
        epochs=((3, 100),),
        producers={7: (ProducerState(0, 0, 1, 100, append_time=1234),)},
    )
    owned = OwnedPartition("t", 0, "id", state, state_revision=1, lease_revision=1)
    retry = owned.append(b"x" * 400, header(2, producer_id=7, first_seq=0), append_time=5678)
    assert retry.done() and retry.result() == Ack(100, 1234)
    assert owned.pending == []
