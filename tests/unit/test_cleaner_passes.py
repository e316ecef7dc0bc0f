"""The cleaner's passes on a real local-directory store (``storage.cleaner``): what a pass that
failed part-way leaves behind must not stop or corrupt the passes after it.

The etcd commit is a small stand-in here (``Manager``: the integration tests in
``tests/integration/test_log_cleaner.py`` commit through etcd); it can refuse a commit the way
``LogManager.commit_cleaned`` does when etcd does not answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from harness.compaction_batches import read_with_kafka_python

from kafscale.broker.api.fetch import _read_records, _Wanted
from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.partition_state import (
    Cleaned,
    PartitionState,
    SegmentRef,
    advance_log_start,
    commit_segment,
)
from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.protocol.errors import ObjectGone
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.cleaner import Cleaner, CleanerError, cleaned_inputs, plain_inputs
from kafscale.broker.storage.janitor import Janitor
from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.log_sizes import LogSizes
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.reader import LogReader
from kafscale.broker.storage.segments import decode_segment, encode_segment

pytestmark = pytest.mark.unit

CLUSTER, TOPIC, TOPIC_ID = "c", "changelog", "0" * 32
EPOCH = 3


class Manager:
    """The owned partition and a commit applied in memory; ``refuse`` commits refused first
    (as ``LogManager.commit_cleaned`` answers when etcd did not answer)."""

    def __init__(self, owned: OwnedPartition, refuse: int = 0) -> None:
        self.owned = {owned.tp: owned}
        self.refuse = refuse

    async def commit_cleaned(
        self, owned: OwnedPartition, cleaned: Cleaned, was: Any, last_removed_abort: int = -1
    ) -> bool:
        if self.refuse > 0:
            self.refuse -= 1
            return False
        owned.state = replace(owned.state, cleaned=cleaned)
        return True


class View:
    def __init__(self, **configs: str) -> None:
        config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", **configs}
        self.topics = {TOPIC: TopicInfo(TOPIC, TOPIC_ID, 1, config)}


async def append_segment(
    store: LocalDirObjectStore, owned: OwnedPartition, records: list[tuple[bytes, bytes]]
) -> None:
    base = owned.state.high_watermark
    body = b"".join(encode_record(i, 0, k, v) for i, (k, v) in enumerate(records))
    batch = encode_batch(body, len(records), base_timestamp=1, max_timestamp=1, base_offset=base)
    data = encode_segment([batch], int(time.time() * 1000), 4096).segment
    await store.put(keys.segment_object_key(CLUSTER, TOPIC, TOPIC_ID, 0, base, EPOCH), data)
    ref = SegmentRef(base, base + len(records) - 1, EPOCH, len(data), 1)
    owned.state = commit_segment(owned.state, ref, {})
    owned.state_revision += 1  # as a flush commit moves it


def new_partition() -> OwnedPartition:
    state = PartitionState(leader_epoch=EPOCH, epochs=((EPOCH, 0),))
    return OwnedPartition(TOPIC, 0, TOPIC_ID, state, 1, 1)


async def cleaned_records(store: LocalDirObjectStore, cleaned: Cleaned) -> list[tuple[int, bytes]]:
    """Offsets and keys in the committed generation's objects, read as a broker reader does."""
    prefix = keys.cleaned_pass_prefix(
        CLUSTER, TOPIC, TOPIC_ID, 0, cleaned.generation, cleaned.epoch
    )
    found = []
    for info in await store.list(prefix):
        body = decode_segment(await store.get(info.key)).body
        for _, records in read_with_kafka_python(bytes(body)):
            found += [(r.offset, r.key or b"") for r in records]
    return found


class CountingStore(LocalDirObjectStore):
    lists = 0

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return await super().list(prefix, start_after=start_after, limit=limit)


def new_cleaner(
    store: LocalDirObjectStore, manager: Manager, delay_s: float = 0, view: View | None = None
) -> Cleaner:
    return Cleaner(
        LogSettings(cleaner_delete_delay_s=delay_s),
        CLUSTER,
        manager,  # type: ignore[arg-type]
        view or View(),  # type: ignore[arg-type]
        store,
        SegmentCache(0),
        {},
    )


