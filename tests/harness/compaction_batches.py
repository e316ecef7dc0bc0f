"""Keyed record batches as Kafka clients compress them, and an independent reader for them.

Builders for the log cleaner's tests: the records are laid out by the broker's encoder
(``batch_encoder``) and compressed by the libraries client families use (gzip, python-snappy
in xerial frames as the Java client and kafka-python write it or raw as librdkafka may, LZ4
frames from the ``lz4`` package, zstandard). ``read_with_kafka_python`` parses batches with
kafka-python's ``DefaultRecordBatch``: a reader that shares no code with the broker, so a batch
it accepts (CRC, lengths, codec framing) is valid Kafka wire format.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import crc32c
import lz4.frame
import snappy
import zstandard
from kafka.record.default_records import DefaultRecordBatch

from kafscale.broker.protocol.batch_encoder import Header, encode_batch, encode_record
from kafscale.broker.protocol.batch_filter import iter_stored_batches

CODECS = {"none": 0, "gzip": 1, "snappy": 2, "xerial": 2, "lz4": 3, "zstd": 4}
TRANSACTIONAL = 0x10
CONTROL = 0x20
BASE_TIMESTAMP_MS = 1_700_000_000_000


class Rec(NamedTuple):
    """A record as written and as read back (offset, key, value, headers, timestamp ms)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int = BASE_TIMESTAMP_MS


def _xerial(data: bytes) -> bytes:
    out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for start in range(0, len(data), 32 * 1024):
        chunk = snappy.compress(data[start : start + 32 * 1024])
        out.append(struct.pack(">i", len(chunk)) + chunk)
    return b"".join(out)


_COMPRESS = {
    "none": lambda d: d,
    "gzip": gzip.compress,
    "snappy": snappy.compress,  # raw, as librdkafka may send it
    "xerial": _xerial,
    "lz4": lz4.frame.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


def keyed_batch(
    base_offset: int,
    records: Sequence[Rec],
    *,
    codec: str = "none",
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = 0,
    attributes: int = 0,
    last_offset_delta: int | None = None,
) -> bytes:
    """A v2 batch at ``base_offset`` holding ``records`` at their own offsets (which may skip,
    as in a cleaned batch), compressed with ``codec``; ``attributes`` adds flag bits."""
    base_ts = min(r.timestamp for r in records)
    body = b"".join(
        encode_record(r.offset - base_offset, r.timestamp - base_ts, r.key, r.value, r.headers)
        for r in records
    )
    batch = encode_batch(
        _COMPRESS[codec](body),
        len(records),
        base_timestamp=base_ts,
        max_timestamp=max(r.timestamp for r in records),
        attributes=attributes | CODECS[codec],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
    )
    last = records[-1].offset - base_offset if last_offset_delta is None else last_offset_delta
    return set_last_offset_delta(batch, last)


def set_last_offset_delta(batch: bytes, last_offset_delta: int) -> bytes:
    """``batch`` with another last offset delta and its CRC computed again."""
    out = bytearray(batch)
    struct.pack_into(">i", out, 23, last_offset_delta)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def split(data: bytes) -> list[bytes]:
    """The batches of concatenated batch bytes (by their length field only)."""
    out, position = [], 0
    while position < len(data):
        (length,) = struct.unpack_from(">i", data, position + 8)
        out.append(data[position : position + 12 + length])
        position += 12 + length
    return out


def read_with_kafka_python(data: bytes) -> list[tuple[DefaultRecordBatch, list[Rec]]]:
    """Every batch of ``data`` parsed by kafka-python, CRC checked, with its records."""
    result = []
    for raw in split(data):
        batch = DefaultRecordBatch(raw)
        assert batch.validate_crc(), "kafka-python rejects the CRC"
        records = [Rec(r.offset, r.key, r.value, tuple(r.headers), r.timestamp) for r in batch]
        result.append((batch, records))
    return result


BATCH_READER_SOURCE = Path(__file__).parent / "java" / "BatchReader.java"
_JAVA_CODEC = {"none": "none", "gzip": "gzip", "snappy": "snappy", "xerial": "snappy"}


def _hex(value: bytes | None) -> str:
    return "-" if value is None else (value.hex() or "=")


def batch_reader_lines(cleaned: bytes, codec: str) -> list[str]:
    """What BatchReader prints for ``cleaned``, from kafka-python's reading of it."""
    lines = []
    horizons = [b.header.delete_horizon_ms for b in iter_stored_batches(cleaned)]
    for (batch, records), horizon in zip(read_with_kafka_python(cleaned), horizons, strict=True):
        fields = [
            batch.base_offset,
            batch.base_offset + batch.last_offset_delta,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            batch.leader_epoch,
            "none" if batch.is_control_batch else _JAVA_CODEC.get(codec, codec),
            str(batch.is_transactional).lower(),
            str(batch.is_control_batch).lower(),
            batch.max_timestamp,
            batch.records_count,
            "-" if horizon is None else horizon,
        ]
        lines.append(" ".join(["batch", *map(str, fields)]))
        if batch.is_control_batch:
            continue
        for r in records:
            headers = ",".join(f"{name}={_hex(value)}" for name, value in r.headers) or "-"
            lines.append(f"record {r.offset} {r.timestamp} {_hex(r.key)} {_hex(r.value)} {headers}")
    return lines
