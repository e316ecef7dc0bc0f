"""Kafka v2 record batches: the header fields the broker needs, CRC checks, offset stamping.

Batches are stored exactly as the producer sent them, compressed or not. The broker only reads the
fixed header, checks the CRC32C (which covers attributes..end), and writes the base offset and
partition leader epoch, both of which lie outside the CRC. Topics with LogAppendTime timestamps are
the exception: their batches get the append time and a new CRC. Records are decoded only for
timestamp look-ups (ListOffsets by time), where the batch's max timestamp is not precise enough.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import cramjam
import crc32c

# baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32, attributes i16,
# lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64, producerEpoch i16,
# baseSequence i32, recordCount i32
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = _HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength precede the length-counted part
_CRC_START = 21
_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40  # KIP-534: the base timestamp holds the batch's delete horizon
NO_PRODUCER_ID = -1


class InvalidBatch(Exception):
    """The bytes are not a well-formed v2 record batch (maps to CORRUPT_MESSAGE)."""


class RecordsTooLarge(InvalidBatch):
    """A batch whose records decompress to more than the bound they are read within
    (``MAX_DECOMPRESSED_BYTES``): refused where a client sends it, kept as it is by the log
    cleaner (it may have been stored before its topic was compacted)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        return self.base_sequence + self.last_offset_delta

    @property
    def compression(self) -> int:
        return self.attributes & _COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """The delete horizon the log cleaner wrote (KIP-534), None if it wrote none: its
        tombstones and its marker may go once the clock passes it. The base timestamp field
        holds it; record timestamps stay base timestamp + delta for every reader."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None


_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = _CRC_START  # the CRC covers the batch from its attributes on
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35
_CRC = struct.Struct(">I")
_CRC_AT = 17


def with_log_append_time(
    batch: bytes | memoryview, append_ms: int
) -> tuple[memoryview, BatchHeader]:
    """A copy of ``batch`` whose records all carry ``append_ms`` (``message.timestamp.type`` =
    LogAppendTime), and its header: the timestamp-type attribute set, the max timestamp
    replaced and the CRC computed again, as Kafka does; the records' own deltas stay."""
    stamped = bytearray(batch)
    view = memoryview(stamped)
    attributes = read_header(view).attributes | _TIMESTAMP_TYPE_BIT
    _ATTRIBUTES.pack_into(stamped, _ATTRIBUTES_AT, attributes)
    _MAX_TIMESTAMP.pack_into(stamped, _MAX_TIMESTAMP_AT, append_ms)
    _CRC.pack_into(stamped, _CRC_AT, crc32c.crc32c(view[_CRC_START:]))
    return view, read_header(view)


def read_header(data: bytes | memoryview, position: int = 0) -> BatchHeader:
    if len(data) - position < HEADER_SIZE:
        raise InvalidBatch("record batch shorter than its header")
    return BatchHeader(*_HEADER.unpack_from(data, position))


def split_batches(records: bytes | memoryview) -> list[memoryview]:
    """The batches of a produce request's records field, each validated (magic, size, CRC).

    Views into ``records``, not copies: the one copy of a batch is made when it is stamped.
    """
    records = memoryview(records)
    batches = []
    position = 0
    while position < len(records):
        header = read_header(records, position)
        end = position + header.size
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or end > len(records):
            raise InvalidBatch("record batch length exceeds the records field")
        if header.magic != 2:
            raise InvalidBatch(f"unsupported record batch magic {header.magic}")
        if header.record_count < 1 or header.last_offset_delta < header.record_count - 1:
            raise InvalidBatch("record batch with inconsistent record count")
        batch = records[position:end]
        if crc32c.crc32c(batch[_CRC_START:]) != header.crc:
            raise InvalidBatch("record batch CRC mismatch")
        batches.append(batch)
        position = end
    if not batches:
        raise InvalidBatch("produce request without record batches")
    return batches