async def test_an_idle_partition_costs_no_listing_until_its_state_moves(tmp_path: Path) -> None:
    """Fails on the old main: every check listed the partition's segments and cleaned objects
    (two LISTs per compacted partition every ``log.cleaner_interval_s``, idle or not)."""
    store = CountingStore(tmp_path)
    owned = new_partition()
    await append_segment(store, owned, [(b"k", b"v0")])  # the newest: never cleaned
    cleaner = new_cleaner(store, Manager(owned))
    try:
        assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is None
        listed = store.lists
        assert listed > 0
        for _ in range(3):
            assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is None
        assert store.lists == listed
        await append_segment(store, owned, [(b"k", b"v1")])  # a flush: the state moved
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None and result.cleaned.upto == 1
    finally:
        await cleaner.close()
        await store.close()


async def test_a_pass_after_one_whose_commit_went_unanswered_commits(tmp_path: Path) -> None:
    """Fails on the old main: the second pass had the first one's generation and epoch, its
    conditional PUT met the first one's object and every later pass failed the same way."""
    store = LocalDirObjectStore(tmp_path)
    owned = new_partition()
    for round_ in range(3):
        await append_segment(store, owned, [(b"k%d" % k, b"v%d" % round_) for k in range(3)])
    cleaner = new_cleaner(store, Manager(owned, refuse=1))
    try:
        assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is None
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None
        assert owned.state.cleaned == result.cleaned
        assert result.cleaned.upto == 6
        # Each key's latest below upto, once: nothing of the refused pass's objects mixed in.
        assert await cleaned_records(store, result.cleaned) == [(3, b"k0"), (4, b"k1"), (5, b"k2")]
        # The refused pass's objects are deleted with the superseded segments.
        refused = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, 0, EPOCH)
        for _ in range(600):  # the delete runs in a task of its own
            if not await store.list(refused):
                break
            await asyncio.sleep(0.05)
        assert await store.list(refused) == []
        assert await cleaned_records(store, result.cleaned) == [(3, b"k0"), (4, b"k1"), (5, b"k2")]
    finally:
        await cleaner.close()
        await store.close()


async def test_a_fetch_from_a_state_older_than_a_pass_and_its_delete_reads_again(
    tmp_path: Path,
) -> None:
    """A fetch that captured the state before a pass whose delayed delete has run finds its
    generation gone: it reads again from the committed state (the old main answered
    KAFKA_STORAGE_ERROR, a "no cleaned object holds offset" failure)."""
    store = LocalDirObjectStore(tmp_path)
    owned = new_partition()
    for round_ in range(3):
        await append_segment(store, owned, [(b"k%d" % k, b"v%d" % round_) for k in range(3)])
    cleaner = new_cleaner(store, Manager(owned))
    reader = LogReader(CLUSTER, store, SegmentCache(1 << 20))
    try:
        assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is not None
        before = owned.state
        assert await reader.read(TOPIC, TOPIC_ID, 0, before, 0, 1 << 20)  # listed, cached
        await append_segment(store, owned, [(b"k0", b"v3")])
        assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is not None
        old = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, 0, EPOCH)
        for _ in range(600):  # the delayed delete (delay 0) runs in a task of its own
            if not await store.list(old):
                break
            await asyncio.sleep(0.05)
        reader.forget(TOPIC)
        with pytest.raises(ObjectGone):
            await reader.read(TOPIC, TOPIC_ID, 0, before, 0, 1 << 20)
        ctx = SimpleNamespace(broker=SimpleNamespace(reader=reader, fresh_state=fresh(owned)))
        wanted = _Wanted(TOPIC, View().topics[TOPIC], 0, 0, 1 << 20, -1)
        info = View().topics[TOPIC]
        records, state = await _read_records(wanted, info, before, ctx, 1 << 20, True)  # type: ignore[arg-type]
        assert state == owned.state
        read = [(r.offset, r.key) for _, rs in read_with_kafka_python(records) for r in rs]
        assert read == [(6, b"k0"), (7, b"k1"), (8, b"k2"), (9, b"k0")]
    finally:
        await reader.close()
        await cleaner.close()
        await store.close()


def fresh(owned: OwnedPartition) -> Callable[[tuple[str, int]], Awaitable[PartitionState]]:
    async def committed(tp: tuple[str, int]) -> PartitionState:
        return owned.state

    return committed


def test_no_listed_object_means_no_input_not_a_crash() -> None:
    """Fails on the old main (ValueError from a strict zip, logged with a traceback at every
    check): a compact,delete partition whose retention deleted every segment (log start at the
    high watermark), and a committed generation whose objects cannot be listed."""
    state = PartitionState(
        high_watermark=10, log_start_offset=10, leader_epoch=EPOCH, epochs=((EPOCH, 0),)
    )
    assert plain_inputs(state, []) == []
    cleaned = replace(state, cleaned=Cleaned(6, 0, EPOCH))
    assert cleaned_inputs(cleaned, [], "prefix/") == []


