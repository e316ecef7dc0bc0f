"""Build real Kafka v2 record batches for tests, byte for byte, with a correct CRC32C.

Hand-built rather than through kio so that timestamps are exact milliseconds and attributes
(compression bits, transactional flags) can be set freely; ``tests/unit/test_segments.py``
checks the result parses with kio's own batch reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c

Header = tuple[str, bytes | None]


def _varint(value: int) -> bytes:
    """Zig-zag varint (Kafka's signed varint/varlong)."""
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag & ~0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _bytes_field(value: bytes | None) -> bytes:
    return _varint(-1) if value is None else _varint(len(value)) + value


def _record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
) -> bytes:
    body = b"".join(
        [
            b"\x00",  # record attributes (unused)
            _varint(timestamp_delta),
            _varint(offset_delta),
            _bytes_field(key),
            _bytes_field(value),
            _varint(len(headers)),
            *(_bytes_field(name.encode()) + _bytes_field(hval) for name, hval in headers),
        ]
    )
    return _varint(len(body)) + body


def make_batch(
    base_offset: int,
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    headers: Sequence[Header] = (),
    timestamp_ms: int = 1_700_000_000_000,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
    attributes: int = 0,
) -> bytes:
    """A v2 record batch of ``len(values)`` uncompressed records at ``base_offset``.

    Record i has offset ``base_offset + i`` and timestamp ``timestamp_ms + i``; every record
    carries ``headers``. ``attributes`` is written as given (the records are not compressed).
    """
    if not values:
        raise ValueError("a record batch needs at least one record")
    keys = keys if keys is not None else [None] * len(values)
    records = b"".join(
        _record(i, i, key, value, headers)
        for i, (key, value) in enumerate(zip(keys, values, strict=True))
    )
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            len(values) - 1,  # lastOffsetDelta
            timestamp_ms,  # baseTimestamp
            timestamp_ms + len(values) - 1,  # maxTimestamp
            producer_id,
            producer_epoch,
            base_sequence,
            len(values),  # recordCount
        )
        + records
    )
    batch_length = 4 + 1 + 4 + len(after_crc)  # partitionLeaderEpoch + magic + crc + rest
    head = struct.pack(
        ">qiibI",
        base_offset,
        batch_length,
        partition_leader_epoch,
        2,
        crc32c.crc32c(after_crc),
    )
    return head + after_crc


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The same batch moved to ``base_offset`` (outside the CRC, as a broker assigns it)."""
    return struct.pack(">q", base_offset) + batch[8:]
