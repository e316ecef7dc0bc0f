"""The segment and index codec: the byte layout of the objects a partition flushes (DESIGN §5).

Pure functions, no I/O. The layout is the Go KafScale's, so its segment readers can read ours.
All integers are big-endian.

Segment object::

    header  32 B   magic "KAFS" | u16 version=1 | u16 flags=0 | i64 base offset
                   | i32 record count | i64 created-at ms | u32 reserved=0
    body           the Kafka v2 record batches, byte for byte as received (offsets assigned)
    footer  16 B   u32 CRC32C(body) | i64 last offset | magic "END!"

Index object (sparse; one entry for the first batch, then one per ``interval`` bytes)::

    header  16 B   magic "IDX\\0" | u16 version=1 | i32 entry count | i32 interval | u16 reserved=0
    entries 12 B   i64 batch base offset | i32 absolute position of that batch in the segment

Batches are never re-encoded: only the fixed-position fields of the v2 batch header are read
(base offset, batch length, magic, last offset delta, record count), so compressed batches pass
through untouched.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import crc32c

SEGMENT_MAGIC = b"KAFS"
FOOTER_MAGIC = b"END!"
INDEX_MAGIC = b"IDX\x00"
SEGMENT_VERSION = 1
INDEX_VERSION = 1

_HEADER = struct.Struct(">4sHHqiqI")
_FOOTER = struct.Struct(">Iq4s")
_INDEX_HEADER = struct.Struct(">4sHiiH")
_INDEX_ENTRY = struct.Struct(">qi")

SEGMENT_HEADER_SIZE = _HEADER.size  # 32
SEGMENT_FOOTER_SIZE = _FOOTER.size  # 16
INDEX_HEADER_SIZE = _INDEX_HEADER.size  # 16
INDEX_ENTRY_SIZE = _INDEX_ENTRY.size  # 12

# Kafka v2 record batch: fixed header fields at fixed positions.
BATCH_LOG_OVERHEAD = 12  # baseOffset (8) + batchLength (4): bytes not counted by batchLength
BATCH_HEADER_SIZE = 61  # everything up to and including recordCount
_BATCH_BASE_OFFSET = struct.Struct(">q")  # at 0
_BATCH_LEADER_EPOCH = struct.Struct(">i")  # at 12
_BATCH_LENGTH = struct.Struct(">i")  # at 8
_BATCH_MAGIC_POS = 16
_BATCH_LAST_OFFSET_DELTA = struct.Struct(">i")  # at 23
_BATCH_RECORD_COUNT = struct.Struct(">i")  # at 57

_I32_MAX = 2**31 - 1

Buffer = bytes | bytearray | memoryview


class SegmentCorrupt(ValueError):
    """A segment or index object does not have the DESIGN §5 layout or fails its CRC."""


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """The fields of a v2 batch header the log needs, read from fixed positions."""

    base_offset: int
    last_offset: int
    record_count: int
    size: int  # whole batch, 12 + batchLength


@dataclass(frozen=True, slots=True)
class EncodedSegment:
    segment: bytearray | memoryview
    index: bytes
    base_offset: int
    last_offset: int
    record_count: int


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    version: int
    flags: int
    base_offset: int
    record_count: int
    created_at_ms: int


@dataclass(frozen=True, slots=True)
class DecodedSegment:
    """A verified segment; ``body`` is a zero-copy view of the concatenated batches."""

    header: SegmentHeader
    last_offset: int
    crc: int
    body: memoryview

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def record_count(self) -> int:
        return self.header.record_count

    @property
    def created_at_ms(self) -> int:
        return self.header.created_at_ms


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """Sparse index: parallel tuples, ascending, so lookups are one bisect."""

    interval: int
    base_offsets: tuple[int, ...]
    positions: tuple[int, ...]


# --- batches ----------------------------------------------------------------------------------


def read_batch_info(batch: Buffer, at: int = 0) -> BatchInfo:
    """Offsets, count and size of the v2 batch starting at ``at``; ValueError if malformed."""
    if len(batch) - at < BATCH_HEADER_SIZE:
        raise ValueError(f"record batch shorter than its {BATCH_HEADER_SIZE}-byte header")
    (batch_length,) = _BATCH_LENGTH.unpack_from(batch, at + 8)
    if batch_length < BATCH_HEADER_SIZE - BATCH_LOG_OVERHEAD:
        raise ValueError(f"record batch length {batch_length} is too small")
    if batch[at + _BATCH_MAGIC_POS] != 2:
        raise ValueError(f"record batch magic {batch[at + _BATCH_MAGIC_POS]} is not 2")
    (base_offset,) = _BATCH_BASE_OFFSET.unpack_from(batch, at)
    (delta,) = _BATCH_LAST_OFFSET_DELTA.unpack_from(batch, at + 23)
    (count,) = _BATCH_RECORD_COUNT.unpack_from(batch, at + 57)
    return BatchInfo(base_offset, base_offset + delta, count, BATCH_LOG_OVERHEAD + batch_length)


def iter_batches(body: Buffer, start: int = 0) -> Iterator[tuple[int, int, memoryview]]:
    """Yield ``(base offset, last offset, batch view)`` for the batches concatenated in ``body``.

    Stops quietly at a truncated tail (a ranged read that ends mid-batch, or trailing bytes too
    short to hold a batch such as a footer), so callers can read a prefix of a segment. A batch
    header that cannot be right (length too small, magic not 2) raises SegmentCorrupt: the
    reader is not at a batch boundary.
    """
    view = memoryview(body)
    position = start
    while len(view) - position >= BATCH_HEADER_SIZE:
        try:
            info = read_batch_info(view, position)
        except ValueError as exc:
            raise SegmentCorrupt(f"bad record batch at byte {position}: {exc}") from exc
        end = position + info.size
        if end > len(view):
            return
        yield info.base_offset, info.last_offset, view[position:end]
        position = end


# --- encoding ---------------------------------------------------------------------------------


def encode_segment(
    batches: Sequence[Buffer],
    created_at_ms: int,
    index_interval_bytes: int,
    *,
    base_offsets: Sequence[int] | None = None,
    leader_epoch: int | None = None,
    allocate: Callable[[int], bytearray | memoryview] = bytearray,
) -> EncodedSegment:
    """Build the segment and index objects for ``batches``.

    Each element must be exactly one v2 batch; offsets must increase from batch to batch. With
    ``base_offsets`` (one per batch) the batches are the producer's bytes as received, and each
    is stamped with its assigned base offset and ``leader_epoch`` as it is copied into the
    segment: neither field is covered by the batch CRC, and stamping here saves a copy of
    every produced byte. Without them the batches already carry their offsets.
    """
    if not batches:
        raise ValueError("a segment needs at least one record batch")
    if index_interval_bytes < 1:
        raise ValueError("index_interval_bytes must be positive")
    infos = [_checked_info(batch) for batch in batches]
    if base_offsets is not None:
        infos = [_assigned(info, base) for info, base in zip(infos, base_offsets, strict=True)]
    _check_increasing(infos)
    index_entries = _index_entries(infos, index_interval_bytes)
    body_size = sum(info.size for info in infos)
    if SEGMENT_HEADER_SIZE + body_size + SEGMENT_FOOTER_SIZE > _I32_MAX:
        raise ValueError("segment too large for i32 index positions")
    record_count = sum(info.record_count for info in infos)
    base_offset, last_offset = infos[0].base_offset, infos[-1].last_offset
    segment = allocate(SEGMENT_HEADER_SIZE + body_size + SEGMENT_FOOTER_SIZE)
    _HEADER.pack_into(
        segment, 0, SEGMENT_MAGIC, SEGMENT_VERSION, 0, base_offset, record_count, created_at_ms, 0
    )
    position = SEGMENT_HEADER_SIZE
    # Copy through a memoryview: assigning bytes or a view to a bytearray slice first copies
    # them into a temporary bytearray (CPython's bytearray_ass_subscript), a second full copy.
    with memoryview(segment) as view:
        for batch, info in zip(batches, infos, strict=True):
            view[position : position + info.size] = batch
            if base_offsets is not None:
                _BATCH_BASE_OFFSET.pack_into(view, position, info.base_offset)
            if leader_epoch is not None:
                _BATCH_LEADER_EPOCH.pack_into(view, position + 12, leader_epoch)
            position += info.size
        crc = crc32c.crc32c(view[SEGMENT_HEADER_SIZE:position])
    _FOOTER.pack_into(segment, position, crc, last_offset, FOOTER_MAGIC)
    return EncodedSegment(
        segment=segment,
        index=encode_index(index_entries, index_interval_bytes),
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=record_count,
    )


def encode_range_segment(
    body: Buffer, base_offset: int, last_offset: int, created_at_ms: int, index_interval_bytes: int
) -> EncodedSegment:
    """A cleaned object (log compaction): the batches in ``body`` (possibly none: every record
    of the range was cleaned away) stamped with the offset range [base_offset, last_offset] the
    object covers, which its batches need not start or end. Consecutive cleaned objects tile
    the cleaned offsets with no hole, so a reader knows every offset's object."""
    infos = []
    position = 0
    while position < len(body):
        info = read_batch_info(body, position)
        infos.append(info)
        position += info.size
    _check_increasing(infos)
    if infos and (infos[0].base_offset < base_offset or infos[-1].last_offset > last_offset):
        raise ValueError("batches outside the cleaned object's offset range")
    segment = bytearray(SEGMENT_HEADER_SIZE + len(body) + SEGMENT_FOOTER_SIZE)
    record_count = sum(info.record_count for info in infos)
    _HEADER.pack_into(
        segment, 0, SEGMENT_MAGIC, SEGMENT_VERSION, 0, base_offset, record_count, created_at_ms, 0
    )
    segment[SEGMENT_HEADER_SIZE : SEGMENT_HEADER_SIZE + len(body)] = body
    crc = crc32c.crc32c(memoryview(segment)[SEGMENT_HEADER_SIZE : SEGMENT_HEADER_SIZE + len(body)])
    _FOOTER.pack_into(segment, SEGMENT_HEADER_SIZE + len(body), crc, last_offset, FOOTER_MAGIC)
    entries = _index_entries(infos, index_interval_bytes)
    return EncodedSegment(
        segment=segment,
        index=encode_index(entries, index_interval_bytes),
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=record_count,
    )


