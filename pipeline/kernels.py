"""The record-parsing loops of the decoder, compiled by numba when it is installed.

Kafka v2 records are varint-framed, so every field's position depends on the one before: a loop
per byte, which costs ~2 µs per record in Python and ~0.15 µs compiled. The loops are written
in the subset of Python that numba compiles; without numba they run as they are (slowly, but
with the same results: the unit tests run both ways).

They never trust the bytes: every read is bounds-checked, and a malformed record makes the
parser return an error code instead of reading past the buffer (numba does not check bounds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

try:  # numba is part of the `spark` extra; fall back to plain Python without it
    from numba import njit as _njit

    def compiled(fn: F) -> F:
        return _njit(cache=True, nogil=True)(fn)  # type: ignore[return-value]

    COMPILED = True
except ImportError:  # pragma: no cover - exercised by the unit tests' plain-Python run

    def compiled(fn: F) -> F:
        return fn

    COMPILED = False

# Error codes returned by parse_records (0 is success).
OK = 0
TRUNCATED = 1
BAD_LENGTH = 2
TOO_MANY_HEADERS = 3


@compiled
def _varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """A zig-zag varint at ``pos``: (value, position after it), or (0, -1) past ``end``."""
    raw = 0
    shift = 0
    while pos < end and shift < 64:
        byte = int(buf[pos])
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte & 0x80 == 0:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
    return 0, -1


@compiled
def parse_records(
    buf: Any,
    batch_starts: Any,
    batch_ends: Any,
    batch_counts: Any,
    batch_base_offsets: Any,
    batch_base_timestamps: Any,
    batch_log_append: Any,
    low: int,
    high: int,
    offsets: Any,
    timestamps: Any,
    timestamp_types: Any,
    key_pos: Any,
    key_len: Any,
    value_pos: Any,
    value_len: Any,
    header_first: Any,
    header_count: Any,
    hkey_pos: Any,
    hkey_len: Any,
    hvalue_pos: Any,
    hvalue_len: Any,
) -> tuple[int, int, int]:
    """Parse the records of every batch into the output arrays; keep offsets in [low, high).

    Batch ``i`` has its (decompressed) records at ``buf[batch_starts[i]:batch_ends[i]]``. A
    LogAppendTime batch (``batch_log_append[i]`` > 0) gives every record that time. Lengths of
    -1 mark null keys and values. Returns (error code, records kept, headers kept); with
    TOO_MANY_HEADERS the header arrays were too small: grow them and call again.
    """
    kept = 0
    headers = 0
    for b in range(batch_starts.shape[0]):
        pos = batch_starts[b]
        end = batch_ends[b]
        for _ in range(batch_counts[b]):
            length, pos = _varint(buf, pos, end)
            if pos < 0:
                return TRUNCATED, kept, headers
            record_end = pos + length
            if length < 0 or record_end > end:
                return BAD_LENGTH, kept, headers
            pos += 1  # attributes
            ts_delta, pos = _varint(buf, pos, record_end)
            if pos < 0:
                return TRUNCATED, kept, headers
            offset_delta, pos = _varint(buf, pos, record_end)
            if pos < 0:
                return TRUNCATED, kept, headers
            klen, pos = _varint(buf, pos, record_end)
            if pos < 0 or klen < -1 or pos + max(klen, 0) > record_end:
                return BAD_LENGTH, kept, headers
            kpos = pos
            pos += max(klen, 0)
            vlen, pos = _varint(buf, pos, record_end)
            if pos < 0 or vlen < -1 or pos + max(vlen, 0) > record_end:
                return BAD_LENGTH, kept, headers
            vpos = pos
            pos += max(vlen, 0)
            nheaders, pos = _varint(buf, pos, record_end)
            if pos < 0 or nheaders < 0:
                return BAD_LENGTH, kept, headers
            offset = batch_base_offsets[b] + offset_delta
            keep = low <= offset < high
            first_header = headers
            for _h in range(nheaders):
                hklen, pos = _varint(buf, pos, record_end)
                if pos < 0 or hklen < 0 or pos + hklen > record_end:
                    return BAD_LENGTH, kept, headers
                hkpos = pos
                pos += hklen
                hvlen, pos = _varint(buf, pos, record_end)
                if pos < 0 or hvlen < -1 or pos + max(hvlen, 0) > record_end:
                    return BAD_LENGTH, kept, headers
                hvpos = pos
                pos += max(hvlen, 0)
                if keep:
                    if headers >= hkey_pos.shape[0]:
                        return TOO_MANY_HEADERS, kept, headers
                    hkey_pos[headers] = hkpos
                    hkey_len[headers] = hklen
                    hvalue_pos[headers] = hvpos
                    hvalue_len[headers] = hvlen
                    headers += 1
            pos = record_end
            if not keep:
                continue
            if kept >= offsets.shape[0]:
                return BAD_LENGTH, kept, headers
            offsets[kept] = offset
            if batch_log_append[b] > 0:
                timestamps[kept] = batch_base_timestamps[b]
                timestamp_types[kept] = 1
            else:
                timestamps[kept] = batch_base_timestamps[b] + ts_delta
                timestamp_types[kept] = 0
            key_pos[kept] = kpos
            key_len[kept] = klen
            value_pos[kept] = vpos
            value_len[kept] = vlen
            header_first[kept] = first_header
            header_count[kept] = headers - first_header
            kept += 1
    return OK, kept, headers


@compiled
def gather(buf: Any, positions: Any, lengths: Any, out_offsets: Any, out: Any) -> None:
    """Copy the ``lengths`` bytes at ``positions`` one after another into ``out``; null
    entries (length -1) take no bytes. ``out_offsets`` (n + 1, Arrow's) is filled as well."""
    at = 0
    out_offsets[0] = 0
    for i in range(positions.shape[0]):
        length = lengths[i]
        if length > 0:
            start = positions[i]
            out[at : at + length] = buf[start : start + length]
            at += length
        out_offsets[i + 1] = at
