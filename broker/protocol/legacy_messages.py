"""Message format v0/v1 ("message sets") in and out: Produce v0-v2 and Fetch v0-v3.

Clients from before Kafka 0.11 send and read message sets instead of v2 record batches. The
broker stores v2 only, so:

- on produce, a message set is parsed, every message's CRC32 checked (a bad one refuses the
  partition with CORRUPT_MESSAGE, as Kafka does), compressed wrapper messages opened (gzip,
  snappy, lz4; v1's inner offsets are relative, v0's absolute: either way only their order
  counts, since the broker assigns offsets) and the messages written as one v2 batch with the
  same keys, values, timestamps (v0 has none: -1, Kafka's NO_TIMESTAMP) and compression codec;
- on fetch, stored v2 batches are turned back into a message set of the client's magic
  (v1 for Fetch v2-v3, v0 for Fetch v0-v1), uncompressed, headers dropped (message sets have
  none; Kafka drops them too) and control batches skipped.

Pure functions on bytes, no I/O.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import cramjam

from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.protocol.record_batch import (
    HEADER_SIZE,
    MAX_DECOMPRESSED_BYTES,
    InvalidBatch,
    decompress,
    iter_batch_headers,
    read_varint,
)

NO_TIMESTAMP = -1
_CODEC_MASK = 0x07
_LOG_APPEND_TIME_BIT = 0x08
_ENTRY = struct.Struct(">qi")  # offset, message size
_MESSAGE_START = struct.Struct(">Ibb")  # crc, magic, attributes
_TIMESTAMP = struct.Struct(">q")
_LENGTH = struct.Struct(">i")
_MIN_MESSAGE = {0: 14, 1: 22}  # crc + magic + attributes (+ timestamp) + key and value lengths


class CorruptMessage(InvalidBatch):
    """A message set that does not parse or fails its CRC: CORRUPT_MESSAGE for the partition."""


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    magic: int
    timestamp: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True, slots=True)
class MessageSet:
    messages: list[LegacyMessage]
    codec: int
    """The compression codec the producer used (the last compressed wrapper's, as Kafka's
    ``sourceCompression``), kept for the stored v2 batch; 0 if none."""


# --- parsing ----------------------------------------------------------------------------------


def parse_message_set(data: bytes | memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> MessageSet:
    """Every message of a produce request's message set, wrappers opened; raises
    ``CorruptMessage`` for anything malformed or an empty set. All wrappers together may
    decompress to at most ``limit`` bytes: many small wrappers that each inflate a lot must not
    take the broker's memory."""
    messages: list[LegacyMessage] = []
    codec = 0
    left = limit
    for magic, attributes, timestamp, key, value in _entries(bytes(data)):
        inner_codec = attributes & _CODEC_MASK
        if inner_codec == 0:
            messages.append(LegacyMessage(magic, timestamp, key, value))
            continue
        codec = inner_codec
        inner = _decompress(inner_codec, magic, value or b"", left)
        left -= len(inner)
        messages.extend(_unwrap(magic, attributes, timestamp, inner))
    if not messages:
        raise CorruptMessage("produce request without messages")
    return MessageSet(messages, codec)


def _unwrap(magic: int, attributes: int, timestamp: int, inner: bytes) -> Iterator[LegacyMessage]:
    """The messages of a compressed wrapper's (decompressed) value; under LogAppendTime the
    wrapper's time holds for all of them (Kafka's rule for v1)."""
    for inner_magic, inner_attributes, inner_timestamp, key, inner_value in _entries(inner):
        if inner_attributes & _CODEC_MASK:
            raise CorruptMessage("a compressed message inside a compressed message")
        if inner_magic != magic:
            raise CorruptMessage("inner message magic differs from its wrapper's")
        if magic == 1 and attributes & _LOG_APPEND_TIME_BIT:
            inner_timestamp = timestamp
        yield LegacyMessage(inner_magic, inner_timestamp, key, inner_value)


Entry = tuple[int, int, int, bytes | None, bytes | None]


def _entries(data: bytes) -> Iterator[Entry]:
    """(magic, attributes, timestamp, key, value) of each message of a message set."""
    position = 0
    while position < len(data):
        if len(data) - position < _ENTRY.size:
            raise CorruptMessage("message set ends inside an entry header")
        _offset, size = _ENTRY.unpack_from(data, position)
        position += _ENTRY.size
        if size < _MIN_MESSAGE[0] or size > len(data) - position:
            raise CorruptMessage(f"message size {size} does not fit the message set")
        yield _message(data[position : position + size])
        position += size