class RecordsManager(Manager):
    async def delete_records(self, tp: tuple[str, int], offset: int) -> int:
        owned = self.owned[tp]
        owned.state = advance_log_start(owned.state, offset)
        owned.state_revision += 1
        return owned.state.log_start_offset


async def test_cleaned_objects_below_the_log_start_are_deleted_without_a_pass(
    tmp_path: Path,
) -> None:
    """Fails on the old main: DeleteRecords (or retention of compact,delete) moving the log
    start past cleaned objects left them stored (and counted by DescribeLogDirs) until a later
    pass, which a partition that gets no more writes never runs."""
    store = CountingStore(tmp_path)
    owned = new_partition()
    for round_ in range(3):  # distinct keys: each cleaned input is an object of its own
        await append_segment(
            store, owned, [(b"r%dk%d" % (round_, k), b"v" * 500) for k in range(3)]
        )
    manager = RecordsManager(owned)
    cleaner = Cleaner(
        LogSettings(cleaner_delete_delay_s=0, segment_bytes=1024),
        CLUSTER,
        manager,  # type: ignore[arg-type]
        View(),  # type: ignore[arg-type]
        store,
        SegmentCache(0),
        {},
    )
    janitor = Janitor(CLUSTER, manager, View(), store, {})  # type: ignore[arg-type]
    sizes = LogSizes(CLUSTER, store)
    try:
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None and result.cleaned.upto == 6
        prefix = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, 0, EPOCH)
        first, second = [info.key for info in await store.list(prefix)]
        size_before = await sizes.size_of(owned)
        await manager.delete_records(owned.tp, 4)  # inside the second cleaned object
        await janitor.sweep(int(time.time() * 1000))
        assert [info.key for info in await store.list(prefix)] == [second]
        assert await sizes.size_of(owned) < size_before
        reader = LogReader(CLUSTER, store, SegmentCache(0))
        records = await reader.read(TOPIC, TOPIC_ID, 0, owned.state, 4, 1 << 20)
        read = [r.offset for _, rs in read_with_kafka_python(records) for r in rs]
        assert read[0] <= 4 and read[-1] == 8  # from the object holding the log start on
        assert first not in [info.key for info in await store.list(prefix)]
        lists = store.lists
        await janitor.sweep(int(time.time() * 1000))  # nothing moved: no listing of them
        assert store.lists - lists <= 1  # the partition's own segment listing only
    finally:
        await cleaner.close()
        await store.close()


class PutHook(LocalDirObjectStore):
    on_put: Callable[[str], None] = staticmethod(lambda key: None)

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> None:
        await super().put(key, data, if_absent=if_absent)
        self.on_put(key)


async def test_a_pass_stops_uploading_once_its_topic_is_deleted(tmp_path: Path) -> None:
    """Fails on the old main: a pass went on uploading after its topic was deleted, and the
    objects landing after the topic's one purge stayed in the bucket for good."""
    store = PutHook(tmp_path)
    owned = new_partition()
    for round_ in range(4):  # distinct keys: each cleaned input is an object of its own
        records = [(b"r%dk%d" % (round_, k), b"v" * 500) for k in range(3)]
        await append_segment(store, owned, records)
    view = View()
    cleaned: list[str] = []

    def deleted_on_first(key: str) -> None:
        if ".cleaned/" in key:
            cleaned.append(key)
            view.topics.clear()

    store.on_put = deleted_on_first  # type: ignore[method-assign]
    cleaner = Cleaner(
        LogSettings(cleaner_delete_delay_s=0, segment_bytes=1024),
        CLUSTER,
        Manager(owned),  # type: ignore[arg-type]
        view,  # type: ignore[arg-type]
        store,
        SegmentCache(0),
        {},
    )
    try:
        with pytest.raises(CleanerError):
            await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert len(cleaned) == 1
        assert owned.state.cleaned is None
    finally:
        await cleaner.close()
        await store.close()


async def stored_keys(store: LocalDirObjectStore) -> list[str]:
    return sorted(info.key for info in await store.list(f"{CLUSTER}/"))


async def until_stored(store: LocalDirObjectStore, wanted: list[str]) -> list[str]:
    """The stored keys once they are ``wanted`` (the delayed delete runs in a task of its
    own), or as they are after a generous wait."""
    for _ in range(1200):
        found = await stored_keys(store)
        if found == wanted:
            break
        await asyncio.sleep(0.05)
    return found


