"""The log cleaner's record-level core: which records of a compacted partition stay.

Pure (bytes in, bytes out, no I/O, no asyncio), so a pass can run in a worker thread. A pass over
[log start, dirty end) goes, as Kafka's LogCleaner does:

1. Build an :class:`OffsetMap` over the *dirty* section only: call :func:`index_batches` once per
   input segment, in offset order, from the first dirty offset (the previous pass's ``upto``, or
   the log start) up to the dirty end. It adds a segment's keys only if they all fit; when it
   returns False the map is unchanged and the pass's dirty end becomes that segment's base
   offset (if not even the first dirty segment fits, the map is too small: skip the pass).
2. Call :func:`clean_batches` on every input of [log start, dirty end), in offset order: the
   previous generation's cleaned objects and the dirty segments alike, with one
   :class:`DeleteClock` (the pass's time, for tombstones' and markers' delete horizons) and one
   :class:`TxnMarkers` for the whole pass (it follows each producer's transaction from its
   records to its marker, which may lie in a later input). Without one, markers all stay and the
   order does not matter.

A key absent from the map keeps its record (Kafka's rule): below the first dirty offset every key
is unique already (the previous pass left one record per key), so only the dirty section's keys
need a map entry, and the map's bound applies to the keys written since the last pass, not to
every key of the partition. Indexing from the log start instead gives the same result with a
larger map.

Bad input (a bad CRC, a truncated batch, malformed records) raises ``InvalidBatch`` naming the
batch's offset, before any output is returned: log it and skip the pass. A batch whose records
decompress past ``record_batch.MAX_DECOMPRESSED_BYTES`` is not bad input (a topic compacted later
may hold one) and must not stop cleaning its partition for good: it is kept whole, its keys hide
no older record, and a warning names it.

Cost: every record is read in Python, twice per pass (index, then clean): a few microseconds a
record, holding the GIL (in a worker thread the event loop still gets it every switch interval;
the arguments pickle, so a process pool works too). Pass one :class:`AbortedRanges` to all the
calls of a pass rather than the list, which each call would otherwise index again.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import NamedTuple

from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.protocol.batch_filter import (
    RecordSpan,
    StoredBatch,
    batch_records,
    iter_stored_batches,
    rebuild_batch,
)
from kafscale.broker.protocol.control_batch import ABORT, marker_type
from kafscale.broker.protocol.record_batch import BatchHeader, InvalidBatch, RecordsTooLarge

__all__ = [
    "KEY_DIGEST_BYTES",
    "AbortedRanges",
    "DeleteClock",
    "InvalidBatch",
    "OffsetMap",
    "TxnMarkers",
    "clean_batches",
    "index_batches",
    "key_digest",
]

KEY_DIGEST_BYTES = 16
LONG_MAX = (1 << 63) - 1  # the largest delete horizon a batch's base timestamp can hold

log = logging.getLogger(__name__)


def key_digest(key: bytes) -> bytes:
    """A 16-byte blake2b digest of ``key``: map entries of a fixed, small size whatever the
    keys' length. A collision (odds ~1e-21 among a billion keys) would drop one key's record,
    as it would in Kafka's cleaner."""
    return hashlib.blake2b(key, digest_size=KEY_DIGEST_BYTES).digest()


class DeleteClock(NamedTuple):
    """When a pass runs and the topic's ``delete.retention.ms``: what tombstones and removable
    transaction markers are judged by, as Kafka 3.1+ (KIP-534) does. A pass that keeps one in a
    batch without a delete horizon writes the horizon ``now_ms + delete_retention_ms`` into that
    batch; a later pass removes it once ``now_ms`` reaches the horizon. A batch cleaned before
    horizons existed has none, so its tombstones count as first seen now (Kafka's upgrade)."""

    now_ms: int
    delete_retention_ms: int

    @property
    def new_horizon_ms(self) -> int:
        """``now_ms + delete_retention_ms``, at most Long.MAX_VALUE: a retention of Long.MAX
        (a valid ``delete.retention.ms``, "keep tombstones for good") gives a horizon no clock
        passes, where the sum would not fit the batch's 64-bit base timestamp field."""
        return min(self.now_ms + self.delete_retention_ms, LONG_MAX)

    def passed(self, header: BatchHeader) -> bool:
        """Whether ``header``'s batch has a delete horizon and it has passed."""
        horizon = header.delete_horizon_ms
        return horizon is not None and self.now_ms >= horizon


class MarkerFate(Enum):
    """What a pass does with one transaction marker (a control batch)."""

    KEEP = "keep"  # as it is
    STAMP = "stamp"  # removable, but first gets a delete horizon (it stays until then)
    REMOVE = "remove"