def _message(message: bytes) -> Entry:
    crc, magic, attributes = _MESSAGE_START.unpack_from(message, 0)
    if magic not in (0, 1):
        raise CorruptMessage(f"message magic {magic} in a message set")
    if len(message) < _MIN_MESSAGE[magic]:
        raise CorruptMessage("message shorter than its fixed fields")
    if zlib.crc32(message[4:]) != crc:
        raise CorruptMessage("message CRC mismatch")
    position = _MESSAGE_START.size
    timestamp = NO_TIMESTAMP
    if magic == 1:
        (timestamp,) = _TIMESTAMP.unpack_from(message, position)
        position += _TIMESTAMP.size
    key, position = _bytes(message, position)
    value, position = _bytes(message, position)
    if position != len(message):
        raise CorruptMessage("message size does not match its key and value")
    return magic, attributes, timestamp, key, value


def _bytes(message: bytes, position: int) -> tuple[bytes | None, int]:
    if len(message) - position < _LENGTH.size:
        raise CorruptMessage("message ends inside a length")
    (length,) = _LENGTH.unpack_from(message, position)
    position += _LENGTH.size
    if length < 0:
        return None, position
    if length > len(message) - position:
        raise CorruptMessage("key or value runs past the end of its message")
    return message[position : position + length], position + length


def _decompress(codec: int, magic: int, data: bytes, limit: int) -> bytes:
    """Through the v2 path's bounded decompressors; v0's LZ4 frames carry a header checksum
    computed the wrong way (KAFKA-3160), which is put right before decoding."""
    if codec not in (1, 2, 3):
        raise CorruptMessage(f"compression codec {codec} in a v{magic} message")
    if codec == 3 and magic == 0:
        data = fix_lz4_header_checksum(data)
    try:
        return decompress(codec, data, max(limit, 0))
    except InvalidBatch as exc:
        raise CorruptMessage(str(exc)) from exc


