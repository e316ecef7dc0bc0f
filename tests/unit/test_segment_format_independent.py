"""The encoder's bytes match DESIGN §5, checked by a parser written here from the spec alone.

Nothing from the codec's decoding side is imported: if encoder and decoder drifted together
(say both little-endian, or the CRC over the wrong range), the round-trip tests would pass and
this one would not. The Go KafScale reads these objects, so the layout is a contract.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from harness.batches import make_batch

from kafscale.broker.storage.segments import encode_segment

pytestmark = pytest.mark.unit


def parse_segment_by_spec(data: bytes) -> dict[str, object]:
    """32-byte header, body, 16-byte footer; big-endian."""
    magic, version, flags, base, count, created, reserved = struct.unpack(">4sHHqiqI", data[:32])
    crc, last, end_magic = struct.unpack(">Iq4s", data[-16:])
    return {
        "magic": magic,
        "version": version,
        "flags": flags,
        "base_offset": base,
        "record_count": count,
        "created_at_ms": created,
        "reserved": reserved,
        "body": data[32:-16],
        "crc": crc,
        "last_offset": last,
        "end_magic": end_magic,
    }


def parse_index_by_spec(data: bytes) -> tuple[dict[str, object], list[tuple[int, int]]]:
    """16-byte header then (i64 base offset, i32 absolute position) entries; big-endian."""
    magic, version, count, interval, reserved = struct.unpack(">4sHiiH", data[:16])
    entries = [struct.unpack(">qi", data[16 + 12 * i : 28 + 12 * i]) for i in range(count)]
    header = {"magic": magic, "version": version, "count": count, "interval": interval}
    header["reserved"] = reserved
    assert len(data) == 16 + 12 * count
    return header, entries


BATCHES = [
    make_batch(1000, [b"a" * 40, b"b" * 40]),  # 2 records, offsets 1000-1001
    make_batch(1002, [b"c" * 10]),
    make_batch(1003, [b"d" * 200, b"e", b"f"]),  # offsets 1003-1005
    make_batch(1006, [b"g" * 5]),
]
CREATED_MS = 1_731_234_567_890


def test_segment_bytes_follow_the_design() -> None:
    encoded = encode_segment(BATCHES, CREATED_MS, 150)
    fields = parse_segment_by_spec(encoded.segment)
    body = b"".join(BATCHES)
    assert fields == {
        "magic": b"KAFS",
        "version": 1,
        "flags": 0,
        "base_offset": 1000,
        "record_count": 7,
        "created_at_ms": CREATED_MS,
        "reserved": 0,
        "body": body,
        "crc": crc32c.crc32c(body),
        "last_offset": 1006,
        "end_magic": b"END!",
    }
    assert len(encoded.segment) == 32 + len(body) + 16


def test_index_bytes_follow_the_design() -> None:
    interval = 150
    encoded = encode_segment(BATCHES, CREATED_MS, interval)
    header, entries = parse_index_by_spec(encoded.index)
    sizes = [len(b) for b in BATCHES]
    starts = [32 + sum(sizes[:i]) for i in range(len(BATCHES))]
    # Expected by hand: first batch; then a batch >= 150 bytes after the last entry.
    expected, last = [], None
    for base, start in zip([1000, 1002, 1003, 1006], starts, strict=True):
        if last is None or start - last >= interval:
            expected.append((base, start))
            last = start
    assert header == {"magic": b"IDX\x00", "version": 1, "count": len(expected)} | {
        "interval": interval,
        "reserved": 0,
    }
    assert entries == expected
    assert 1 < len(entries) < len(BATCHES)  # the example exercises skipping
    for base, position in entries:
        assert struct.unpack(">q", encoded.segment[position : position + 8]) == (base,)


def test_header_is_exactly_the_documented_bytes() -> None:
    encoded = encode_segment([make_batch(1, [b"x"])], 2, 4096)
    assert encoded.segment[:32] == bytes.fromhex(
        "4b414653"  # KAFS
        "0001"  # version
        "0000"  # flags
        "0000000000000001"  # base offset
        "00000001"  # record count
        "0000000000000002"  # created-at ms
        "00000000"  # reserved
    )
    assert encoded.segment[-12:] == bytes.fromhex("0000000000000001") + b"END!"
    assert encoded.index == bytes.fromhex(
        "49445800"  # IDX\0
        "0001"  # version
        "00000001"  # entry count
        "00001000"  # interval (4096)
        "0000"  # reserved
        "0000000000000001"  # entry: base offset 1
        "00000020"  # entry: position 32, right after the segment header
    )
