"""The size ledger (``broker/storage/size_ledger.py``): ``retention.bytes`` decided from the
segments committed since the last check, the same as from a listing of the whole partition."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from harness.stores import CountingStore
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.storage.janitor import KEEP, list_committed_since
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.retention import SegmentFacts, decide_log_start, deletable_bases
from kafscale.broker.storage.size_ledger import ListRange, SizeLedger

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000
PREFIX = keys.partition_object_prefix("c", "t", "id", 0)

# A partition's life between retention checks: segments committed (records, bytes), uploads
# still in flight at a check (records, bytes), a DeleteRecords moving the log start.
commits = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 3000)), max_size=6)
in_flight = st.lists(st.tuples(st.integers(1, 50), st.integers(1, 3000)), max_size=2)
periods = st.lists(
    st.tuples(commits, in_flight, st.integers(0, 100), st.integers(0, 3)), min_size=1, max_size=8
)


def bytes_start(
    ledger: SizeLedger, stored: dict[int, int], high_watermark: int, start: int, limit: int
) -> int:
    """The ledger's ``retention.bytes`` cut, listing from ``stored`` what it asks for (as the
    janitor's ``fill_ledger`` lists it from the object store)."""
    while isinstance(cut := ledger.bytes_start(limit, high_watermark, start), ListRange):
        ledger.fill(cut, listed(stored, high_watermark, cut))
    return cut


def listed(stored: dict[int, int], below: int, wanted: ListRange) -> list[tuple[int, int]]:
    """The committed segments of ``wanted``'s range."""
    end = below if wanted.end is None else min(below, wanted.end)
    return [(b, s) for b, s in sorted(stored.items()) if wanted.start <= b < end]


@given(
    periods,
    st.integers(0, 20_000),
    st.sampled_from([1, 2, 3, 4096]),
    st.sampled_from([-1, 0, 50, 150]),
)
def test_the_ledger_decides_as_a_whole_listing_would(
    history: list[tuple[list[tuple[int, int]], list[tuple[int, int]], int, int]],
    retention_bytes: int,
    block_segments: int,
    retention_ms: int,
) -> None:
    """At every check: the log start decided from a head of the listing plus the ledger is the
    one decided from every committed segment; segments wholly below the log start are then
    deleted, and uploads in flight land (committed) before the next check. Small blocks make
    the ledger give sizes up and list a block again where a cut falls. With time retention
    too, the two cuts taken apart give what the janitor decided from the head and every later
    segment carrying the head's last creation time (``decide_log_start`` over all of them)."""
    stored: dict[int, int] = {}  # base -> size: the partition's segment objects
    created: dict[int, int] = {}  # base -> creation time, 100 ms a check
    high_watermark = log_start = 0
    ledger = SizeLedger(PREFIX, 0, block_segments)
    for committed, uploading, delete_to, head_size in history:
        for records, size in committed:
            stored[high_watermark] = size
            created[high_watermark] = NOW + 100 * len(created)
            high_watermark += records
        landing = high_watermark
        for records, size in uploading:  # uploaded, not committed yet: base >= high watermark
            stored[landing] = size
            landing += records
        log_start = max(log_start, min(log_start + delete_to, high_watermark))

        listing = {b: s for b, s in stored.items() if b >= ledger.listed_below}
        ledger.add(((b, s) for b, s in listing.items() if b < high_watermark), high_watermark)
        now_ms = NOW + 100 * len(created)
        everything = [SegmentFacts(b, s, created.get(b, now_ms)) for b, s in sorted(stored.items())]
        everything = [f for f in everything if f.base < high_watermark]
        head = everything[:head_size]  # the janitor's listing from the oldest, a page or so
        later_ms = head[-1].created_at_ms if head else KEEP
        as_before = head + [replace(f, created_at_ms=later_ms) for f in everything[head_size:]]
        limits = (high_watermark, log_start, now_ms, retention_ms)
        expected = decide_log_start(as_before, *limits, retention_bytes)
        if retention_ms < 0:
            assert decide_log_start(everything, *limits, retention_bytes) == expected
        by_time = decide_log_start(head, *limits, -1)
        cut = bytes_start(ledger, stored, high_watermark, log_start, retention_bytes)
        assert max(by_time, min(cut, high_watermark)) == expected
        log_start = expected

        while (wanted := ledger.trim(log_start)) is not None:
            ledger.fill(wanted, listed(stored, high_watermark, wanted))
        for base in deletable_bases([f.base for f in everything], log_start):
            del stored[base]
        kept = sorted((b, s) for b, s in stored.items() if b < high_watermark)
        assert ledger.blocks.total == sum(s for _, s in kept)
        assert ledger.first_base == (kept[0][0] if kept else None)
        assert set(ledger.segments()) <= set(kept)
        high_watermark = landing  # the uploads in flight are committed now


