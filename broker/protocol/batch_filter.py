"""Reading the records of stored v2 batches and writing a batch again with some of them removed.

The log cleaner (``broker/storage/compaction.py``) decides which records stay; this module does
the bytes, as Kafka's ``MemoryRecords.filterTo`` does: a filtered batch keeps its base offset,
last offset delta, timestamps, producer id/epoch/base sequence, partition leader epoch and
attributes (transactional and control bits, timestamp type, codec); its kept records are copied
byte for byte (their deltas stay valid because the base offset and timestamp stay), compressed
again with the batch's codec, and its length, record count and CRC32C are computed again.

A batch given a delete horizon (KIP-534) is the one exception: attribute bit 6 is set and the
base timestamp field holds the horizon, so each kept record's timestamp delta is written again
relative to it. Every reader computes a record's timestamp as base timestamp + delta (LogAppendTime
batches: the max timestamp), so record timestamps, and the max timestamp, stay what they were.

Everything here is strict: the cleaner replaces stored data with its output, so a batch that does
not parse exactly (bad CRC, a record running past its batch, trailing bytes, a decompression
bomb) raises InvalidBatch rather than yielding a partial result.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import cramjam
import crc32c

from kafscale.broker.protocol.batch_encoder import encode_varint
from kafscale.broker.protocol.record_batch import (
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidBatch,
    decompress,
    read_header,
    read_varint,
)

_CRC_START = 21
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024  # the Java client's SnappyOutputStream block size
# batchLength .. magic, crc, then attributes .. recordCount (the CRC covers the latter + records)
_BEFORE_CRC = struct.Struct(">qiib")
_AFTER_CRC = struct.Struct(">hiqqqhii")


class StoredBatch(NamedTuple):
    """One batch of a run of stored batches: its header and its bytes (a view, not a copy)."""

    header: BatchHeader
    data: memoryview


class RecordSpan(NamedTuple):
    """One record of a batch's (decompressed) records section: what the cleaner decides on,
    and where its bytes lie (``start``..``end``, its length prefix included)."""

    offset_delta: int
    key: bytes | None
    is_tombstone: bool
    start: int
    end: int


def iter_stored_batches(data: bytes | memoryview) -> Iterator[StoredBatch]:
    """Every batch of ``data``, each checked (magic 2, length, CRC32C); InvalidBatch if any is
    not, or if ``data`` ends inside a batch."""
    view = memoryview(data)
    position = 0
    while position < len(view):
        header = read_header(view, position)
        end = position + header.size
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or end > len(view):
            raise InvalidBatch(f"batch at offset {header.base_offset} runs past the data")
        if header.magic != 2:
            raise InvalidBatch(f"batch at offset {header.base_offset} has magic {header.magic}")
        batch = view[position:end]
        if crc32c.crc32c(batch[_CRC_START:]) != header.crc:
            raise InvalidBatch(f"batch at offset {header.base_offset}: CRC mismatch")
        yield StoredBatch(header, batch)
        position = end


def batch_records(batch: StoredBatch) -> tuple[bytes, list[RecordSpan]]:
    """The batch's records section (decompressed, within ``record_batch``'s bound) and the
    spans of its records; InvalidBatch if the section does not hold exactly ``record_count``
    well-formed records."""
    header = batch.header
    raw = bytes(batch.data[HEADER_SIZE:])
    try:
        body = decompress(header.compression, raw)
    except InvalidBatch as exc:  # its kind kept: the cleaner keeps a RecordsTooLarge batch
        raise type(exc)(f"batch at offset {header.base_offset}: {exc}") from exc
    try:
        spans = _scan_records(body, header.record_count)
    except (IndexError, ValueError) as exc:
        raise InvalidBatch(f"batch at offset {header.base_offset}: malformed records") from exc
    return body, spans


def _scan_records(body: bytes, count: int) -> list[RecordSpan]:
    """Hot: one pass per record of every cleaned segment, twice per pass. Single-byte varints
    (nearly all of them) are read inline; the timestamp delta is skipped, not decoded."""
    if count < 0 or count > len(body):
        raise ValueError("record count does not fit the records section")
    spans = []
    position = 0
    for _ in range(count):
        length, at = _varint(body, position)
        end = at + length
        if length < 1 or end > len(body):
            raise ValueError("record length runs past the records section")
        at += 1  # attributes
        while body[at] & 0x80:  # timestamp delta
            at += 1
        offset_delta, at = _varint(body, at + 1)
        key_length, at = _varint(body, at)
        key = None
        if key_length >= 0:
            key = body[at : at + key_length]
            at += key_length
        value_length, at = _varint(body, at)
        if _skip_headers(body, at + max(value_length, 0)) != end:
            raise ValueError("record fields do not fill the record exactly")
        spans.append(RecordSpan(offset_delta, key, value_length < 0, position, end))
        position = end
    if position != len(body):
        raise ValueError("bytes after the last record")
    return spans


def _skip_headers(body: bytes, at: int) -> int:
    """The position after a record's headers: a record is copied whole into the cleaned batch,
    so every field is checked as a consumer would read it (Kafka's reader refuses a negative
    count or a header that runs past its record)."""
    count, at = _varint(body, at)
    if count < 0:
        raise ValueError("negative header count")
    for _ in range(count):
        name_length, at = _varint(body, at)
        if name_length < 0:
            raise ValueError("header without a name")
        value_length, at = _varint(body, at + name_length)
        at += max(value_length, 0)
    return at


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag varint, one- and two-byte ones (lengths up to 8 KiB) without a loop."""
    raw = data[position]
    if raw < 0x80:
        return (raw >> 1) ^ -(raw & 1), position + 1
    second = data[position + 1]
    if second < 0x80:
        raw = (raw & 0x7F) | (second << 7)
        return (raw >> 1) ^ -(raw & 1), position + 2
    return read_varint(data, position)