async def test_a_new_owner_deletes_what_an_owner_killed_after_its_commit_left(
    tmp_path: Path,
) -> None:
    """Fails on the old main: an owner that died within ``log.cleaner_delete_delay_s`` of a
    commit left the superseded plain segments and the older generation for good (only the
    pass that superseded them deleted them). The next owner finds and deletes them after the
    delay counted from when it found them, keeping the committed generation and the plain
    segments from ``upto`` on."""
    store = LocalDirObjectStore(tmp_path)
    owned = new_partition()
    for round_ in range(3):
        await append_segment(store, owned, [(b"k%d" % k, b"v%d" % round_) for k in range(3)])
    first = new_cleaner(store, Manager(owned), delay_s=3600)  # its deletes never run
    result = await first.clean_partition(owned, int(time.time() * 1000))
    await append_segment(store, owned, [(b"k0", b"v3")])
    later = await first.clean_partition(owned, int(time.time() * 1000))
    assert result is not None and later is not None
    await first.close()  # killed: its delayed deletes never ran
    # A crashed pass of the dead owner (an orphan generation above the committed one).
    orphan = keys.cleaned_object_key(
        keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, later.cleaned.generation + 1, EPOCH),
        0,
    )
    await store.put(orphan, b"junk")
    upto = later.cleaned.upto
    plain = keys.partition_object_prefix(CLUSTER, TOPIC, TOPIC_ID, 0)
    committed = keys.cleaned_pass_prefix(
        CLUSTER, TOPIC, TOPIC_ID, 0, later.cleaned.generation, EPOCH
    )
    kept = [k for k in await stored_keys(store) if k.startswith(committed)] + [
        info.key
        for info in await store.list(plain)
        if (parsed := keys.parse_object_name(info.key)) is not None and parsed[0] >= upto
    ]
    assert len(await stored_keys(store)) > len(kept) + 1  # superseded: segments, generation 0
    # The next owner (a new epoch) with a long delay: found, not deleted yet.
    state = owned.state
    taken = OwnedPartition(
        TOPIC,
        0,
        TOPIC_ID,
        replace(
            state,
            leader_epoch=EPOCH + 1,
            epochs=(*state.epochs, (EPOCH + 1, state.high_watermark)),
        ),
        2,
        2,
    )
    waiting = new_cleaner(store, Manager(taken), delay_s=3600)
    before = await stored_keys(store)
    try:
        await waiting.clean_partition(taken, int(time.time() * 1000))
        assert await stored_keys(store) == before
    finally:
        await waiting.close()
    # And one whose delay has passed: only the committed generation and what is at or above
    # ``upto`` stay, and a reader still gets each key's latest.
    successor = new_cleaner(store, Manager(taken))
    try:
        assert await successor.clean_partition(taken, int(time.time() * 1000)) is None
        assert await until_stored(store, sorted(kept)) == sorted(kept)
        reader = LogReader(CLUSTER, store, SegmentCache(0))
        records = await reader.read(TOPIC, TOPIC_ID, 0, taken.state, 0, 1 << 20)
        read = [(r.offset, r.key) for _, rs in read_with_kafka_python(records) for r in rs]
        assert read == [(6, b"k0"), (7, b"k1"), (8, b"k2"), (9, b"k0")]  # 9: not cleaned yet
        await reader.close()
    finally:
        await successor.close()
        await store.close()


