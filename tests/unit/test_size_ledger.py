"""The size ledger (``broker/storage/size_ledger.py``): ``retention.bytes`` decided from the
segments committed since the last check, the same as from a listing of the whole partition."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from harness.stores import CountingStore
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.storage.janitor import list_committed_since
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.retention import SegmentFacts, decide_log_start, deletable_bases
from kafscale.broker.storage.size_ledger import SizeLedger

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


@given(periods, st.integers(0, 20_000))
def test_the_ledger_decides_as_a_whole_listing_would(
    history: list[tuple[list[tuple[int, int]], list[tuple[int, int]], int, int]],
    retention_bytes: int,
) -> None:
    """At every check: the log start decided from a head of the listing plus the ledger is the
    one decided from every committed segment; segments wholly below the log start are then
    deleted, and uploads in flight land (committed) before the next check."""
    stored: dict[int, int] = {}  # base -> size: the partition's segment objects
    high_watermark = log_start = 0
    ledger = SizeLedger(PREFIX, 0)
    for committed, uploading, delete_to, head_size in history:
        for records, size in committed:
            stored[high_watermark] = size
            high_watermark += records
        landing = high_watermark
        for records, size in uploading:  # uploaded, not committed yet: base >= high watermark
            stored[landing] = size
            landing += records
        log_start = max(log_start, min(log_start + delete_to, high_watermark))

        listing = {b: s for b, s in stored.items() if b >= ledger.listed_below}
        ledger.add(((b, s) for b, s in listing.items() if b < high_watermark), high_watermark)
        everything = [SegmentFacts(b, s, -1) for b, s in sorted(stored.items())]
        everything = [f for f in everything if f.base < high_watermark]
        head = everything[:head_size]  # the janitor's listing from the oldest, a page or so
        limits = (high_watermark, log_start, NOW, -1, retention_bytes)
        log_start = decide_log_start(everything, *limits)
        assert decide_log_start(ledger.facts(head, -1), *limits) == log_start

        ledger.trim(log_start)
        for base in deletable_bases([f.base for f in everything], log_start):
            del stored[base]
        assert list(ledger.bases) == sorted(b for b in stored if b < high_watermark)
        high_watermark = landing  # the uploads in flight are committed now


def test_trim_keeps_the_segment_holding_the_log_start() -> None:
    ledger = SizeLedger(PREFIX, 0)
    ledger.add([(0, 10), (10, 20), (20, 30)], 30)
    ledger.trim(15)
    assert (list(ledger.bases), list(ledger.sizes)) == ([10, 20], [20, 30])
    ledger.trim(30)  # at the high watermark: the last segment still stays
    assert list(ledger.bases) == [20]


def test_later_segments_carry_the_time_where_time_retention_stopped() -> None:
    ledger = SizeLedger(PREFIX, 0)
    ledger.add([(0, 10), (10, 20), (20, 30)], 30)
    head = [SegmentFacts(0, 10, NOW - 50)]
    assert ledger.facts(head, NOW - 50) == [
        SegmentFacts(0, 10, NOW - 50),
        SegmentFacts(10, 20, NOW - 50),
        SegmentFacts(20, 30, NOW - 50),
    ]


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
    assert list(ledger.bases) == list(range(0, 100, 10))
    assert set(ledger.sizes) == {len(b"segment")}

    put(110, 1)
    committed = PartitionState(high_watermark=120, leader_epoch=1, epochs=((0, 0), (1, 100)))
    asyncio.run(list_committed_since(store, PREFIX, committed, ledger))
    assert store.starts == [keys.objects_from(PREFIX, 0), keys.objects_from(PREFIX, 100)]
    assert list(ledger.bases) == [*range(0, 100, 10), 100, 110]
    assert ledger.sizes[-2] == len(b"in flight")
    assert (ledger.listed_below, store.lists) == (120, 2)