class OffsetMap:
    """Key digest -> offset of the key's latest record in the dirty section, bounded to
    ``max_keys`` entries (about 150 bytes each in CPython: budget ~150 MB per million keys)."""

    def __init__(self, max_keys: int) -> None:
        if max_keys < 1:
            raise ValueError("an offset map needs room for at least one key")
        self.max_keys = max_keys
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    def full(self) -> bool:
        return len(self._offsets) >= self.max_keys

    def get(self, digest: bytes) -> int | None:
        return self._offsets.get(digest)

    @property
    def room(self) -> int:
        """How many more keys fit."""
        return self.max_keys - len(self._offsets)

    def update(self, latest: dict[bytes, int]) -> None:
        """Adds ``latest`` (digest -> offset; the newer offset wins). The caller checked that
        its new keys fit (``index_batches`` counts them as it goes)."""
        if sum(1 for digest in latest if digest not in self._offsets) > self.room:
            raise ValueError("the keys do not fit the offset map")
        for digest, offset in latest.items():
            if offset > self._offsets.get(digest, -1):
                self._offsets[digest] = offset


class AbortedRanges:
    """The aborted transactions of a partition, looked up by producer: a transactional batch
    lies in one if its producer's first offset <= its base offset < the abort marker's."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        by_producer: dict[int, list[tuple[int, int]]] = {}
        for txn in aborted:
            by_producer.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
        self._ranges = {pid: sorted(r) for pid, r in by_producer.items()}
        self._starts = {pid: [first for first, _ in r] for pid, r in self._ranges.items()}

    def contains(self, header: BatchHeader) -> bool:
        ranges = self._ranges.get(header.producer_id)
        if not header.is_transactional or ranges is None:
            return False
        at = bisect.bisect_right(self._starts[header.producer_id], header.base_offset) - 1
        return at >= 0 and header.base_offset < ranges[at][1]


class TxnMarkers:
    """Which commit and abort markers a pass removes, as Kafka's ``CleanedTransactionMetadata``
    and ``LogCleaner`` decide: a marker is *removable* once the transaction it ends has no
    record left (an aborted one's records are all dropped; a committed one's all superseded).
    A removable marker without a delete horizon gets one (:class:`DeleteClock`) and stays; one
    whose horizon has passed goes.

    The inputs of a pass are read in offset order and a transaction's records all precede its
    marker, so one set suffices: the producers with a record kept since their last marker.

    An abort marker at or after ``keep_aborts_from`` stays whatever its age: its aborted-
    transaction entry is in an index object the pass's commit cannot drop, and a reader told of
    an aborted transaction whose marker is gone skips the producer's later transactions too
    (the Java client and librdkafka stop skipping a producer only at its abort marker).
    ``last_removed_abort`` (the highest abort marker removed, -1 if none) lets the commit check
    that every such entry is dropped with it."""

    def __init__(self, keep_aborts_from: int | None = None) -> None:
        self.keep_aborts_from = keep_aborts_from
        self.last_removed_abort = -1
        self.removed = 0
        self._with_records: set[int] = set()

    def records_kept(self, header: BatchHeader) -> None:
        """A batch of ``header``'s producer keeps records: its transaction's marker stays."""
        if header.is_transactional and not header.is_control:
            self._with_records.add(header.producer_id)

    def marker_fate(
        self, batch: StoredBatch, clock: DeleteClock, below_dirty_end: bool
    ) -> MarkerFate:
        """What happens to the control batch ``batch``; it ends its producer's transaction."""
        header = batch.header
        had_records = header.producer_id in self._with_records
        self._with_records.discard(header.producer_id)
        if had_records or not below_dirty_end:
            return MarkerFate.KEEP
        try:
            kind = marker_type(batch.data)
        except InvalidBatch:
            return MarkerFate.KEEP  # not a marker we can read (Kafka keeps unknown ones too)
        if kind == ABORT and self._keeps_abort(header):
            return MarkerFate.KEEP
        if header.delete_horizon_ms is None:
            return MarkerFate.STAMP
        if not clock.passed(header):
            return MarkerFate.KEEP
        if kind == ABORT:
            self.last_removed_abort = max(self.last_removed_abort, header.base_offset)
        self.removed += 1
        return MarkerFate.REMOVE

    def _keeps_abort(self, header: BatchHeader) -> bool:
        return self.keep_aborts_from is not None and header.base_offset >= self.keep_aborts_from


def _as_ranges(aborted: Sequence[AbortedTxn] | AbortedRanges) -> AbortedRanges:
    return aborted if isinstance(aborted, AbortedRanges) else AbortedRanges(aborted)


