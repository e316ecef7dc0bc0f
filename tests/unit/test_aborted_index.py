"""Aborted transactions beyond the state's bound: spilled to index objects, never lost.

The pure decisions (``metadata.aborted_index``: spilling, range look-up, trimming at the log
start), the object format, the look-up against a real local-directory store (what it GETs and
caches), and the flush writing the object before the commit that references it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from harness.batches import make_batch
from harness.stores import CountingStore
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import (
    MAX_TXNS_PER_OBJECT,
    absorb_newest,
    dropped_refs,
    orphaned_indexes,
    overlapping,
    refs_in_range,
    spill_aborted,
)
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd_txn import PutOp, TxnResult
from kafscale.broker.metadata.partition_state import (
    AbortedTxn,
    PartitionState,
    TxnIndexRef,
    advance_log_start,
)
from kafscale.broker.metadata.partition_txns import TxnBegin, TxnEnd, apply_txn_events
from kafscale.broker.protocol.errors import StorageFailure
from kafscale.broker.protocol.record_batch import read_header
from kafscale.broker.storage.aborted_index import (
    AbortedIndexCorrupt,
    aborted_in_range,
    decode_aborted_index,
    encode_aborted_index,
    object_key,
)
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.flush_schedule import RoundPolicy
from kafscale.broker.storage.flusher import Flusher, FlushWork
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.partition_log import OwnedPartition

pytestmark = pytest.mark.unit

WHERE = ("t", "tid", 0)


def aborts(count: int, start: int = 0) -> tuple[AbortedTxn, ...]:
    """``count`` aborted transactions of two records and a marker each, from ``start``."""
    return tuple(AbortedTxn(100 + i, start + 3 * i, start + 3 * i + 2) for i in range(count))


# --- pure decisions -----------------------------------------------------------------------------


def test_apply_txn_events_keeps_every_abort_for_the_flush_to_spill() -> None:
    events = [
        event
        for pid in range(600)
        for event in (TxnBegin(pid, 2 * pid), TxnEnd(pid, False, 2 * pid + 1, 0))
    ]
    state = apply_txn_events(PartitionState(high_watermark=1200), events)
    assert len(state.aborted_txns) == 600  # main dropped all but the newest 512 here


def test_nothing_spills_up_to_the_limit() -> None:
    state = PartitionState(high_watermark=100, aborted_txns=aborts(8))
    assert spill_aborted(state, 8) == (state, None)


def test_beyond_the_limit_all_but_the_newest_half_spill_to_one_object() -> None:
    state = PartitionState(high_watermark=100, leader_epoch=3, aborted_txns=aborts(9))
    after, spill = spill_aborted(state, 8)
    assert spill is not None
    assert spill.entries == aborts(9)[:5]
    assert after.aborted_txns == aborts(9)[5:]
    assert spill.ref == TxnIndexRef(first_offset=0, last_offset=14, epoch=3, txn_count=5)
    assert after.aborted_txn_index == (spill.ref,)
    # The next spill absorbs that object: it holds no more transactions than the spill.
    again, second = spill_aborted(replace(after, aborted_txns=aborts(9, start=30)), 8)
    assert second is not None
    assert second.absorbed == (spill.ref,)
    assert again.aborted_txn_index == (second.ref,)
    assert second.ref == TxnIndexRef(first_offset=0, last_offset=44, epoch=3, txn_count=10)


def test_references_stay_logarithmic_in_the_aborts_and_objects_stay_capped() -> None:
    refs: tuple[TxnIndexRef, ...] = ()
    for i in range(1000):  # 1000 spills of 256
        refs, absorbed = absorb_newest(refs, 256)
        count = 256 + sum(r.txn_count for r in absorbed)
        refs = (*refs, TxnIndexRef(i, i, 0, count))
    assert sum(r.txn_count for r in refs) == 256_000
    assert len(refs) <= 12  # one per set bit of 1000, and the 64 Ki cap
    assert max(r.txn_count for r in refs) <= MAX_TXNS_PER_OBJECT
    assert [r.txn_count for r in refs] == sorted((r.txn_count for r in refs), reverse=True)
    for _ in range(2000):  # far more: past the cap, one reference per 64 Ki aborts
        refs, absorbed = absorb_newest(refs, 256)
        refs = (*refs, TxnIndexRef(0, 0, 0, 256 + sum(r.txn_count for r in absorbed)))
    assert len(refs) <= 768_000 // MAX_TXNS_PER_OBJECT + 9


def test_a_spilled_object_is_looked_up_only_for_ranges_it_overlaps() -> None:
    ref = TxnIndexRef(first_offset=10, last_offset=40, epoch=0, txn_count=4)
    state = PartitionState(high_watermark=100, aborted_txn_index=(ref,))
    assert refs_in_range(state, 41, 100) == []  # recent data: no GET
    assert refs_in_range(state, 40, 100) == [ref]  # its last marker is in range
    assert refs_in_range(state, 0, 10) == []  # everything before its first offset
    assert refs_in_range(state, 0, 11) == [ref]


def test_the_log_start_drops_references_it_passed() -> None:
    old = TxnIndexRef(0, 20, 0, 5)
    new = TxnIndexRef(21, 50, 1, 5)
    state = PartitionState(high_watermark=100, aborted_txn_index=(old, new))
    assert advance_log_start(state, 20).aborted_txn_index == (old, new)  # marker 20 still read
    moved = advance_log_start(state, 21)
    assert moved.aborted_txn_index == (new,)
    assert dropped_refs(state, moved) == [old]
    assert dropped_refs(moved, moved) == []


def test_a_document_without_the_index_field_loads_and_one_with_it_round_trips() -> None:
    old = b'{"high_watermark": 9, "aborted_txns": [[4, 1, 3]]}'
    assert PartitionState.from_json(old).aborted_txn_index == ()
    state = PartitionState(high_watermark=9, aborted_txn_index=(TxnIndexRef(1, 5, 2, 7),))
    assert PartitionState.from_json(state.to_json()) == state
    assert b"aborted_txn_index" not in PartitionState(high_watermark=9).to_json()


@given(st.lists(st.tuples(*[st.integers(0, 2**62)] * 3).map(lambda t: AbortedTxn(*t))))
def test_the_object_format_round_trips(entries: list[AbortedTxn]) -> None:
    assert decode_aborted_index(encode_aborted_index(entries)) == entries


def test_a_damaged_object_is_refused() -> None:
    data = encode_aborted_index(list(aborts(3)))
    for bad in (data[:-1], b"XTX\0" + data[4:], data[:20] + b"\xff" + data[21:]):
        with pytest.raises(AbortedIndexCorrupt):
            decode_aborted_index(bad)


# --- the look-up against a real store ------------------------------------------------------------


class GetCountingStore(CountingStore):
    gets = 0

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        self.gets += 1
        return await super().get(key, start=start, end=end)


async def test_a_range_lists_the_spilled_and_the_state_entries_and_objects_are_cached(
    tmp_path: Path,
) -> None:
    store = GetCountingStore(tmp_path)
    cache = SegmentCache(1 << 20)
    state, spill = spill_aborted(PartitionState(high_watermark=100, aborted_txns=aborts(20)), 8)
    assert spill is not None
    await store.put(object_key("c", *WHERE, spill.ref), encode_aborted_index(spill.entries))

    every = await aborted_in_range(store, cache, "c", WHERE, state, 0, 100)
    assert every == list(aborts(20))
    assert store.gets == 1
    assert await aborted_in_range(store, cache, "c", WHERE, state, 5, 8) == overlapping(
        aborts(20), 5, 8
    )
    assert store.gets == 1  # immutable: cached
    fresh = GetCountingStore(tmp_path)
    recent = await aborted_in_range(fresh, SegmentCache(1 << 20), "c", WHERE, state, 50, 100)
    assert recent == list(aborts(20)[16:])
    assert fresh.gets == 0  # the hot path reads no object


async def test_a_missing_object_is_a_storage_error_not_a_silent_omission(tmp_path: Path) -> None:
    state, _ = spill_aborted(PartitionState(high_watermark=100, aborted_txns=aborts(20)), 8)
    with pytest.raises(StorageFailure):
        await aborted_in_range(
            CountingStore(tmp_path), SegmentCache(1 << 20), "c", WHERE, state, 0, 100
        )


# --- the flush ---------------------------------------------------------------------------------


class RecordingStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> None:
        self.objects[key] = bytes(data)

    async def delete_many(self, keys_: list[str]) -> None:
        for key in keys_:
            self.objects.pop(key, None)

    async def list(self, prefix: str, **_: Any) -> list[ObjectInfo]:
        return []

    def indexes(self) -> list[str]:
        return sorted(key for key in self.objects if key.endswith(".atx"))


class RecordingEtcd:
    def __init__(self, store: RecordingStore) -> None:
        self.store = store
        self.states: list[PartitionState] = []
        self.objects_at_commit: list[set[str]] = []

    async def txn(self, compares: list[Any], success: list[Any]) -> TxnResult:
        self.objects_at_commit.append(set(self.store.objects))
        self.states += [
            PartitionState.from_json(op.value) for op in success if isinstance(op, PutOp)
        ]
        return TxnResult(True, 10 + len(self.states), [])


def give_up(owned: OwnedPartition, error: BaseException, flushing: list[FlushWork]) -> None:
    owned.fail_everything(error)


async def test_the_flush_writes_the_spilled_object_before_the_commit_that_references_it() -> None:
    store = RecordingStore()
    etcd = RecordingEtcd(store)
    state = PartitionState(high_watermark=0, leader_epoch=2, epochs=((2, 0),))
    owned = OwnedPartition("t", 0, "tid", state, state_revision=5, lease_revision=3)
    cluster: Any = None
    policy = RoundPolicy(
        min_interval_s=0.0, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4, max_uploading=2
    )
    flusher = Flusher(
        LogSettings(aborted_txns_in_state=4),
        "c",
        1,
        etcd,  # type: ignore[arg-type]
        ClusterView(cluster, "c"),
        store,  # type: ignore[arg-type]
        SegmentCache(1 << 20),
        {owned.tp: owned},
        give_up,
        policy,
    )
    loop = asyncio.create_task(flusher.run())
    try:
        for pid in range(1, 11):  # ten aborted transactions, one record each
            batch = make_batch(
                0, [b"x"], attributes=0x10, producer_id=pid, producer_epoch=0, base_sequence=0
            )
            acked = owned.append(batch, read_header(batch))
            marker = owned.append_marker(pid, 0, commit=False, coordinator_epoch=0, now_ms=0)
            assert marker is not None
            flusher.data_appended(segment_full=False)
            await asyncio.wait_for(asyncio.gather(acked, marker), 10)
        async with asyncio.timeout(10):  # the absorbed object is deleted after the commit
            while len(store.indexes()) > len(etcd.states[-1].aborted_txn_index):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    final = etcd.states[-1]
    assert len(final.aborted_txns) <= 4
    # Spills of three at the 5th and the 8th abort: the second absorbed the first.
    assert [(r.txn_count, r.epoch) for r in final.aborted_txn_index] == [(6, 2)]
    assert len({key for s in etcd.states for key in _keys_of(s)}) == 2
    keys_ = _keys_of(final)
    assert store.indexes() == keys_
    for key in keys_:  # durable before any state referenced it
        first_with_ref = next(i for i, s in enumerate(etcd.states) if key in _keys_of(s))
        assert key in etcd.objects_at_commit[first_with_ref]
    spilled = [t for key in keys_ for t in decode_aborted_index(store.objects[key])]
    assert [t.producer_id for t in (*spilled, *final.aborted_txns)] == list(range(1, 11))


def _keys_of(state: PartitionState) -> list[str]:
    return [object_key("c", "t", "tid", 0, ref) for ref in state.aborted_txn_index]


@given(
    limit=st.integers(2, 12),
    steps=st.lists(st.one_of(st.integers(1, 6), st.just(0)), max_size=80),
    start=st.integers(0, 600),
    width=st.integers(0, 600),
)
def test_no_abort_is_lost_however_spills_absorb_and_the_log_start_moves(
    limit: int, steps: list[int], start: int, width: int
) -> None:
    """A model of the owner: each step aborts ``n`` transactions and flushes (spilling as the
    flush does, objects written with their absorbed objects' entries), or (0) moves the log
    start up. Every range lists exactly the aborts a full list would."""
    state = PartitionState(high_watermark=0)
    objects: dict[TxnIndexRef, list[AbortedTxn]] = {}
    every: list[AbortedTxn] = []
    offset = 0
    for n in steps:
        if n == 0:
            before = state
            state = advance_log_start(state, (state.log_start_offset + state.high_watermark) // 2)
            for ref in dropped_refs(before, state):
                del objects[ref]
            continue
        events: list[TxnBegin | TxnEnd] = []
        for _ in range(n):
            pid = len(every)
            every.append(AbortedTxn(pid, offset, offset + 2))
            events += [TxnBegin(pid, offset), TxnEnd(pid, False, offset + 2, 0)]
            offset += 3
        state = apply_txn_events(replace(state, high_watermark=offset), events)
        state, spill = spill_aborted(state, limit)
        if spill is not None:
            absorbed = [t for ref in spill.absorbed for t in objects.pop(ref)]
            objects[spill.ref] = [*absorbed, *spill.entries]
        assert len(state.aborted_txns) <= limit
        assert sorted(objects) == sorted(state.aborted_txn_index)
    low = max(start, state.log_start_offset)
    high = low + width
    listed = [
        t for ref in refs_in_range(state, low, high) for t in overlapping(objects[ref], low, high)
    ] + overlapping(state.aborted_txns, low, high)
    assert listed == overlapping(every, low, high)


def test_only_unreferenced_objects_of_older_epochs_are_orphans() -> None:
    kept = TxnIndexRef(0, 20, 1, 5)
    state = PartitionState(high_watermark=100, leader_epoch=3, aborted_txn_index=(kept,))
    listed = [(0, 20, 1), (21, 40, 2), (21, 40, 3), (41, 60, 4)]
    # (21, 40, 3): the owner's own, maybe on its way to a commit; epoch 4 is not older either.
    assert orphaned_indexes(state, listed, owner_epoch=3) == [(21, 40, 2)]


def test_index_object_names_parse_back() -> None:
    ref = TxnIndexRef(12, 3456, 7, 9)
    key = object_key("c", "t", "tid", 0, ref)
    assert key.startswith(keys.aborted_index_prefix("c", "t", "tid", 0))
    assert keys.parse_aborted_index_name(key) == (12, 3456, 7)
    assert keys.parse_aborted_index_name("c/topics/t/tid/0/00000000000000000012-e7.kfs") is None


def test_the_spark_drivers_index_cache_is_bounded_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kafscale.pipeline import catalog

    monkeypatch.setattr(catalog, "MAX_CACHED_INDEX_BYTES", 100)
    cache = catalog._IndexCache()
    for name in "abc":
        cache.put(name, b"x" * 40)
    assert cache.get("a") is None  # the oldest went once 120 bytes were held
    assert cache.get("b") == cache.get("c") == b"x" * 40
    cache.put("huge", b"y" * 500)  # a single larger object is still kept
    assert cache.get("huge") is not None and cache.get("b") is None