def test_trim_keeps_the_segment_holding_the_log_start() -> None:
    ledger = SizeLedger(PREFIX, 0)
    ledger.add([(0, 10), (10, 20), (20, 30)], 30)
    ledger.trim(15)
    assert list(ledger.segments()) == [(10, 20), (20, 30)]
    ledger.trim(30)  # at the high watermark: the last segment still stays
    assert list(ledger.segments()) == [(20, 30)]


def test_retention_bytes_cuts_where_the_bytes_after_first_fit() -> None:
    ledger = SizeLedger(PREFIX, 0)
    assert ledger.bytes_start(0, 30, 7) == 7  # nothing seen: nothing expires
    ledger.add([(0, 10), (10, 20), (20, 30)], 30)
    cuts = [ledger.bytes_start(limit, 30, 0) for limit in (60, 59, 50, 30, 29, 0)]
    assert cuts == [0, 10, 10, 20, 30, 30]


def test_memory_stays_bounded_and_a_cut_lists_one_block() -> None:
    """A long partition of small segments: the ledger holds the sizes of two blocks, not of
    every segment; a ``retention.bytes`` cut deep in the log, and a trim into a block that
    gave its sizes up, each ask for one block's range to be listed."""
    segments, block = 100_000, 1000
    ledger = SizeLedger(PREFIX, 0, block_segments=block)
    ledger.add(((base, 100) for base in range(segments)), segments)
    assert ledger.blocks.total == 100 * segments
    assert ledger.kept_segments() <= 2 * block
    assert len(ledger.blocks.blocks) == segments // block
    keep_bytes = 100 * 30_500  # the last 30,500 segments: the cut falls inside a block
    wanted = ledger.bytes_start(keep_bytes, segments, 0)
    assert wanted == ListRange(69, 69_000, 70_000)
    ledger.fill(wanted, ((base, 100) for base in range(69_000, 70_000)))
    assert ledger.bytes_start(keep_bytes, segments, 0) == 69_500
    assert ledger.trim(69_500) is None  # its block is exact now: no listing
    assert ledger.first_base == 69_500
    assert ledger.blocks.total == keep_bytes
    assert ledger.kept_segments() <= 3 * block  # the refilled block, the first, the last
    assert ledger.trim(85_250) == ListRange(0, 85_000, 86_000)  # time retention moved on


class StartAfterStore(CountingStore):
    """Remembers where each listing started."""

    starts: list[str | None]

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.starts.append(start_after)
        return await super().list(prefix, start_after=start_after, limit=limit)


def test_a_check_lists_only_from_the_last_high_watermark(tmp_path: Path) -> None:
    """Ten committed segments, one upload in flight and a fenced writer's orphan: the first
    listing takes the committed ten; the next lists from the old high watermark only and finds
    what was committed since, the upload once it is committed, never the orphan."""
    store = StartAfterStore(tmp_path)
    store.starts = []

    def put(base: int, epoch: int, body: bytes = b"segment") -> None:
        asyncio.run(store.put(keys.segment_object_key("c", "t", "id", 0, base, epoch), body))

    for base in range(0, 100, 10):
        put(base, 0)
    put(100, 1, b"in flight")
    put(50, 1, b"fenced")  # epoch 1 began at 100: its writer's upload at 50 never counts
    state = PartitionState(high_watermark=100, leader_epoch=1, epochs=((0, 0), (1, 100)))
    ledger = SizeLedger(PREFIX, 1)

    asyncio.run(list_committed_since(store, PREFIX, state, ledger))
    assert list(ledger.segments()) == [(base, len(b"segment")) for base in range(0, 100, 10)]

    put(110, 1)
    committed = PartitionState(high_watermark=120, leader_epoch=1, epochs=((0, 0), (1, 100)))
    asyncio.run(list_committed_since(store, PREFIX, committed, ledger))
    assert store.starts == [keys.objects_from(PREFIX, 0), keys.objects_from(PREFIX, 100)]
    assert [base for base, _ in ledger.segments()] == [*range(0, 100, 10), 100, 110]
    assert list(ledger.segments())[-2] == (100, len(b"in flight"))
    assert (ledger.listed_below, store.lists) == (120, 2)
