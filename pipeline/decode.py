"""Record batches (Kafka v2) to Arrow record batches with the columns of Spark's Kafka source.

A segment body is a run of record batches. Their fixed headers are read by the broker's own
codec (``iter_batch_headers``), compressed record sets are inflated by its ``decompress`` (gzip,
raw and xerial-framed snappy, lz4, zstd, with its bound on the inflated size), control batches
are dropped, and the records of all the remaining batches are parsed in one compiled loop
(``kernels``) into flat arrays. The Arrow columns are then built from contiguous buffers: one
copy of keys and values, no Python object per record (Python tuples cap Spark at ~0.17 M rows/s;
this path feeds it several M).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.protocol.record_batch import (
    HEADER_SIZE,
    BatchHeader,
    InvalidBatch,
    decompress,
    iter_batch_headers,
)
from kafscale.pipeline import kernels

_LOG_APPEND_TIME = 0x08
_BINARY = pa.binary()
_TIMESTAMP = pa.timestamp("us", tz="UTC")

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_BASE_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow twin of ``source.spark_schema``: the types Spark requires, exactly."""
    fields = _BASE_FIELDS + ([pa.field("headers", HEADERS_TYPE)] if include_headers else [])
    return pa.schema(fields)


class CorruptRecords(ValueError):
    """A batch's records cannot be parsed (or inflated): the stored data is damaged."""


@dataclass(frozen=True, slots=True)
class _Batches:
    """Decompressed record sets of the batches to parse, concatenated, with their bounds."""

    buf: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    counts: np.ndarray
    base_offsets: np.ndarray
    base_timestamps: np.ndarray
    log_append: np.ndarray

    @property
    def records(self) -> int:
        return int(self.counts.sum())


def decode_records(
    body: bytes | memoryview,
    topic: str,
    partition: int,
    low: int,
    high: int,
    include_headers: bool,
    aborted: Sequence[AbortedTxn] = (),
) -> pa.RecordBatch | None:
    """The records with offsets in [low, high) of the batches in ``body``, as one Arrow batch
    (None if there are none). Control batches (transaction markers) and the batches of
    ``aborted`` transactions are skipped, as a read_committed consumer skips them; damaged data
    raises CorruptRecords."""
    batches = _collect(body, low, high, aborted)
    if batches is None:
        return None
    return _to_arrow(batches, topic, partition, low, high, include_headers)


def _is_aborted(header: BatchHeader, aborted: Sequence[AbortedTxn]) -> bool:
    """A transactional batch of a producer inside one of its aborted transactions."""
    return header.is_transactional and any(
        t.producer_id == header.producer_id and t.first_offset <= header.base_offset < t.last_offset
        for t in aborted
    )


def _collect(
    body: bytes | memoryview, low: int, high: int, aborted: Sequence[AbortedTxn]
) -> _Batches | None:
    parts: list[bytes | memoryview] = []
    rows: list[tuple[int, int, int, int, int]] = []  # count, base offset, ts, log append, size
    in_place: list[int] = []  # where each kept batch's records start in ``body``, if stored raw
    view = memoryview(body)
    for position, header in iter_batch_headers(view):
        if header.is_control or header.last_offset < low or header.base_offset >= high:
            continue
        if aborted and _is_aborted(header, aborted):
            continue
        records: bytes | memoryview = view[position + HEADER_SIZE : position + header.size]
        if header.compression:
            try:
                records = decompress(header.compression, bytes(records))
            except InvalidBatch as exc:
                raise CorruptRecords(f"batch at offset {header.base_offset}: {exc}") from exc
        else:
            in_place.append(position + HEADER_SIZE)
        log_append = header.attributes & _LOG_APPEND_TIME
        timestamp = header.max_timestamp if log_append else header.base_timestamp
        # A count larger than the bytes could hold is a lie; the parser stops at the end anyway.
        count = max(0, min(header.record_count, len(records)))
        rows.append((count, header.base_offset, timestamp, 1 if log_append else 0, len(records)))
        parts.append(records)
    if not rows:
        return None
    table = np.array(rows, dtype=np.int64)
    if len(in_place) == len(rows):
        # Nothing was inflated: parse the segment where it lies rather than copy its records
        # (for 1 GiB of uncompressed 1 KiB values, a GiB less of fresh memory to fault in).
        buf = np.frombuffer(view, dtype=np.uint8)
        starts = np.array(in_place, dtype=np.int64)
        ends = starts + table[:, 4]
    else:
        buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
        ends = np.cumsum(table[:, 4])
        starts = ends - table[:, 4]
    return _Batches(
        buf=buf,
        starts=starts,
        ends=ends,
        counts=table[:, 0].copy(),
        base_offsets=table[:, 1].copy(),
        base_timestamps=table[:, 2].copy(),
        log_append=table[:, 3].copy(),
    )