def _assigned(info: BatchInfo, base_offset: int) -> BatchInfo:
    return BatchInfo(
        base_offset, base_offset + info.last_offset - info.base_offset, info.record_count, info.size
    )


def encode_index(entries: Sequence[tuple[int, int]], interval: int) -> bytes:
    """Index bytes for ``(base offset, absolute position)`` entries."""
    head = _INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, len(entries), interval, 0)
    return head + b"".join(_INDEX_ENTRY.pack(offset, pos) for offset, pos in entries)


def _checked_info(batch: Buffer) -> BatchInfo:
    info = read_batch_info(batch)
    if info.size != len(batch):
        raise ValueError(f"batch length field says {info.size} bytes, got {len(batch)}")
    return info


def _check_increasing(infos: Sequence[BatchInfo]) -> None:
    """Out-of-order batches would make every index lookup wrong; refuse them at write time."""
    for previous, current in itertools.pairwise(infos):
        if current.base_offset <= previous.last_offset:
            raise ValueError(
                f"batch base offset {current.base_offset} does not follow {previous.last_offset}"
            )


def _index_entries(infos: Sequence[BatchInfo], interval: int) -> list[tuple[int, int]]:
    """The first batch, then each batch starting ``interval`` bytes or more after the last."""
    entries: list[tuple[int, int]] = []
    position = SEGMENT_HEADER_SIZE
    for info in infos:
        if not entries or position - entries[-1][1] >= interval:
            entries.append((info.base_offset, position))
        position += info.size
    return entries


