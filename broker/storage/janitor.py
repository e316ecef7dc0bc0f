"""Retention and garbage collection for the partitions this broker owns.

Every ``retention_check_interval_s`` the owner of a partition lists its objects from the oldest,
as far as retention looks, decides the new log start offset from ``retention.ms`` and
``retention.bytes`` (pure decisions in ``retention``; a topic compacted only is never trimmed),
commits it with the same fencing as a flush, and then deletes whole segments below it. For
``retention.bytes``, which weighs the whole log, a ``SizeLedger`` per partition keeps the
committed segments' sizes: one full listing per ownership epoch, then only what was committed
since the last check. Uploads left by fenced writers of older epochs can never become
committed; they are deleted too, found by a page of keys from each epoch boundary on the first
check of an ownership epoch and every ``ORPHAN_SCAN_EVERY`` checks; so are aborted-transaction
index objects of older epochs that the state does not reference (their writer died between its
PUT and its commit), on partitions where transactions ran.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import NamedTuple

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import orphaned_indexes
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.partition_state import (
    Cleaned,
    PartitionState,
    is_committed_segment,
)
from kafscale.broker.metadata.topics import effective_configs
from kafscale.broker.protocol.errors import KafkaError
from kafscale.broker.storage.log_manager import LogManager
from kafscale.broker.storage.log_sizes import committed_pages
from kafscale.broker.storage.object_store import ObjectInfo, ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.reader import committed_objects
from kafscale.broker.storage.retention import (
    SegmentFacts,
    decide_log_start,
    deletable_bases,
    retention_limits,
)
from kafscale.broker.storage.segments import SEGMENT_HEADER_SIZE, decode_segment_header
from kafscale.broker.storage.size_ledger import ListRange, SizeLedger

log = logging.getLogger(__name__)

PAGE = 1000  # keys per listing call (S3's page size)
ORPHAN_SCAN_EVERY = 20  # checks: every 10 minutes at the default 30 s
MAX_PAGES_PER_CHECK = 10  # pages listed per partition and check while all are expired
KEEP = 2**63 - 1  # a creation time that never expires: where a capped check stops


async def segment_facts(
    segments: list[tuple[int, ObjectInfo]],
    expired_before_ms: int | None,
    created_at_ms: Callable[[str], Awaitable[int]],
) -> tuple[list[SegmentFacts], bool]:
    """What ``decide_log_start`` needs of each segment, reading creation times (a ranged GET of
    the segment header each) only where time retention looks: from the oldest segment up to
    the first one created at or after ``expired_before_ms`` (None: no time retention, none
    read). Retention stops there, so the later segments carry that segment's time. Reading
    every new segment's header cost one GET per segment per check: at a 100 ms flush interval,
    ten GETs a second per busy partition, billed on S3 and queued in front of flush PUTs.
    Also whether time retention is settled by these segments (one of them is still inside
    it, or there is no time retention): segments listed after them cannot change its answer."""
    facts = []
    known_ms = -1  # unknown: only read while time retention looks
    reading = expired_before_ms is not None
    for base, info in segments:
        if reading:
            known_ms = await created_at_ms(info.key)
            reading = expired_before_ms is not None and known_ms < expired_before_ms
        facts.append(SegmentFacts(base, info.size, known_ms))
    return facts, not reading


async def list_for_retention(
    store: ObjectStore,
    prefix: str,
    state: PartitionState,
    expired_before_ms: int | None,
    created_at_ms: Callable[[str], Awaitable[int]],
    page: int = PAGE,
    max_pages: int = MAX_PAGES_PER_CHECK,
) -> tuple[list[ObjectInfo], list[SegmentFacts]]:
    """The partition's objects from the oldest on, and its committed segments' facts: pages of
    ``page`` keys until time retention is settled. A week of
    100 ms segments is six million objects; listing them all every 30 s would be thousands of
    LIST calls per partition and check, where retention needs the first page. After
    ``max_pages`` pages of nothing but expired segments (retention just shortened on a long
    log), the check stops there and keeps the last listed segment: the next check goes on."""
    objects: list[ObjectInfo] = []
    for pages in range(1, max_pages + 1):
        after = objects[-1].key if objects else None
        listed = await store.list(prefix, start_after=after, limit=page)
        objects += listed
        committed, settled = await segment_facts(
            [(base, info) for base, _, info in committed_objects(state, objects)],
            expired_before_ms,
            created_at_ms,
        )
        if len(listed) < page or settled:
            return objects, committed
        if pages == max_pages and committed:
            committed[-1] = replace(committed[-1], created_at_ms=KEEP)
    return objects, committed


async def list_committed_since(
    store: ObjectStore, prefix: str, state: PartitionState, ledger: SizeLedger
) -> None:
    """Add to ``ledger`` the segments committed since its last listing (all of them, the first
    time): every key from its ``listed_below`` offset on, a page at a time."""
    async for page in committed_pages(store, prefix, state, ledger.listed_below, None):
        ledger.add(page, ledger.listed_below)
    ledger.add((), state.high_watermark)


async def fill_ledger(
    store: ObjectStore, prefix: str, state: PartitionState, ledger: SizeLedger, wanted: ListRange
) -> None:
    """List the range of segments ``ledger`` asks for (one of its blocks) and hand it back."""
    found: list[tuple[int, int]] = []
    async for page in committed_pages(store, prefix, state, wanted.start, wanted.end):
        found += page
    ledger.fill(wanted, found)


def epoch_boundaries(state: PartitionState) -> list[int]:
    """Where each epoch after the first began, at or above the log start: a writer fenced at
    the end of an epoch had its uncommitted uploads from there on (below the log start,
    retention's listing from the oldest object finds them)."""
    return [start for _, start in state.epochs[1:] if start >= state.log_start_offset]


async def with_epoch_boundaries(
    store: ObjectStore,
    prefix: str,
    state: PartitionState,
    objects: list[ObjectInfo],
    page: int = PAGE,
) -> list[ObjectInfo]:
    """``objects`` plus one page of keys from each epoch boundary: where a fenced writer's
    uploads lie (they start at the boundary and span what it had in flight, a few segments),
    found without listing the whole partition."""
    seen = {info.key for info in objects}
    found = list(objects)
    for start in epoch_boundaries(state):
        for info in await store.list(
            prefix, start_after=keys.objects_from(prefix, start), limit=page
        ):
            if info.key not in seen:
                seen.add(info.key)
                found.append(info)
    return found


class CleanedObject(NamedTuple):
    """A committed cleaned object holding offsets [base, end)."""

    base: int
    end: int
    info: ObjectInfo


class Janitor:
    def __init__(
        self,
        cluster: str,
        manager: LogManager,
        view: ClusterView,
        store: ObjectStore,
        broker_defaults: dict[str, str],
    ) -> None:
        self._cluster = cluster
        self._broker_defaults = broker_defaults
        self._manager = manager
        self._view = view
        self._store = store
        self._created_at: dict[str, int] = {}
        self._listings: dict[tuple[str, int], tuple[int, int]] = {}  # (epoch, checks since scan)
        self._ledgers: dict[tuple[str, int], SizeLedger] = {}  # partitions with retention.bytes
        self._ledger_cleaned: dict[tuple[str, int], Cleaned | None] = {}  # each ledger's pass
        # Per compacted partition, the pass and log start whose cleaned objects below the log
        # start were deleted last, and its cleaned objects' flush times (``_cleaned_facts``).
        self._cleaned_seen: dict[tuple[str, int], tuple[Cleaned, int]] = {}
        self._cleaned_times: dict[tuple[str, int], dict[str, int]] = {}

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.sweep(int(time.time() * 1000))

    async def sweep(self, now_ms: int) -> None:
        owned_now = self._manager.owned
        for tp in [tp for tp in self._listings if tp not in owned_now]:
            del self._listings[tp]
        for cache in (self._ledgers, self._ledger_cleaned, self._cleaned_seen, self._cleaned_times):
            for tp in [tp for tp in cache if tp not in owned_now]:
                del cache[tp]
        for owned in list(owned_now.values()):
            try:
                await self._sweep_partition(owned, now_ms)
            except (KafkaError, ObjectStoreError) as exc:
                log.warning("retention of %s-%d skipped: %s", owned.topic, owned.partition, exc)

    async def _sweep_partition(self, owned: OwnedPartition, now_ms: int) -> None:
        info = self._view.topics.get(owned.topic)
        if info is None:
            return
        configs = effective_configs(info, self._broker_defaults)
        prefix = keys.partition_object_prefix(
            self._cluster, owned.topic, owned.topic_id, owned.partition
        )
        # Decide on the state as it was when we listed: a flush committing meanwhile adds a
        # segment the listing does not show, and must not be expired unseen.
        state = owned.state
        retention_ms, retention_bytes = retention_limits(configs)
        expired_before_ms = now_ms - retention_ms if retention_ms >= 0 else None
        objects, committed = await list_for_retention(
            self._store, prefix, state, expired_before_ms, self._created_at_ms
        )
        if self._orphan_scan_due(owned):
            objects = await with_epoch_boundaries(self._store, prefix, state, objects)
            if state.coordinator_epochs or state.aborted_txn_index:  # transactions ran here
                await self._delete_orphaned_indexes(owned, state)
        cleaned_objects = []
        if state.cleaned is not None and (
            retention_ms >= 0
            or self._cleaned_seen.get(owned.tp) != (state.cleaned, state.log_start_offset)
        ):
            cleaned_objects = await self._list_cleaned(owned, state.cleaned)
            committed = await self._cleaned_facts(owned, cleaned_objects, expired_before_ms) + (
                committed
            )
        ledger = await self._ledger(owned, prefix, state, retention_bytes >= 0)
        if owned.state.cleaned != state.cleaned:
            return  # a pass committed while we listed: what we listed may be gone; next check
        hw, start = state.high_watermark, state.log_start_offset
        new_start = decide_log_start(committed, hw, start, now_ms, retention_ms, -1)
        if ledger is not None:  # retention.bytes: the later of the two cuts (``size_ledger``)
            cut = await self._bytes_start(ledger, prefix, state, retention_bytes)
            new_start = max(new_start, min(cut, hw))
        if new_start > owned.state.log_start_offset:
            await self._manager.delete_records(owned.tp, new_start)
            log.info("retention moved %s-%d start to %d", owned.topic, owned.partition, new_start)
        bases = [fact.base for fact in committed]
        if ledger is not None:
            while (wanted := ledger.trim(owned.state.log_start_offset)) is not None:
                await fill_ledger(self._store, prefix, owned.state, ledger, wanted)
            if ledger.first_base is not None:  # the segment holding the log start
                bases.append(ledger.first_base)
        await self._delete_garbage(owned, objects, bases)
        if state.cleaned is not None and cleaned_objects:
            await self._delete_cleaned_below_start(owned, state.cleaned, cleaned_objects)

    async def _list_cleaned(self, owned: OwnedPartition, cleaned: Cleaned) -> list[CleanedObject]:
        """The committed generation's cleaned objects, oldest first, each with its end."""
        where = (owned.topic, owned.topic_id, owned.partition)
        prefix = keys.cleaned_pass_prefix(self._cluster, *where, cleaned.generation, cleaned.epoch)
        root = keys.cleaned_root_prefix(self._cluster, *where)
        found = []
        for info in await self._store.list(prefix):
            parsed = keys.parse_cleaned_key(root, info.key)
            if parsed is not None and parsed[3] == "kfs" and parsed[2] < cleaned.upto:
                found.append((parsed[2], info))
        found.sort(key=lambda item: item[0])
        ends = [base for base, _ in found[1:]] + [cleaned.upto]
        pairs = zip(found, ends, strict=False)  # no object listed: no pair
        return [CleanedObject(base, end, info) for (base, info), end in pairs]

    async def _cleaned_facts(
        self,
        owned: OwnedPartition,
        cleaned_objects: list[CleanedObject],
        expired_before_ms: int | None,
    ) -> list[SegmentFacts]:
        """The committed cleaned objects of a compacted partition (``docs/compaction.md``), as
        retention weighs segments: the plain listing starts at ``cleaned.upto``, and a log
        start decided from it alone would drop every cleaned record. Their flush times are
        kept for the objects still listed only (every pass writes new ones)."""
        known = self._cleaned_times.get(owned.tp, {})
        times: dict[str, int] = {}

        async def created_at_ms(key: str) -> int:
            if key not in known:
                header = await self._store.get(key, start=0, end=SEGMENT_HEADER_SIZE)
                known[key] = decode_segment_header(header).created_at_ms
            times[key] = known[key]
            return times[key]

        facts, _ = await segment_facts(
            [(item.base, item.info) for item in cleaned_objects], expired_before_ms, created_at_ms
        )
        self._cleaned_times[owned.tp] = times
        return facts

    async def _delete_cleaned_below_start(
        self, owned: OwnedPartition, cleaned: Cleaned, cleaned_objects: list[CleanedObject]
    ) -> None:
        """Delete the committed cleaned objects wholly below the log start (retention of
        ``compact,delete`` or DeleteRecords moved it past them): no reader serves offsets there,
        and without this they stayed until a later pass, which an idle partition never runs.
        Only while the pass listed is still the committed one (the cleaner deletes superseded
        generations itself)."""
        start = owned.state.log_start_offset
        if owned.state.cleaned != cleaned:
            return
        doomed = [item.info.key for item in cleaned_objects if item.end <= start]
        if doomed:
            await self._store.delete_many(doomed)
            log.info(
                "deleted %d cleaned object(s) of %s-%d below its log start %d",
                len(doomed), owned.topic, owned.partition, start,
            )  # fmt: skip
        self._cleaned_seen[owned.tp] = (cleaned, start)

    async def _bytes_start(
        self, ledger: SizeLedger, prefix: str, state: PartitionState, retention_bytes: int
    ) -> int:
        """``retention.bytes``'s cut, listing the one block it falls in if need be."""
        hw, start = state.high_watermark, state.log_start_offset
        while isinstance(cut := ledger.bytes_start(retention_bytes, hw, start), ListRange):
            await fill_ledger(self._store, prefix, state, ledger, cut)
        return cut

    async def _ledger(
        self, owned: OwnedPartition, prefix: str, state: PartitionState, wanted: bool
    ) -> SizeLedger | None:
        """The partition's size ledger brought up to ``state``, if ``retention.bytes`` applies;
        a new one (a full listing) for a new ownership epoch or a new topic of the name."""
        if not wanted:
            self._ledgers.pop(owned.tp, None)
            return None
        ledger = self._ledgers.get(owned.tp)
        if (
            ledger is None
            or (ledger.prefix, ledger.epoch) != (prefix, owned.epoch)
            or self._ledger_cleaned.get(owned.tp) != state.cleaned
        ):
            # New, or a compaction pass superseded segments it counted: count from scratch
            # (the plain segments above the cleaned range; the cleaned objects are not weighed).
            ledger = SizeLedger(prefix, owned.epoch)
            self._ledger_cleaned[owned.tp] = state.cleaned
        await list_committed_since(self._store, prefix, state, ledger)
        self._ledgers[owned.tp] = ledger  # only once listed: a failed listing starts again
        return ledger

    def _orphan_scan_due(self, owned: OwnedPartition) -> bool:
        """Epoch boundaries are scanned for a fenced writer's uploads on the first check of each
        ownership epoch (they land within seconds of the handoff) and every
        ``ORPHAN_SCAN_EVERY`` checks after, for one that landed later still."""
        epoch, checks = self._listings.get(owned.tp, (None, 0))
        due = epoch != owned.epoch or checks + 1 >= ORPHAN_SCAN_EVERY
        self._listings[owned.tp] = (owned.epoch, 0 if due else checks + 1)
        return due

    async def _delete_orphaned_indexes(self, owned: OwnedPartition, state: PartitionState) -> None:
        """Aborted-transaction index objects of older epochs that no state references (their
        writer died before its commit): one listing of the partition's index prefix."""
        prefix = keys.aborted_index_prefix(
            self._cluster, owned.topic, owned.topic_id, owned.partition
        )
        listed = {}
        for info in await self._store.list(prefix):
            parsed = keys.parse_aborted_index_name(info.key)
            if parsed is not None:
                listed[parsed] = info.key
        doomed = [listed[o] for o in orphaned_indexes(state, listed, owned.epoch)]
        if doomed:
            await self._store.delete_many(doomed)
            log.info("deleted %d orphaned aborted-transaction index(es)", len(doomed))

    async def _created_at_ms(self, key: str) -> int:
        cached = self._created_at.get(key)
        if cached is None:
            header = await self._store.get(key, start=0, end=SEGMENT_HEADER_SIZE)
            cached = self._created_at[key] = decode_segment_header(header).created_at_ms
        return cached

    async def _delete_garbage(
        self, owned: OwnedPartition, objects: list[ObjectInfo], committed_bases: list[int]
    ) -> None:
        below = set(deletable_bases(committed_bases, owned.state.log_start_offset))
        doomed = []
        for info in objects:
            parsed = keys.parse_object_name(info.key)
            if parsed is None:
                continue
            base, epoch, _ = parsed
            cleaned = owned.state.cleaned
            if cleaned is not None and base < cleaned.upto:
                continue  # superseded by compaction: the cleaner deletes it after its delay
            fenced_orphan = epoch < owned.epoch and not is_committed_segment(
                owned.state, base, epoch
            )
            if (base in below and is_committed_segment(owned.state, base, epoch)) or fenced_orphan:
                doomed.append(info.key)
        if doomed:
            await self._store.delete_many(doomed)
            for key in doomed:
                self._created_at.pop(key, None)
