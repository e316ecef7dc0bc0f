"""Kafka v2 record batches: the header fields the broker needs, CRC checks, offset stamping.

Batches are stored exactly as the producer sent them, compressed or not. The broker only reads the
fixed header, checks the CRC32C (which covers attributes..end), and writes the base offset and
partition leader epoch, both of which lie outside the CRC. Topics with LogAppendTime timestamps are
the exception: their batches get the append time and a new CRC. Records are decoded only for
timestamp look-ups (ListOffsets by time), where the batch's max timestamp is not precise enough.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
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
NO_PRODUCER_ID = -1


class InvalidBatch(Exception):
    """The bytes are not a well-formed v2 record batch (maps to CORRUPT_MESSAGE)."""


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


# --- record decoding (timestamp look-ups only) -----------------------------------------------


def record_timestamps(batch: bytes | memoryview) -> list[tuple[int, int]]:
    """(offset, timestamp ms) of every record in the batch, decompressing as needed."""
    header = read_header(batch)
    if header.attributes & _TIMESTAMP_TYPE_BIT:  # LogAppendTime: one time for the batch
        return [(header.base_offset + i, header.max_timestamp) for i in range(header.record_count)]
    body = decompress(header.compression, bytes(batch[HEADER_SIZE : header.size]))
    result = []
    position = 0
    for _ in range(header.record_count):
        length, position = _read_varint(body, position)
        end = position + length
        position += 1  # attributes
        timestamp_delta, position = _read_varint(body, position)
        offset_delta, position = _read_varint(body, position)
        result.append((header.base_offset + offset_delta, header.base_timestamp + timestamp_delta))
        position = end
    return result


def decompress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return bytes(cramjam.gzip.decompress(data))
    if codec == 2:
        return _snappy_decompress(data)
    if codec == 3:
        return bytes(cramjam.lz4.decompress(data))
    if codec == 4:
        return bytes(cramjam.zstd.decompress(data))
    raise InvalidBatch(f"unknown compression codec {codec}")


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _snappy_decompress(data: bytes) -> bytes:
    """Kafka's Java client frames snappy the xerial way; librdkafka may send it raw."""
    if not data.startswith(_XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    position = 16
    chunks = []
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position)
        position += 4
        chunks.append(bytes(cramjam.snappy.decompress_raw(data[position : position + length])))
        position += length
    return b"".join(chunks)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag signed varint and the position after it."""
    shift = 0
    raw = 0
    while True:
        byte = data[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), position
