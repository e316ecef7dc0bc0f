"""Reading committed data: any broker serves any acknowledged offset.

A read finds the committed segment holding the offset: first among the newest segments named in
the partition state, else in a (cached) window of the partition's listing, listed from the
highest time mark below the offset, where uploads that were never committed are recognised by
their epoch and ignored. A listing says nothing about offsets at or above the high watermark it
was made at: segments committed since are found by listing again (issue 29: a window trusted
as complete hid every record committed after it). Recent segments are read whole and kept in
the cache, as are older segments up to 8 MiB (a consumer reading on hits the cache for the
rest of the segment); larger ones are read by a ranged GET that starts at the index entry for
the offset. A read fills its byte budget across as many segments as it takes, reading the
segments it needs next at once (as many as their sizes fit in the budget), unless it is given a
deadline: then, once it holds records, it starts no further reads past it. A Fetch's deadline
is its ``max_wait`` (Kafka's "maximum time to wait for the response"): a backlog of small
segments no broker has cached (a consumer catching up after a rebalance, at a broker that just
took the partition over) is hundreds of GETs, and read whole it kept the answer, and every
answer behind it on the connection (the client's Metadata among them), for seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import crc32c

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import (
    AbortedTxn,
    Cleaned,
    PartitionState,
    is_committed_segment,
    time_scan_start,
)
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.errors import ObjectGone, OffsetOutOfRange, StorageFailure
from kafscale.broker.protocol.record_batch import (
    InvalidBatch,
    iter_batch_headers,
    read_header,
    record_timestamps,
)
from kafscale.broker.storage import aborted_index
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.object_store import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
)
from kafscale.broker.storage.segments import (
    SEGMENT_FOOTER_SIZE,
    SegmentCorrupt,
    decode_index,
    decode_segment,
    position_for_offset,
)
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)

MAX_SEGMENTS_AT_ONCE = 32  # segments of one read fetched concurrently
WHOLE_READ_MAX_BYTES = 8 * 1024 * 1024  # smaller segments have no index object to range by
MAX_PREFETCHES = 8  # larger (older, foreign) segments: ranged GETs
LIST_PAGE = 1000  # keys per listing call (S3's page size)
MAX_LISTINGS = 256  # partitions whose listing window is kept (~100 KB each at most)
MAX_CLEANED_LISTINGS = 256  # compacted partitions whose cleaned objects' listing is kept


@dataclass(frozen=True, slots=True)
class SegmentLocation:
    """A committed segment holding offsets [base, end); ``end`` is -1 while unknown (a listed
    segment whose successor was not listed)."""

    base: int
    epoch: int
    size: int
    recent: bool
    end: int = -1
    generation: int = -1  # a cleaned object of this compaction generation (-1: a plain segment)

    @property
    def cleaned(self) -> bool:
        return self.generation >= 0


@dataclass(slots=True)
class _Listing:
    """A window of a partition's committed segments, in base order: from the one holding the
    offset that was looked up to the end of the listing page that passed it. ``complete``: the
    listing reached the partition's last object committed below ``high_watermark``, the high
    watermark of the state it was listed with; it knows nothing of segments committed since."""

    segments: list[SegmentLocation]
    complete: bool
    high_watermark: int = 0


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


def listing_start(
    state: PartitionState, offset: int, known: list[SegmentLocation] | None = None
) -> int | None:
    """A committed segment's base at or below ``offset`` to list from: the highest of the time
    marks (each the base of a segment committed above the log start) and of the segments
    ``known`` from an earlier window there, so a consumer reading on continues the listing
    instead of starting it again. None: list from the partition's first object."""
    below = [mark for mark, _ in state.time_marks if mark <= offset]
    below += [segment.base for segment in known or () if segment.base <= offset]
    return max(below) if below else None