async def test_cleaned_objects_are_sized_by_the_topics_segment_bytes(tmp_path: Path) -> None:
    """Fails on the old main: cleaned objects were cut at the broker's ``log.segment_bytes``
    (4 MiB here: one object), where Kafka cuts cleaned segments at the topic's
    ``segment.bytes`` (1 KiB here: one object per input of 1.5 KB)."""
    store = LocalDirObjectStore(tmp_path)
    owned = new_partition()
    for round_ in range(4):  # distinct keys: nothing is cleaned away
        await append_segment(
            store, owned, [(b"r%dk%d" % (round_, k), b"v" * 500) for k in range(3)]
        )
    cleaner = new_cleaner(store, Manager(owned), view=View(**{"segment.bytes": "1024"}))
    try:
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None and result.cleaned.upto == 9
        assert result.objects_written == 3
        assert await cleaned_records(store, result.cleaned) == [
            (o, b"r%dk%d" % (o // 3, o % 3)) for o in range(9)
        ]
    finally:
        await cleaner.close()
        await store.close()


class PrefixCountingStore(LocalDirObjectStore):
    """A real local-directory store that records the prefix of every listing call."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.prefixes: list[str] = []

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.prefixes.append(prefix)
        return await super().list(prefix, start_after=start_after, limit=limit)


async def test_a_busy_partition_lists_its_committed_generation_once(tmp_path: Path) -> None:
    """Fails on the old main: every check of a partition whose state moved listed the
    committed generation's prefix again (two LISTs per check), though a committed generation
    never changes. Now the pass that wrote it knows its objects; checks list the segments only."""
    store = PrefixCountingStore(tmp_path)
    owned = new_partition()
    for round_ in range(3):
        await append_segment(store, owned, [(b"k%d" % k, b"v%d" % round_) for k in range(3)])
    view = View()
    cleaner = new_cleaner(store, Manager(owned), delay_s=3600, view=view)
    try:
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None
        view.topics = View(**{"min.cleanable.dirty.ratio": "0.99"}).topics
        store.prefixes.clear()
        for round_ in range(3):  # flushes: the state moves, no pass is due (ratio 0.99)
            await append_segment(store, owned, [(b"k0", b"w%d" % round_)])
            assert await cleaner.clean_partition(owned, int(time.time() * 1000)) is None
        plain = keys.partition_object_prefix(CLUSTER, TOPIC, TOPIC_ID, 0)
        assert store.prefixes == [plain] * 3
        # A cleaner that did not write the generation (a new owner) lists it once.
        again = new_cleaner(store, Manager(owned), delay_s=3600, view=view)
        try:
            store.prefixes.clear()
            for _ in range(3):
                await append_segment(store, owned, [(b"k1", b"x")])
                assert await again.clean_partition(owned, int(time.time() * 1000)) is None
            committed = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, 0, EPOCH)
            assert store.prefixes.count(committed) == 1
        finally:
            await again.close()
    finally:
        await cleaner.close()
        await store.close()


async def test_a_batch_too_large_to_decompress_is_kept_whole_and_cleaning_goes_on(
    tmp_path: Path,
) -> None:
    """Fails on the old main: a stored zstd batch whose records decompress past 64 MiB (a
    topic compacted after it was written may hold one) made every pass of the partition fail
    (InvalidBatch), so it was never cleaned again. The pass keeps that batch whole and cleans
    the rest."""
    import cramjam

    from kafscale.broker.protocol.record_batch import MAX_DECOMPRESSED_BYTES, iter_batch_headers

    store = LocalDirObjectStore(tmp_path)
    owned = new_partition()
    await append_segment(store, owned, [(b"k0", b"v0"), (b"k1", b"v0")])  # offsets 0, 1
    huge = encode_record(0, 0, b"big", bytes(MAX_DECOMPRESSED_BYTES + 1))
    zstd = 4
    batch = encode_batch(
        bytes(cramjam.zstd.compress(huge)),
        1,
        base_timestamp=1,
        max_timestamp=1,
        attributes=zstd,
        base_offset=2,
    )
    data = encode_segment([batch], int(time.time() * 1000), 4096).segment
    await store.put(keys.segment_object_key(CLUSTER, TOPIC, TOPIC_ID, 0, 2, EPOCH), data)
    owned.state = commit_segment(owned.state, SegmentRef(2, 2, EPOCH, len(data), 1), {})
    owned.state_revision += 1
    await append_segment(store, owned, [(b"k0", b"v1"), (b"k1", b"v1")])  # offsets 3, 4
    await append_segment(store, owned, [(b"k0", b"v2")])  # the newest: never cleaned
    cleaner = new_cleaner(store, Manager(owned), delay_s=3600)
    try:
        result = await cleaner.clean_partition(owned, int(time.time() * 1000))
        assert result is not None and result.cleaned.upto == 5
        prefix = keys.cleaned_pass_prefix(CLUSTER, TOPIC, TOPIC_ID, 0, 0, EPOCH)
        bodies = [decode_segment(await store.get(i.key)).body for i in await store.list(prefix)]
        kept = [header for body in bodies for _, header in iter_batch_headers(body)]
        # The large batch stays whole; offsets 0 and 1 were superseded by 3 and 4.
        assert [(h.base_offset, h.last_offset) for h in kept] == [(2, 2), (3, 4)]
        assert bytes(batch) in b"".join(bytes(body) for body in bodies)
    finally:
        await cleaner.close()
        await store.close()
