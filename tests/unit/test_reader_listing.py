"""Reading older data lists only a window of the partition's objects, from the highest time mark
below the offset, never the whole partition (a week of 100 ms segments is millions of keys)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from harness.batches import make_batch
from harness.stores import CountingStore

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState, SegmentRef
from kafscale.broker.protocol.record_batch import iter_batch_headers
from kafscale.broker.storage import reader as reader_module
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.reader import LogReader
from kafscale.broker.storage.segments import encode_segment

pytestmark = pytest.mark.unit

SEGMENTS, RECORDS = 40, 10  # segment n holds offsets 10n .. 10n+9


def stored_partition(root: Path, partition: int = 0) -> tuple[CountingStore, list[SegmentRef]]:
    store = CountingStore(root)
    refs = []
    for n in range(SEGMENTS):
        base = RECORDS * n
        batch = make_batch(base, [b"v%d" % (base + i) for i in range(RECORDS)])
        encoded = encode_segment([batch], 1_700_000_000_000 + n, 4096)
        key = keys.segment_object_key("c", "t", "id", partition, base, 0)
        asyncio.run(store.put(key, encoded.segment))
        refs.append(SegmentRef(base, base + RECORDS - 1, 0, len(encoded.segment), 1))
    return store, refs


def read_first_offset(store: CountingStore, state: PartitionState, offset: int) -> int:
    reader = LogReader("c", store, SegmentCache(0), list_page=3)
    data = asyncio.run(reader.read("t", "id", 0, state, offset, 100))
    asyncio.run(reader.close())
    return next(iter_batch_headers(data))[1].base_offset


@pytest.mark.parametrize("offset", [0, 155, 259, 299])
def test_an_old_offset_is_found_from_the_time_mark_below_it(tmp_path: Path, offset: int) -> None:
    store, refs = stored_partition(tmp_path)
    marks = ((100, 1), (200, 1), (300, 1))
    state = PartitionState(
        high_watermark=SEGMENTS * RECORDS,
        leader_epoch=0,
        epochs=((0, 0),),
        segments=tuple(refs[-2:]),  # only the newest two are named in the state
        time_marks=marks,
    )
    assert read_first_offset(store, state, offset) == offset - offset % RECORDS
    mark = max((m for m, _ in marks if m <= offset), default=0)
    # pages of three keys from the mark (or the first object) until the page that holds the
    # segment after the offset's
    assert store.lists == ((offset - mark) // RECORDS + 1) // 3 + 1


def test_without_time_marks_the_listing_starts_at_the_first_object(tmp_path: Path) -> None:
    store, refs = stored_partition(tmp_path)
    state = PartitionState(
        high_watermark=SEGMENTS * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[-1],)
    )
    assert read_first_offset(store, state, 259) == 250
    assert store.lists == (259 // RECORDS + 1) // 3 + 1  # still stops after the offset
    store.lists = 0
    assert read_first_offset(store, state, 389) == 380  # up to the newest: the last page
    assert store.lists == SEGMENTS // 3 + 1


def test_a_consumer_reading_on_continues_the_listing(tmp_path: Path) -> None:
    """Sequential reads through old data: each new window is listed from where the last one
    ended, so the listing calls grow with the segments read, not with their square."""
    store, refs = stored_partition(tmp_path)
    state = PartitionState(
        high_watermark=SEGMENTS * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[-1],)
    )
    reader = LogReader("c", store, SegmentCache(0), list_page=3)
    offset, seen = 0, []
    while offset < (SEGMENTS - 1) * RECORDS:
        data = asyncio.run(reader.read("t", "id", 0, state, offset, 100))
        headers = [header for _, header in iter_batch_headers(data)]
        seen += [h.base_offset for h in headers]
        offset = headers[-1].last_offset + 1
    asyncio.run(reader.close())
    assert seen == [RECORDS * n for n in range(SEGMENTS - 1)]
    # 39 segments in pages of three, each page listed about once (a page overlaps the last)
    assert store.lists <= 2 * (SEGMENTS // 3 + 1), store.lists


def test_listing_windows_are_kept_for_the_most_recently_read_partitions_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "MAX_LISTINGS", 1)
    store, refs = stored_partition(tmp_path, 0)
    stored_partition(tmp_path, 1)
    state = PartitionState(
        high_watermark=SEGMENTS * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[-1],)
    )
    reader = LogReader("c", store, SegmentCache(0), list_page=100)

    def lists_to_read(partition: int) -> int:
        before = store.lists
        asyncio.run(reader.read("t", "id", partition, state, 5, 100))
        return store.lists - before

    assert lists_to_read(0) == 1
    assert lists_to_read(0) == 0  # its window is kept
    assert lists_to_read(1) == 1  # and now dropped for this one's
    assert lists_to_read(0) == 1
    asyncio.run(reader.close())


def test_a_complete_listing_says_nothing_of_segments_committed_after_it(tmp_path: Path) -> None:
    """Issue 29: a window listed to the partition's end, then more segments committed than the
    state names: the records past the old end are read (by listing again), not lost."""
    store, refs = stored_partition(tmp_path)
    reader = LogReader("c", store, SegmentCache(0), list_page=100)
    half = SEGMENTS // 2
    early = PartitionState(
        high_watermark=half * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[half - 1],)
    )
    asyncio.run(reader.read("t", "id", 0, early, 5, 100))  # lists [0, half) as complete
    later = PartitionState(
        high_watermark=SEGMENTS * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[-1],)
    )
    for offset in (half * RECORDS, half * RECORDS + 15, (SEGMENTS - 2) * RECORDS):
        data = asyncio.run(reader.read("t", "id", 0, later, offset, 100))
        assert next(iter_batch_headers(data))[1].base_offset == offset - offset % RECORDS
    asyncio.run(reader.close())


def test_one_read_fills_its_budget_across_segments(tmp_path: Path) -> None:
    store, refs = stored_partition(tmp_path)
    state = PartitionState(
        high_watermark=SEGMENTS * RECORDS, leader_epoch=0, epochs=((0, 0),), segments=(refs[-1],)
    )
    reader = LogReader("c", store, SegmentCache(1 << 20), list_page=7)
    data = asyncio.run(reader.read("t", "id", 0, state, 15, 1 << 20))
    bases = [header.base_offset for _, header in iter_batch_headers(data)]
    assert bases == [RECORDS * n for n in range(1, SEGMENTS)]
    one_batch = len(asyncio.run(reader.read("t", "id", 0, state, 15, 1)))
    few = asyncio.run(reader.read("t", "id", 0, state, 15, 3 * one_batch + 10))
    assert [h.base_offset for _, h in iter_batch_headers(few)] == [10, 20, 30]
    assert asyncio.run(reader.read("t", "id", 0, state, 15, 1, min_one=False)) == b""
    asyncio.run(reader.close())