class LogReader:
    def __init__(
        self, cluster: str, store: ObjectStore, cache: SegmentCache, list_page: int = LIST_PAGE
    ) -> None:
        self._cluster = cluster
        self._store = store
        self._cache = cache
        # The most recently used windows (each up to a page of segments), oldest first.
        self._listings: OrderedDict[tuple[str, str, int], _Listing] = OrderedDict()
        self._list_page = list_page
        self._prefetching: dict[str, asyncio.Task[None]] = {}
        # Per compacted partition, its committed generation's cleaned objects, as listed; the
        # most recently used ``MAX_CLEANED_LISTINGS`` partitions, oldest first (a broker that
        # served many compacted partitions over its life keeps only those it reads lately).
        self._cleaned: OrderedDict[tuple[str, str, int], tuple[Cleaned, list[SegmentLocation]]] = (
            OrderedDict()
        )

    async def close(self) -> None:
        for task in self._prefetching.values():
            task.cancel()
        await asyncio.gather(*self._prefetching.values(), return_exceptions=True)

    async def read(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        state: PartitionState,
        offset: int,
        max_bytes: int,
        min_one: bool = True,
        deadline: float | None = None,
    ) -> bytes:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` of them, across
        as many segments as that takes; with ``min_one``, at least the first batch whatever its
        size (Kafka's rule for the first partition with data in a response). Past ``deadline``
        (``time.monotonic()``), what is held is returned rather than read on (module doc)."""
        if offset < state.log_start_offset or offset > state.high_watermark:
            raise OffsetOutOfRange(
                f"offset {offset} outside [{state.log_start_offset}, {state.high_watermark}]"
            )
        chunks: list[bytes | memoryview] = []
        total = 0
        while offset < state.high_watermark and (total < max_bytes or (min_one and not chunks)):
            if chunks and _past(deadline):
                break
            budget = max(max_bytes - total, 0)
            wave = await self._plan(topic, topic_id, partition, state, offset, budget)
            parts = await self._read_wave(
                topic, topic_id, partition, wave, offset, budget, min_one and not chunks
            )
            if not parts and not chunks and min_one and not wave[0].recent:
                # Nothing where the state says there are records: a listing gone stale would
                # hide them for good, so list again once before answering with nothing.
                self._listings.pop((topic, topic_id, partition), None)
                wave = await self._plan(topic, topic_id, partition, state, offset, budget)
                parts = await self._read_wave(
                    topic, topic_id, partition, wave, offset, budget, min_one
                )
            if not parts and wave[0].cleaned:
                # Every record from ``offset`` to the end of this cleaned object was cleaned
                # away: go on at the next one (a consumer never stalls below the HW).
                offset = wave[0].end
                continue
            if not parts:
                break
            chunks.extend(parts)
            total += sum(len(part) for part in parts)
            offset = _next_offset(parts[-1])
        self._prefetch_from(topic, topic_id, partition, state, offset)
        return b"".join(chunks)

    async def _plan(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        state: PartitionState,
        offset: int,
        max_bytes: int,
    ) -> list[SegmentLocation]:
        """The segments to read next, in order: the one holding ``offset``, then the following
        ones while their sizes fit in ``max_bytes`` (a segment's size bounds what it gives)."""
        wave = [await self._locate(topic, topic_id, partition, state, offset)]
        planned = wave[0].size
        offset = wave[0].end
        while planned < max_bytes and len(wave) < MAX_SEGMENTS_AT_ONCE:
            if offset >= state.high_watermark:
                break
            # The segments after the first only from what is known: the next wave lists.
            location = self._known_location(topic, topic_id, partition, state, offset)
            if location is None or planned + location.size > max_bytes:
                break
            wave.append(location)
            planned += location.size
            if location.end <= offset:
                break  # where the next segment starts is unknown: read this one first
            offset = location.end
        return wave

    async def _read_wave(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        wave: list[SegmentLocation],
        offset: int,
        max_bytes: int,
        min_one: bool,
    ) -> list[bytes | memoryview]:
        """The batches of ``wave``'s segments, read at once, up to the first that gives none."""
        budgets = []
        left = max_bytes
        for location in wave:
            budgets.append(left)
            left -= location.size
        reads = [
            self._read_segment(
                topic,
                topic_id,
                partition,
                location,
                offset if index == 0 else location.base,
                budget,
                min_one and index == 0,
            )
            for index, (location, budget) in enumerate(zip(wave, budgets, strict=True))
        ]
        parts: list[bytes | memoryview] = []
        for data in await asyncio.gather(*reads):
            if not data:
                break
            parts.append(data)
        return parts

    def _prefetch_from(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, offset: int
    ) -> None:
        """Start reading the segment a consumer needs next, so its next fetch hits the cache.

        Only segments already known (from the state or an existing listing) are prefetched;
        the tasks are owned here and cancelled by ``close``.
        """
        if offset >= state.high_watermark or len(self._prefetching) >= MAX_PREFETCHES:
            return
        location = self._known_location(topic, topic_id, partition, state, offset)
        if location is None or location.size > WHOLE_READ_MAX_BYTES:
            return
        key = self._object_key(topic, topic_id, partition, location)
        if key in self._prefetching or self._cache.get(key) is not None:
            return
        task = start_task(self._prefetch(key), name=f"prefetch {key}")
        self._prefetching[key] = task
        task.add_done_callback(lambda _: self._prefetching.pop(key, None))

    async def _prefetch(self, key: str) -> None:
        try:
            await self._get_whole(key)
        except StorageFailure as exc:
            log.debug("prefetch of %s failed: %s", key, exc)

    def _object_key(
        self, topic: str, topic_id: str, partition: int, location: SegmentLocation
    ) -> str:
        if location.cleaned:
            prefix = keys.cleaned_pass_prefix(
                self._cluster, topic, topic_id, partition, location.generation, location.epoch
            )
            return keys.cleaned_object_key(prefix, location.base)
        key: str = keys.segment_object_key(
            self._cluster, topic, topic_id, partition, location.base, location.epoch
        )
        return key

    async def _cleaned_location(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, offset: int
    ) -> SegmentLocation:
        """The cleaned object holding ``offset`` (below the state's ``cleaned.upto``), from a
        listing of its generation's prefix (small: about one object per ``segment.bytes`` of
        cleaned data), kept per generation."""
        assert state.cleaned is not None
        found = self._known_cleaned(topic, topic_id, partition, state, offset)
        if found is not None:
            return found
        cleaned = state.cleaned
        prefix = keys.cleaned_pass_prefix(
            self._cluster, topic, topic_id, partition, cleaned.generation, cleaned.epoch
        )
        listed: list[ObjectInfo] = []
        while True:
            try:
                page = await self._store.list(
                    prefix, start_after=listed[-1].key if listed else None, limit=self._list_page
                )
            except ObjectStoreError as exc:
                raise StorageFailure(str(exc)) from exc
            listed += page
            if len(page) < self._list_page:
                break
        objects = sorted(
            (int(info.key[len(prefix) : -4]), info.size)
            for info in listed
            if info.key.endswith(".kfs") and info.key[len(prefix) : -4].isdigit()
        )
        ends = [base for base, _ in objects[1:]] + [cleaned.upto] if objects else []
        self._remember_cleaned(
            (topic, topic_id, partition),
            cleaned,
            [
                SegmentLocation(base, cleaned.epoch, size, False, end, cleaned.generation)
                for (base, size), end in zip(objects, ends, strict=True)
                if base < cleaned.upto
            ],
        )
        found = self._known_cleaned(topic, topic_id, partition, state, offset)
        if found is None:
            raise ObjectGone(f"no cleaned object of {topic}-{partition} holds offset {offset}")
        return found

    def _remember_cleaned(
        self, where: tuple[str, str, int], cleaned: Cleaned, objects: list[SegmentLocation]
    ) -> None:
        """Keep ``where``'s listing (replacing its older generation's), evicting the least
        recently read partition's beyond ``MAX_CLEANED_LISTINGS``: memory stays bounded over
        a broker's life however many compacted partitions and generations it served."""
        self._cleaned[where] = (cleaned, objects)
        self._cleaned.move_to_end(where)
        while len(self._cleaned) > MAX_CLEANED_LISTINGS:
            self._cleaned.popitem(last=False)

    @property
    def cleaned_listings(self) -> int:
        """How many partitions' cleaned-object listings are kept (bounded)."""
        return len(self._cleaned)

    def _known_cleaned(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, offset: int
    ) -> SegmentLocation | None:
        where = (topic, topic_id, partition)
        known = self._cleaned.get(where)
        if known is None:
            return None
        if known[0] != state.cleaned:
            if state.cleaned is not None and known[0].generation < state.cleaned.generation:
                del self._cleaned[where]  # superseded: it is never read again
            return None
        self._cleaned.move_to_end(where)
        for location in known[1]:
            if location.base <= offset < location.end:
                return location
        return None

    def _known_location(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, offset: int
    ) -> SegmentLocation | None:
        if state.cleaned is not None and offset < state.cleaned.upto:
            return self._known_cleaned(topic, topic_id, partition, state, offset)
        recent = _recent_location(state, offset)
        if recent is not None:
            return recent
        listing = self._listings.get((topic, topic_id, partition))
        return None if listing is None else _covering(listing, state, offset)

    async def _locate(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, offset: int
    ) -> SegmentLocation:
        if state.cleaned is not None and offset < state.cleaned.upto:
            return await self._cleaned_location(topic, topic_id, partition, state, offset)
        recent = _recent_location(state, offset)
        if recent is not None:
            return recent
        listing_key = (topic, topic_id, partition)
        listing = self._listings.get(listing_key)
        for attempt in range(2):
            if listing is None or attempt == 1:
                known = listing.segments if listing is not None else None
                listing = await self._list(topic, topic_id, partition, state, offset, known)
                self._listings[listing_key] = listing
                self._listings.move_to_end(listing_key)
                while len(self._listings) > MAX_LISTINGS:
                    self._listings.popitem(last=False)
            found = _covering(listing, state, offset)
            if found is not None:
                return found
        raise OffsetOutOfRange(f"no committed segment holds offset {offset} of {topic}-{partition}")

    async def _list(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        state: PartitionState,
        offset: int,
        known: list[SegmentLocation] | None,
    ) -> _Listing:
        """The window of committed segments around ``offset``: listed in pages from the highest
        time mark or ``known`` segment below it (or the first object) until a segment after
        ``offset`` shows up.
        Never the whole partition: a week of 100 ms segments is millions of objects, thousands
        of LIST calls and hundreds of MB held per partition."""
        prefix = keys.partition_object_prefix(self._cluster, topic, topic_id, partition)
        start = listing_start(state, offset, known)
        after = None
        if start is not None:
            after = keys.objects_from(prefix, start)
        carried: list[SegmentLocation] = []  # the last segment of the pages before
        while True:
            try:
                page = await self._store.list(prefix, start_after=after, limit=self._list_page)
            except ObjectStoreError as exc:
                raise StorageFailure(str(exc)) from exc
            segments = carried + _committed_locations(page, state)
            if len(page) < self._list_page:
                return _Listing(segments, complete=True, high_watermark=state.high_watermark)
            if segments and segments[-1].base > offset:
                return _Listing(segments, complete=False, high_watermark=state.high_watermark)
            carried = segments[-1:]
            after = page[-1].key

    async def _read_segment(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        location: SegmentLocation,
        offset: int,
        max_bytes: int,
        first: bool,
    ) -> bytes | memoryview:
        segment_key = self._object_key(topic, topic_id, partition, location)
        prefetch = self._prefetching.get(segment_key)
        if prefetch is not None:
            await asyncio.shield(prefetch)
        body = self._cache.get(segment_key)
        METRICS.cache_lookup(hit=body is not None)
        if body is None and (
            location.recent or location.cleaned or location.size <= WHOLE_READ_MAX_BYTES
        ):
            # Consumers read on: one GET of the segment serves the fetches that follow.
            body = await self._get_whole(segment_key)
        if body is not None:
            return _slice_batches(body, 0, offset, max_bytes, first)
        return await self._get_ranged(
            topic, topic_id, partition, location, segment_key, offset, max_bytes, first
        )

    async def _get_whole(self, segment_key: str) -> memoryview:
        try:
            data = await self._store.get(segment_key)
        except ObjectNotFound as exc:
            raise ObjectGone(f"{segment_key} is gone: {exc}") from exc
        except ObjectStoreError as exc:
            raise StorageFailure(str(exc)) from exc
        try:
            body = decode_segment(data).body  # a view: the cache keeps the object, no copy
        except SegmentCorrupt as exc:
            log.error("segment %s is corrupt: %s", segment_key, exc)
            raise StorageFailure(f"segment {segment_key} is corrupt: {exc}") from exc
        self._cache.put(segment_key, body)
        return body

    async def _get_ranged(
        self,
        topic: str,
        topic_id: str,
        partition: int,
        location: SegmentLocation,
        segment_key: str,
        offset: int,
        max_bytes: int,
        first: bool,
    ) -> bytes | memoryview:
        index_key = keys.index_object_key(
            self._cluster, topic, topic_id, partition, location.base, location.epoch
        )
        try:
            index_data = self._cache.get(index_key) or await self._store.get(index_key)
        except ObjectNotFound:
            # Indexes are uploaded after the ack; without one, read the segment whole.
            try:
                body = await self._get_whole(segment_key)
            except StorageFailure:
                return b""  # deleted by retention meanwhile
            return _slice_batches(body, 0, offset, max_bytes, first)
        except ObjectStoreError as exc:
            raise StorageFailure(str(exc)) from exc
        try:
            self._cache.put(index_key, index_data)
            position = position_for_offset(decode_index(index_data), offset)
            body_end = location.size - SEGMENT_FOOTER_SIZE
            end = min(body_end, position + max(max_bytes, 1) + 64 * 1024)
            data = await self._store.get(segment_key, start=position, end=end)
            if first and len(data) >= 12:
                needed = read_header(data).size if len(data) >= 61 else 0
                if needed > len(data):
                    data = await self._store.get(
                        segment_key, start=position, end=min(body_end, position + needed)
                    )
        except ObjectNotFound:
            return b""  # deleted by retention meanwhile
        except ObjectStoreError as exc:
            raise StorageFailure(str(exc)) from exc
        except SegmentCorrupt as exc:
            log.error("index %s is corrupt: %s", index_key, exc)
            raise StorageFailure(f"index {index_key} is corrupt: {exc}") from exc
        sliced = _slice_batches(data, 0, offset, max_bytes, first)
        # A ranged read cannot check the segment's CRC; check each batch's own instead.
        _check_batch_crcs(sliced, segment_key)
        return sliced

    async def aborted_in_range(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, start: int, end: int
    ) -> list[AbortedTxn]:
        """The aborted transactions with records in [start, end): the state's, and those of the
        index objects it spilled that overlap the range (cached; none for recent data)."""
        return await aborted_index.aborted_in_range(
            self._store, self._cache, self._cluster, (topic, topic_id, partition), state, start, end
        )

    async def offset_for_timestamp(
        self, topic: str, topic_id: str, partition: int, state: PartitionState, timestamp: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``timestamp``, or None.

        A scan of batch headers (only batches that may hold the answer are decoded), from the
        partition's time mark below ``timestamp`` rather than from the log start."""
        offset = time_scan_start(state, timestamp)
        while offset < state.high_watermark:
            data = await self.read(topic, topic_id, partition, state, offset, 1 << 20)
            if not data:
                return None
            for position, header in iter_batch_headers(data):
                if header.max_timestamp < timestamp or header.last_offset < offset:
                    continue
                batch = data[position : position + header.size]
                try:
                    records = record_timestamps(batch)
                except InvalidBatch as exc:
                    # Stored as produced but not readable here (corrupt, or a decompression
                    # bomb): its first offset is the earliest that can hold the timestamp.
                    log.warning("timestamps of %s-%d: %s", topic, partition, exc)
                    return max(header.base_offset, offset), header.max_timestamp
                for record_offset, record_timestamp in records:
                    if record_offset >= offset and record_timestamp >= timestamp:
                        return record_offset, record_timestamp
            offset = _next_offset(data)
        return None

    async def offset_for_max_timestamp(
        self, topic: str, topic_id: str, partition: int, state: PartitionState
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with the largest timestamp, or None if empty.

        ListOffsets v7+ asks for it (KIP-734). The partition state knows the largest timestamp
        ever committed: while that record is above the log start, it is the first one at or
        after that timestamp. Otherwise (deleted, or a state from before the maximum was kept)
        a scan of all batch headers; only the winning batch's records are decoded.
        """
        if state.max_timestamp is not None and state.max_timestamp >= 0:
            found = await self.offset_for_timestamp(
                topic, topic_id, partition, state, state.max_timestamp
            )
            if found is not None and found[1] == state.max_timestamp:
                return found
        best_timestamp, best_batch = -1, b""
        offset = state.log_start_offset
        while offset < state.high_watermark:
            data = await self.read(topic, topic_id, partition, state, offset, 1 << 20)
            if not data:
                break
            for position, header in iter_batch_headers(data):
                if header.last_offset < state.log_start_offset:
                    continue
                if header.max_timestamp > best_timestamp or not best_batch:
                    best_timestamp = header.max_timestamp
                    best_batch = bytes(data[position : position + header.size])
            offset = _next_offset(data)
        if not best_batch:
            return None
        try:
            records = record_timestamps(best_batch)
        except InvalidBatch as exc:
            log.warning("timestamps of %s-%d: %s", topic, partition, exc)
            first = max(read_header(best_batch).base_offset, state.log_start_offset)
            return first, best_timestamp
        live = [
            (record_offset, record_timestamp)
            for record_offset, record_timestamp in records
            if record_offset >= state.log_start_offset
        ]
        if not live:
            return None
        top = max(record_timestamp for _, record_timestamp in live)
        return next((o, t) for o, t in live if t == top)

    def forget(self, topic: str) -> None:
        for key in [k for k in self._listings if k[0] == topic]:
            del self._listings[key]
        for cleaned_key in [k for k in self._cleaned if k[0] == topic]:
            del self._cleaned[cleaned_key]


def committed_objects(
    state: PartitionState, objects: list[ObjectInfo]
) -> list[tuple[int, int, ObjectInfo]]:
    """``(base offset, epoch, object)`` of the listed segments holding committed data, oldest
    first; uploads that were never committed (a fenced writer's) are left out."""
    found = []
    for info in objects:
        parsed = keys.parse_object_name(info.key)
        if parsed is not None and parsed[2] == "kfs" and is_committed_segment(state, *parsed[:2]):
            found.append((parsed[0], parsed[1], info))
    return sorted(found, key=lambda item: item[0])


def _committed_locations(objects: list[ObjectInfo], state: PartitionState) -> list[SegmentLocation]:
    return [
        SegmentLocation(base, epoch, info.size, recent=False)
        for base, epoch, info in committed_objects(state, objects)
    ]


def _recent_location(state: PartitionState, offset: int) -> SegmentLocation | None:
    upto = state.cleaned.upto if state.cleaned is not None else 0
    for ref in reversed(state.segments):
        if ref.base <= offset <= ref.last and ref.base >= upto:
            return SegmentLocation(ref.base, ref.epoch, ref.size, recent=True, end=ref.last + 1)
    return None


def _covering(listing: _Listing, state: PartitionState, offset: int) -> SegmentLocation | None:
    """The listed segment holding ``offset``, with where it ends when that is known; None when
    the window cannot tell (list again)."""
    segments = listing.segments
    candidates = [s for s in segments if s.base <= offset]
    if not candidates:
        return None
    chosen = candidates[-1]
    later = [s.base for s in segments if s.base > chosen.base]
    if later:
        end = min(later)
    elif listing.complete:
        # The last segment committed when the window was listed, unless one named in the
        # state (committed since) follows it.
        newer = [r.base for r in state.segments if r.base > chosen.base]
        end = min([listing.high_watermark, *newer])
    else:
        return None  # the window ends at ``chosen``: a segment after it may hold the offset
    if offset >= end:
        return None  # held by a segment committed after the listing, or beyond the log
    return SegmentLocation(chosen.base, chosen.epoch, chosen.size, chosen.recent, end)


def _slice_batches(
    body: bytes | memoryview, start: int, offset: int, max_bytes: int, first: bool
) -> bytes | memoryview:
    """Batches from the one containing ``offset``: whole ones, within ``max_bytes``."""
    begin = None
    end = start
    for position, header in iter_batch_headers(body, start):
        if header.last_offset < offset:
            continue
        if begin is None:
            begin = position
        elif position + header.size - begin > max_bytes:
            break
        end = position + header.size
        if not first and end - begin > max_bytes:
            end = position
            break
    if begin is None or end <= begin:
        return b""
    return body[begin:end]


_BATCH_CRC_START = 21  # the CRC32C covers attributes .. end of the batch


def _check_batch_crcs(data: bytes | memoryview, segment_key: str) -> None:
    for position, header in iter_batch_headers(data):
        end = position + header.size
        if crc32c.crc32c(data[position + _BATCH_CRC_START : end]) != header.crc:
            log.error("segment %s: batch at offset %d is corrupt", segment_key, header.base_offset)
            raise StorageFailure(f"segment {segment_key}: batch {header.base_offset} is corrupt")


def _next_offset(data: bytes | memoryview) -> int:
    last = -1
    for _, header in iter_batch_headers(data):
        last = header.last_offset
    return last + 1