def fix_lz4_header_checksum(frame: bytes) -> bytes:
    """``frame`` with the header checksum byte LZ4 expects (xxh32 of the frame descriptor,
    without the magic number that Kafka's old encoder included)."""
    if len(frame) < 7:
        return frame
    flags = frame[4]
    end = 6 + (8 if flags & 0x08 else 0)  # FLG, BD, optional content size
    if len(frame) <= end:
        return frame
    checksum = (xxh32(frame[4:end]) >> 8) & 0xFF
    return frame[:end] + bytes([checksum]) + frame[end + 1 :]


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _M32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of a short input (under 16 bytes: the LZ4 frame descriptor is at most 10)."""
    if len(data) >= 16:
        raise ValueError("xxh32 here is only for inputs under 16 bytes")
    h = (seed + _P5 + len(data)) & _M32
    position = 0
    while position + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, position)
        h = (_rotl((h + word * _P3) & _M32, 17) * _P4) & _M32
        position += 4
    for byte in data[position:]:
        h = (_rotl((h + byte * _P5) & _M32, 11) * _P1) & _M32
    h ^= h >> 15
    h = (h * _P2) & _M32
    h ^= h >> 13
    h = (h * _P3) & _M32
    return h ^ (h >> 16)


# --- v2 batches out of messages ---------------------------------------------------------------


def to_record_batch(message_set: MessageSet) -> bytes:
    """One v2 batch (base offset 0, no producer id) holding the messages in order."""
    messages = message_set.messages
    base_timestamp = messages[0].timestamp
    records = b"".join(
        encode_record(i, m.timestamp - base_timestamp, m.key, m.value)
        for i, m in enumerate(messages)
    )
    return encode_batch(
        _compress(message_set.codec, records),
        len(messages),
        attributes=message_set.codec,
        base_timestamp=base_timestamp,
        max_timestamp=max(m.timestamp for m in messages),
    )


def _compress(codec: int, records: bytes) -> bytes:
    if codec == 0:
        return records
    if codec == 1:
        return bytes(cramjam.gzip.compress(records))
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(records))
    return bytes(cramjam.lz4.compress(records))


# --- message sets out of stored v2 batches (Fetch v0-v3) --------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRecord:
    offset: int
    timestamp: int
    log_append_time: bool
    key: bytes | None
    value: bytes | None


def down_convert(
    batches: bytes | memoryview, magic: int, fetch_offset: int, max_bytes: int
) -> bytes:
    """A message set of ``magic`` for the records of ``batches`` from ``fetch_offset`` on, at
    most ``max_bytes`` long, but always the first message whole so that a consumer makes
    progress (as KIP-74 has it for v3+; a v0-v2 client would otherwise stall on it).
    Records whose batch cannot be decoded end the set there."""
    out = bytearray()
    for record in stored_records(batches):
        if record.offset < fetch_offset:
            continue
        entry = encode_entry(record, magic)
        if out and len(out) + len(entry) > max_bytes:
            break
        out += entry
        if len(out) >= max_bytes:
            break
    return bytes(out)


def encode_entry(record: StoredRecord, magic: int) -> bytes:
    """One uncompressed message of ``magic`` with its offset and size."""
    attributes = _LOG_APPEND_TIME_BIT if magic == 1 and record.log_append_time else 0
    middle = struct.pack(">bb", magic, attributes)
    if magic == 1:
        middle += _TIMESTAMP.pack(record.timestamp)
    middle += _length_prefixed(record.key) + _length_prefixed(record.value)
    message = struct.pack(">I", zlib.crc32(middle)) + middle
    return _ENTRY.pack(record.offset, len(message)) + message


def _length_prefixed(value: bytes | None) -> bytes:
    return _LENGTH.pack(-1) if value is None else _LENGTH.pack(len(value)) + value


def stored_records(batches: bytes | memoryview) -> Iterator[StoredRecord]:
    """The data records of concatenated v2 batches (control batches skipped)."""
    data = memoryview(batches)
    for position, header in iter_batch_headers(data):
        if header.magic != 2 or header.is_control:
            continue
        try:
            body = decompress(
                header.compression, bytes(data[position + HEADER_SIZE : position + header.size])
            )
            decoded = list(_decode_records(body, header.record_count))
        except (InvalidBatch, IndexError):
            return
        log_append = bool(header.attributes & _LOG_APPEND_TIME_BIT)
        for offset_delta, timestamp_delta, key, value in decoded:
            timestamp = (
                header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
            )
            yield StoredRecord(header.base_offset + offset_delta, timestamp, log_append, key, value)


def _decode_records(
    body: bytes, count: int
) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    position = 0
    for _ in range(count):
        length, position = read_varint(body, position)
        end = position + length
        position += 1  # attributes
        timestamp_delta, position = read_varint(body, position)
        offset_delta, position = read_varint(body, position)
        key, position = _read_varbytes(body, position)
        value, position = _read_varbytes(body, position)
        if length < 1 or end > len(body):  # else a batch's count would repeat one record
            raise IndexError("record runs past its batch")
        yield offset_delta, timestamp_delta, key, value
        position = end


def _read_varbytes(data: bytes, position: int) -> tuple[bytes | None, int]:
    length, position = read_varint(data, position)
    if length < 0:
        return None, position
    if position + length > len(data):
        raise IndexError("key or value runs past its record")
    return data[position : position + length], position + length


def legacy_magic(fetch_version: int) -> int:
    """The message format a Fetch version reads: v0 for Fetch v0-v1, v1 for v2-v3."""
    return 0 if fetch_version < 2 else 1


def encode_message_set(messages: Sequence[LegacyMessage], codec: int = 0) -> bytes:
    """A message set as an old producer sends it (for tests and tools): offsets 0..n-1, and
    with ``codec`` one compressed wrapper whose inner offsets are relative (v1) or absolute."""
    entries = [
        encode_entry(StoredRecord(i, m.timestamp, False, m.key, m.value), m.magic)
        for i, m in enumerate(messages)
    ]
    plain = b"".join(entries)
    if codec == 0:
        return plain
    magic = messages[0].magic
    value = _compress(codec, plain)
    middle = struct.pack(">bb", magic, codec)
    if magic == 1:
        middle += _TIMESTAMP.pack(max(m.timestamp for m in messages))
    middle += _length_prefixed(None) + _length_prefixed(value)
    message = struct.pack(">I", zlib.crc32(middle)) + middle
    return _ENTRY.pack(len(messages) - 1, len(message)) + message