def _to_arrow(
    batches: _Batches, topic: str, partition: int, low: int, high: int, include_headers: bool
) -> pa.RecordBatch | None:
    n = batches.records
    out = {name: np.empty(n, dtype=np.int64) for name in _RECORD_ARRAYS}
    out["timestamp_types"] = np.empty(n, dtype=np.int32)
    header_room = max(64, n)
    while True:
        hdr = {name: np.empty(header_room, dtype=np.int64) for name in _HEADER_ARRAYS}
        code, kept, nheaders = kernels.parse_records(
            batches.buf,
            batches.starts,
            batches.ends,
            batches.counts,
            batches.base_offsets,
            batches.base_timestamps,
            batches.log_append,
            low,
            high,
            *(out[name] for name in _OUTPUT_ORDER),
            *(hdr[name] for name in _HEADER_ARRAYS),
        )
        if code != kernels.TOO_MANY_HEADERS:
            break
        header_room *= 4
    if code != kernels.OK:
        raise CorruptRecords(f"record set of {topic}-{partition} cannot be parsed (code {code})")
    if kept == 0:
        return None
    cut = {name: array[:kept] for name, array in out.items()}
    columns: list[pa.Array] = [
        _binary(batches.buf, cut["key_pos"], cut["key_len"]),
        _binary(batches.buf, cut["value_pos"], cut["value_len"]),
        _repeated(topic, kept),
        _fixed(pa.int32(), np.full(kept, partition, dtype=np.int32)),
        _fixed(pa.int64(), cut["offsets"]),
        _fixed(_TIMESTAMP, cut["timestamps"] * 1000),
        _fixed(pa.int32(), cut["timestamp_types"]),
    ]
    if include_headers:
        columns.append(_headers(batches.buf, cut, {k: v[:nheaders] for k, v in hdr.items()}))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


_RECORD_ARRAYS = (
    "offsets",
    "timestamps",
    "key_pos",
    "key_len",
    "value_pos",
    "value_len",
    "header_first",
    "header_count",
)
_OUTPUT_ORDER = (
    "offsets",
    "timestamps",
    "timestamp_types",
    "key_pos",
    "key_len",
    "value_pos",
    "value_len",
    "header_first",
    "header_count",
)
_HEADER_ARRAYS = ("hkey_pos", "hkey_len", "hvalue_pos", "hvalue_len")


def _binary(
    buf: np.ndarray, positions: np.ndarray, lengths: np.ndarray, kind: pa.DataType = _BINARY
) -> pa.Array:
    """A binary (or string) Arrow array of the given slices of ``buf``; length -1 is null."""
    n = positions.shape[0]
    total = int(np.maximum(lengths, 0).sum())
    if total > 2**31 - 1:
        raise CorruptRecords("more than 2 GiB of keys or values in one segment")
    offsets = np.empty(n + 1, dtype=np.int32)
    data = np.empty(total, dtype=np.uint8)
    kernels.gather(buf, positions, lengths, offsets, data)
    nulls = lengths < 0
    null_count = int(nulls.sum())
    validity = None
    if null_count:
        validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(
        kind, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=null_count
    )


def _fixed(kind: pa.DataType, values: np.ndarray) -> pa.Array:
    """A fixed-width Arrow array over ``values``' memory, without copying. Not ``pa.array``:
    given a NumPy array it imports pandas, ~1 s of CPU in each new Spark worker."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)], null_count=0)


def _repeated(text: str, n: int) -> pa.Array:
    """``text`` n times as a string array, built from buffers (``pa.repeat`` imports pandas)."""
    raw = text.encode()
    if len(raw) * n > 2**31 - 1:
        raise CorruptRecords("more than 2 GiB of topic names in one segment")
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)], null_count=0
    )


def _headers(
    buf: np.ndarray, records: dict[str, np.ndarray], headers: dict[str, np.ndarray]
) -> pa.Array:
    """``headers`` as Spark's Kafka source has it: array<struct<key: string, value: binary>>.

    Headers are kept in record order, so a record's headers are the run starting at its first."""
    keys = _binary(buf, headers["hkey_pos"], headers["hkey_len"], pa.string())
    values = _binary(buf, headers["hvalue_pos"], headers["hvalue_len"])
    entries = pa.StructArray.from_arrays([keys, values], fields=list(HEADERS_TYPE.value_type))
    list_offsets = np.empty(records["header_first"].shape[0] + 1, dtype=np.int32)
    list_offsets[:-1] = records["header_first"]
    list_offsets[-1] = headers["hkey_pos"].shape[0]
    return pa.ListArray.from_arrays(_fixed(pa.int32(), list_offsets), entries, type=HEADERS_TYPE)


def empty_batch(include_headers: bool) -> pa.RecordBatch:
    schema = arrow_schema(include_headers)
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def concat(batches: Sequence[pa.RecordBatch]) -> pa.Table:
    """For tests and tools: the decoded batches as one table."""
    return pa.Table.from_batches(batches)