# --- decoding ---------------------------------------------------------------------------------


def decode_segment_header(data: Buffer) -> SegmentHeader:
    """The header fields of a segment (the first 32 bytes suffice); checks magic and version."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise SegmentCorrupt(f"segment shorter than its {SEGMENT_HEADER_SIZE}-byte header")
    magic, version, flags, base_offset, count, created, _ = _HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise SegmentCorrupt(f"bad segment magic {magic!r}")
    if version != SEGMENT_VERSION:
        raise SegmentCorrupt(f"unsupported segment version {version}")
    return SegmentHeader(version, flags, base_offset, count, created)


def decode_segment(data: Buffer) -> DecodedSegment:
    """Parse and verify a whole segment object (magics, version, body CRC32C)."""
    header = decode_segment_header(data)
    if len(data) < SEGMENT_HEADER_SIZE + SEGMENT_FOOTER_SIZE:
        raise SegmentCorrupt("segment shorter than its header and footer")
    footer_at = len(data) - SEGMENT_FOOTER_SIZE
    crc, last_offset, footer_magic = _FOOTER.unpack_from(data, footer_at)
    if footer_magic != FOOTER_MAGIC:
        raise SegmentCorrupt(f"bad segment footer magic {footer_magic!r}")
    body = memoryview(data)[SEGMENT_HEADER_SIZE:footer_at]
    actual = crc32c.crc32c(body)
    if actual != crc:
        raise SegmentCorrupt(f"segment body CRC32C {actual:#010x} != footer {crc:#010x}")
    return DecodedSegment(header=header, last_offset=last_offset, crc=crc, body=body)


def decode_index(data: Buffer) -> SegmentIndex:
    """Parse an index object; its entries must be ascending in both offset and position."""
    if len(data) < INDEX_HEADER_SIZE:
        raise SegmentCorrupt(f"index shorter than its {INDEX_HEADER_SIZE}-byte header")
    magic, version, count, interval, _ = _INDEX_HEADER.unpack_from(data, 0)
    if magic != INDEX_MAGIC:
        raise SegmentCorrupt(f"bad index magic {magic!r}")
    if version != INDEX_VERSION:
        raise SegmentCorrupt(f"unsupported index version {version}")
    if count < 0 or len(data) != INDEX_HEADER_SIZE + count * INDEX_ENTRY_SIZE:
        raise SegmentCorrupt(f"index of {len(data)} bytes cannot hold {count} entries")
    pairs = list(_INDEX_ENTRY.iter_unpack(memoryview(data)[INDEX_HEADER_SIZE:]))
    offsets = tuple(offset for offset, _ in pairs)
    positions = tuple(position for _, position in pairs)
    if not (_ascending(offsets) and _ascending(positions)):
        raise SegmentCorrupt("index entries are not in ascending order")
    return SegmentIndex(interval=interval, base_offsets=offsets, positions=positions)


def _ascending(values: tuple[int, ...]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


def position_for_offset(index: SegmentIndex, offset: int) -> int:
    """Absolute position of the last indexed batch with base offset <= ``offset``.

    For an offset before the first entry (or an empty index) this is the first batch: reading
    starts there and skips batches that end before ``offset``.
    """
    i = bisect.bisect_right(index.base_offsets, offset) - 1
    if i < 0:
        return index.positions[0] if index.positions else SEGMENT_HEADER_SIZE
    return index.positions[i]