def iter_batch_headers(
    data: bytes | memoryview, start: int = 0
) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each complete batch in concatenated batch bytes."""
    position = start
    while len(data) - position >= HEADER_SIZE:
        header = read_header(data, position)
        if header.size < HEADER_SIZE or position + header.size > len(data):
            return
        yield position, header
        position += header.size


def batches_below(data: bytes, end_offset: int) -> bytes:
    """The leading whole batches of ``data`` whose base offset is below ``end_offset``."""
    cut = 0
    for position, header in iter_batch_headers(data):
        if header.base_offset >= end_offset:
            break
        cut = position + header.size
    return data if cut == len(data) else data[:cut]


def next_offset_after(data: bytes | memoryview, default: int) -> int:
    """The offset after the last whole batch of ``data`` (``default`` if there is none)."""
    end = default
    for _, header in iter_batch_headers(data):
        end = header.last_offset + 1
    return end


# --- record decoding (timestamp look-ups only) -----------------------------------------------


def record_timestamps(batch: bytes | memoryview) -> list[tuple[int, int]]:
    """(offset, timestamp ms) of every record in the batch, decompressing as needed; raises
    InvalidBatch if the records cannot be read (corrupt, or decompressing past the limit)."""
    header = read_header(batch)
    if header.attributes & _TIMESTAMP_TYPE_BIT:  # LogAppendTime: one time for the batch
        return [(header.base_offset + i, header.max_timestamp) for i in range(header.record_count)]
    body = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    result = []
    position = 0
    try:
        for _ in range(header.record_count):
            position, end = _record_bounds(body, position)
            position += 1  # attributes
            timestamp_delta, position = read_varint(body, position)
            offset_delta, position = read_varint(body, position)
            result.append(
                (header.base_offset + offset_delta, header.base_timestamp + timestamp_delta)
            )
            position = end
    except IndexError as exc:
        raise InvalidBatch("a record runs past the end of its batch") from exc
    return result


def has_null_key(batch: bytes | memoryview) -> bool:
    """Whether some record of the batch has no key: a compacted topic refuses those."""
    return bool(null_key_indexes(batch))


def null_key_indexes(batch: bytes | memoryview) -> list[int]:
    """The indexes (in the batch) of its records without a key, decompressing as needed: Kafka
    names each in the produce response's ``record_errors``. InvalidBatch if the records cannot
    be read."""
    header = read_header(batch)
    body = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    position = 0
    keyless = []
    try:
        for index in range(header.record_count):
            position, end = _record_bounds(body, position)
            position += 1  # attributes
            _, position = read_varint(body, position)  # timestamp delta
            _, position = read_varint(body, position)  # offset delta
            key_length, position = read_varint(body, position)
            if key_length < 0:
                keyless.append(index)
            position = end
    except IndexError as exc:
        raise InvalidBatch("a record runs past the end of its batch") from exc
    return keyless


def _record_bounds(body: bytes, position: int) -> tuple[int, int]:
    """Where the record at ``position`` starts (after its length) and ends. Its length must be
    positive and within ``body``: a zero or negative one would make the next record start at
    or before this one, and a batch claiming 2**31 records would then be read for hours (or,
    for ``record_timestamps``, fill memory) from a few bytes a client sent."""
    length, position = read_varint(body, position)
    end = position + length
    if length < 1 or end > len(body):
        raise InvalidBatch("a record's length does not fit its batch")
    return position, end


MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024
"""The most one batch's records may take once decompressed where the broker reads them
(timestamp checks and look-ups). A few kilobytes of zstd can claim gigabytes: decompressed
whole, such a batch would take the broker down (the stored bytes are never decompressed)."""
_FIRST_GUESS_BYTES = 64 * 1024


def decompress(codec: int, data: bytes, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    if codec == 0:
        return data
    if codec == 2:
        return _snappy_decompress(data, limit)
    module = {1: cramjam.gzip, 3: cramjam.lz4, 4: cramjam.zstd}.get(codec)
    if module is None:
        raise InvalidBatch(f"unknown compression codec {codec}")
    return _decompress_bounded(module.decompress_into, data, limit)


def _decompress_bounded(
    decompress_into: Callable[[bytes, bytearray], int], data: bytes, limit: int
) -> bytes:
    """Into a buffer that grows fourfold while too small, up to ``limit``: the output's size is
    not known beforehand (gzip and LZ4 frames need not say), and is never trusted."""
    size = min(limit, max(_FIRST_GUESS_BYTES, 8 * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = decompress_into(data, out)
        except cramjam.DecompressionError as exc:
            too_small = "buffer" in str(exc)
            if not too_small or size >= limit:
                if too_small:
                    raise RecordsTooLarge(
                        f"records cannot be decompressed: more than {limit} bytes"
                    ) from exc
                raise InvalidBatch(f"records cannot be decompressed: {exc}") from exc
            size = min(limit, size * 4)
            continue
        return bytes(memoryview(out)[:written])


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    """Kafka's Java client frames snappy the xerial way; librdkafka may send it raw. Raw snappy
    states its output length first, which is checked against what is left of ``limit``."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_raw(data, limit, limit)
    position = 16
    chunks = []
    left = limit
    while position < len(data):
        if position + 4 > len(data):  # a struct.error would escape as an unexpected error
            raise InvalidBatch("xerial snappy chunk without its length")
        (length,) = struct.unpack_from(">i", data, position)
        position += 4
        chunk = _snappy_raw(data[position : position + length], left, limit)
        left -= len(chunk)
        chunks.append(chunk)
        position += length
    return b"".join(chunks)


def _snappy_raw(data: bytes, room: int, limit: int) -> bytes:
    try:
        size, _ = read_uvarint(data, 0)
    except IndexError as exc:
        raise InvalidBatch("snappy block without its length") from exc
    if size > room:
        raise RecordsTooLarge(f"records cannot be decompressed: more than {limit} bytes")
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as exc:
        raise InvalidBatch(f"records cannot be decompressed: {exc}") from exc


def read_uvarint(data: bytes, position: int) -> tuple[int, int]:
    """An unsigned varint and the position after it (IndexError past the end of ``data``).
    At most 10 bytes, as Kafka reads a varlong: an unbounded run of continuation bytes would
    build an ever larger int, quadratic in its length (hours for a megabyte a client sent)."""
    shift = value = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift >= _MAX_VARINT_SHIFT:
            raise InvalidBatch("a varint longer than 10 bytes")


_MAX_VARINT_SHIFT = 70  # 10 bytes of 7 bits


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag signed varint and the position after it."""
    raw, position = read_uvarint(data, position)
    return (raw >> 1) ^ -(raw & 1), position