def index_batches(
    batches: bytes | memoryview,
    offset_map: OffsetMap,
    aborted: Sequence[AbortedTxn] | AbortedRanges = (),
) -> bool:
    """Adds the keys of one input segment's batches (``batches``: its body) to ``offset_map``,
    all or none: True if they fit, False (map unchanged) if the map would exceed its bound.
    It stops reading at the first key that does not fit, so its own memory stays within the
    map's bound too (a segment's batches past that point are not checked).

    Data records of committed transactions and of non-transactional producers count; records
    of ``aborted`` transactions never enter the map (they must not shadow an older committed
    value), control batches and records without a key hold no key."""
    ranges = _as_ranges(aborted)
    latest: dict[bytes, int] = {}
    new_keys = 0
    for batch in iter_stored_batches(batches):
        if batch.header.is_control or ranges.contains(batch.header):
            continue
        base = batch.header.base_offset
        try:
            spans = batch_records(batch)[1]
        except RecordsTooLarge:  # kept whole by clean_batches: its keys shadow nothing
            continue
        for span in spans:
            if span.key is None:
                continue
            digest = key_digest(span.key)
            if digest not in latest and offset_map.get(digest) is None:
                new_keys += 1
                if new_keys > offset_map.room:  # stop now: staging stays within the bound
                    return False
            latest[digest] = base + span.offset_delta
    offset_map.update(latest)
    return True


def clean_batches(
    batches: bytes | memoryview,
    offset_map: OffsetMap,
    aborted: Sequence[AbortedTxn] | AbortedRanges = (),
    *,
    clock: DeleteClock,
    dirty_end: int | None = None,
    markers: TxnMarkers | None = None,
) -> bytes:
    """One input's batches with each key's latest record only (offsets never change).

    A record below ``dirty_end`` (all of them if None) stays iff it has a key, no newer record
    of its key is in ``offset_map``, and it is not a tombstone of a batch whose delete horizon
    has passed (``clock``). A batch that keeps a tombstone below ``dirty_end`` and has no
    horizon yet is written again with one (``clock.new_horizon_ms``). Batches of ``aborted``
    transactions are dropped; a batch that loses no record (and needs no horizon) is copied
    byte for byte, one that loses some is rewritten (``batch_filter.rebuild_batch``: same
    offsets, attributes, timestamps, producer fields and codec, new CRC), one that loses all is
    dropped. Records at or after ``dirty_end`` are kept as they are. Control batches
    (transaction markers) stay, unless ``markers`` (the pass's, inputs given in offset order)
    stamps or removes them: see :class:`TxnMarkers`."""
    ranges = _as_ranges(aborted)
    out: list[bytes] = []
    for batch in iter_stored_batches(batches):
        header = batch.header
        below = dirty_end is None or header.base_offset < dirty_end
        if header.is_control:
            out.append(_clean_marker(batch, markers, clock, below))
        elif not below:
            out.append(bytes(batch.data))
            if markers is not None:
                markers.records_kept(header)
        elif not ranges.contains(header):
            kept = _clean_batch(batch, offset_map, clock, dirty_end)
            if kept and markers is not None:
                markers.records_kept(header)
            out.append(kept)
    return b"".join(out)


def _clean_marker(
    batch: StoredBatch, markers: TxnMarkers | None, clock: DeleteClock, below: bool
) -> bytes:
    fate = MarkerFate.KEEP if markers is None else markers.marker_fate(batch, clock, below)
    if fate is MarkerFate.REMOVE:
        return b""
    if fate is MarkerFate.STAMP:
        try:
            body, spans = batch_records(batch)
        except InvalidBatch:
            return bytes(batch.data)  # a control batch we cannot rewrite stays as it is
        return rebuild_batch(batch, body, spans, clock.new_horizon_ms)
    return bytes(batch.data)


def _clean_batch(
    batch: StoredBatch, offset_map: OffsetMap, clock: DeleteClock, dirty_end: int | None
) -> bytes:
    try:
        body, spans = batch_records(batch)
    except RecordsTooLarge as exc:
        log.warning("%s: kept whole, its records are not cleaned", exc)
        return bytes(batch.data)
    base = batch.header.base_offset
    drop_tombstones = clock.passed(batch.header)
    kept = [
        span
        for span in spans
        if _keeps(span, base + span.offset_delta, offset_map, drop_tombstones, dirty_end)
    ]
    if not kept:
        return b""
    if needs_horizon(batch.header, kept, dirty_end):
        return rebuild_batch(batch, body, kept, clock.new_horizon_ms)
    if len(kept) == len(spans):
        return bytes(batch.data)
    return rebuild_batch(batch, body, kept)


def needs_horizon(header: BatchHeader, kept: Sequence[RecordSpan], dirty_end: int | None) -> bool:
    """Whether a pass must give this batch a delete horizon: it has none and keeps a tombstone
    in the cleaned range (Kafka's ``needToSetDeleteHorizon``)."""
    if header.delete_horizon_ms is not None:
        return False
    return any(
        span.is_tombstone
        and (dirty_end is None or header.base_offset + span.offset_delta < dirty_end)
        for span in kept
    )


def _keeps(
    span: RecordSpan,
    offset: int,
    offset_map: OffsetMap,
    drop_tombstones: bool,
    dirty_end: int | None,
) -> bool:
    """The cleaner's decision on one record."""
    if dirty_end is not None and offset >= dirty_end:
        return True
    if span.key is None:  # Kafka's cleaner drops keyless records of a compacted topic too
        return False
    latest = offset_map.get(key_digest(span.key))
    if latest is not None and offset < latest:
        return False
    return not (span.is_tombstone and drop_tombstones)