def rebuild_batch(
    batch: StoredBatch,
    body: bytes,
    kept: Sequence[RecordSpan],
    delete_horizon_ms: int | None = None,
) -> bytes:
    """The batch with only the ``kept`` records (spans into its decompressed ``body``), every
    header field but length, record count and CRC unchanged, compressed as the original was.

    With ``delete_horizon_ms`` (for a batch that has none yet) the batch gets that horizon as
    Kafka's cleaner writes it: attribute bit 6 set, the horizon in the base timestamp field and
    each record's timestamp delta made relative to it, so its timestamp does not change."""
    header = batch.header
    attributes, base_timestamp = header.attributes, header.base_timestamp
    if delete_horizon_ms is None:
        records = b"".join(body[span.start : span.end] for span in kept)
    else:
        shift = header.base_timestamp - delete_horizon_ms
        records = b"".join(_rebased_record(body, span, shift) for span in kept)
        attributes, base_timestamp = attributes | DELETE_HORIZON_BIT, delete_horizon_ms
    original = batch.data[HEADER_SIZE : HEADER_SIZE + len(_XERIAL_MAGIC)]
    compressed = compress(header.compression, records, xerial=bytes(original) == _XERIAL_MAGIC)
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            header.last_offset_delta,
            base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            len(kept),
        )
        + compressed
    )
    batch_length = HEADER_SIZE - LOG_OVERHEAD + len(compressed)
    head = _BEFORE_CRC.pack(header.base_offset, batch_length, header.partition_leader_epoch, 2)
    return head + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc


def _rebased_record(body: bytes, span: RecordSpan, shift: int) -> bytes:
    """The record at ``span`` with ``shift`` added to its timestamp delta (and its length
    prefix written again: the delta's varint may change size). The sum wraps to 64 bits as
    Java's long arithmetic does, so base + delta still gives the original timestamp."""
    _, at = read_varint(body, span.start)
    delta, rest = read_varint(body, at + 1)
    record = body[at : at + 1] + encode_varint(_wrap64(delta + shift)) + body[rest : span.end]
    return encode_varint(len(record)) + record


def _wrap64(value: int) -> int:
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def compress(codec: int, records: bytes, *, xerial: bool = True) -> bytes:
    """``records`` compressed as Kafka's clients write ``codec``: gzip; snappy in xerial frames
    (``xerial``, as the Java client writes it) or raw (as librdkafka may); LZ4 frames with
    independent blocks (the Java client refuses linked blocks); zstd frames."""
    if codec == 0:
        return records
    if codec == 1:
        return bytes(cramjam.gzip.compress(records))
    if codec == 2:
        return _snappy_xerial(records) if xerial else bytes(cramjam.snappy.compress_raw(records))
    if codec == 3:
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(records)
        return bytes(compressor.finish())
    if codec == 4:
        return bytes(cramjam.zstd.compress(records))
    raise InvalidBatch(f"unknown compression codec {codec}")


def _snappy_xerial(records: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    for start in range(0, len(records), _XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(records[start : start + _XERIAL_BLOCK_BYTES]))
        parts.append(struct.pack(">i", len(block)) + block)
    return b"".join(parts)
