"""Kafka v2 record batches built from records: the layout, the varints, the CRC32C.

The broker builds batches with it when a pre-0.11 client produces a message set
(``legacy_messages.to_record_batch``) and for transaction markers (``control_batch``); the tests
and the benches build them the same way, so a batch a test sends is laid out by the code the
broker trusts rather than by a second hand-written copy.
Records are encoded as given: compressing them (and setting the codec bits in ``attributes``)
is the caller's business.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

Header = tuple[str, bytes | None]
# attributes i16, lastOffsetDelta i32, baseTimestamp i64, maxTimestamp i64, producerId i64,
# producerEpoch i16, baseSequence i32, recordCount i32: the CRC covers these and the records
_AFTER_CRC = struct.Struct(">hiqqqhii")
# baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8, crc u32
_BEFORE_CRC = struct.Struct(">qiibI")
_LENGTH_COUNTED_BEFORE_CRC = 4 + 1 + 4  # partitionLeaderEpoch, magic, crc


def encode_varint(value: int) -> bytes:
    """Kafka's signed varint/varlong (zig-zag, 7 bits a byte)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _varbytes(value: bytes | None) -> bytes:
    return encode_varint(-1) if value is None else encode_varint(len(value)) + value


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header] = (),
) -> bytes:
    """One record of a v2 batch, length-prefixed (record attributes are unused: 0)."""
    body = b"".join(
        [
            b"\x00",
            encode_varint(timestamp_delta),
            encode_varint(offset_delta),
            _varbytes(key),
            _varbytes(value),
            encode_varint(len(headers)),
            *(_varbytes(name.encode()) + _varbytes(hval) for name, hval in headers),
        ]
    )
    return encode_varint(len(body)) + body


def encode_batch(
    records: bytes,
    record_count: int,
    *,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_offset: int = 0,
    partition_leader_epoch: int = 0,
) -> bytes:
    """A v2 batch around ``records`` (encoded, and compressed if ``attributes`` says so),
    with its CRC32C; the last offset delta is ``record_count - 1``."""
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            record_count - 1,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        )
        + records
    )
    length = _LENGTH_COUNTED_BEFORE_CRC + len(after_crc)
    head = _BEFORE_CRC.pack(
        base_offset, length, partition_leader_epoch, 2, crc32c.crc32c(after_crc)
    )
    return head + after_crc
