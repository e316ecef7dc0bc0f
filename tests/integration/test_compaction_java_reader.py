"""The log cleaner's output read by Kafka's own Java record reader (kafka-clients 4.3.0).

A consumer's fetcher parses batches with ``MemoryRecords``: CRC check, then the codec's Java
stream (``KafkaLZ4BlockInputStream`` refuses LZ4 frames with linked blocks, snappy goes through
snappy-java's xerial reader, zstd through zstd-jni). Every codec's cleaned batches, rewritten and
copied ones, data and transaction markers, must read back there as kafka-python reads them and
as the log held them. That includes batches given a delete horizon (KIP-534: attribute bit 6,
the horizon in the base timestamp field, record deltas relative to it): Java reports the horizon
the cleaner wrote and every record's timestamp as written. No broker is needed; Java is
(``harness.java_client``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import children
from harness.compaction_batches import (
    BASE_TIMESTAMP_MS,
    BATCH_READER_SOURCE,
    CODECS,
    TRANSACTIONAL,
    Rec,
    batch_reader_lines,
    keyed_batch,
    read_with_kafka_python,
)
from harness.java_client import java_program

from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.protocol.control_batch import encode_marker
from kafscale.broker.storage.compaction import (
    DeleteClock,
    OffsetMap,
    TxnMarkers,
    clean_batches,
    index_batches,
)

pytestmark = pytest.mark.integration

CLOCK = DeleteClock(BASE_TIMESTAMP_MS + 3_600_000, 86_400_000)


def _log(codec: str) -> tuple[bytes, list[AbortedTxn]]:
    """Keyed batches with headers, tombstones, an aborted and a committed transaction; record
    timestamps on both sides of each batch's first."""
    txn = {"producer_id": 42, "producer_epoch": 3, "attributes": TRANSACTIONAL}
    plain = [
        Rec(
            o,
            f"key-{o % 5}".encode(),
            f"value {o} ".encode() * 40,
            (("trace", bytes([o])),),
            BASE_TIMESTAMP_MS + 1000 * (o % 7),
        )
        for o in range(0, 30)
    ]
    tombstone = Rec(30, b"key-1", None, (), BASE_TIMESTAMP_MS + 5)
    aborted = [Rec(31, b"key-2", b"never", ())]
    committed = [Rec(33, b"key-3", b"committed", (("empty", None),)), Rec(34, b"key-9", b"", ())]
    data = b"".join(
        [
            keyed_batch(0, plain[:15], codec=codec, partition_leader_epoch=4),
            keyed_batch(15, [*plain[15:], tombstone], codec=codec, partition_leader_epoch=4),
            keyed_batch(31, aborted, codec=codec, base_sequence=0, **txn),
            _at(32, encode_marker(42, 3, commit=False, coordinator_epoch=1, timestamp_ms=1)),
            keyed_batch(33, committed, codec=codec, base_sequence=1, **txn),
            _at(35, encode_marker(42, 3, commit=True, coordinator_epoch=1, timestamp_ms=1)),
        ]
    )
    return data, [AbortedTxn(42, 31, 32)]


def _at(base_offset: int, batch: bytes) -> bytes:
    return base_offset.to_bytes(8, "big") + batch[8:]


def test_every_codecs_cleaned_batches_read_back_in_kafkas_java_reader(tmp_path: Path) -> None:
    files, expected, kept_offsets = [], [], {}
    for codec in CODECS:
        data, aborted = _log(codec)
        offset_map = OffsetMap(100)
        assert index_batches(data, offset_map, aborted)
        cleaned = clean_batches(data, offset_map, aborted, clock=CLOCK, markers=TxnMarkers())
        path = tmp_path / f"{codec}.batches"
        path.write_bytes(cleaned)
        files.append(str(path))
        expected += [f"file {path}", *batch_reader_lines(cleaned, codec)]
        kept_offsets[codec] = [
            r.offset
            for batch, rs in read_with_kafka_python(cleaned)
            for r in rs
            if not batch.is_control_batch
        ]

    out = children.run(
        [*java_program(BATCH_READER_SOURCE, "BatchReader"), *files],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == expected
    # each key's latest committed record, the tombstone included; the aborted one gone
    assert set(map(tuple, kept_offsets.values())) == {(25, 27, 29, 30, 33, 34)}
    written = {r.offset: r.timestamp for r in [*_records(_log("none")[0])]}
    java_records = [line.split() for line in out.stdout.splitlines() if line.startswith("record")]
    assert {int(f[1]): int(f[2]) for f in java_records} == {
        o: written[o] for o in kept_offsets["none"]
    }
    # the tombstone's batch and the abort marker (its transaction has no record left) got a
    # horizon: the pass's time + delete.retention.ms; the others none
    stamped = [line.split() for line in out.stdout.splitlines() if line.startswith("batch")]
    assert {(int(f[1]), f[-1]) for f in stamped if f[-1] != "-"} == {
        (15, str(CLOCK.new_horizon_ms)),
        (32, str(CLOCK.new_horizon_ms)),
    }


def _records(data: bytes) -> list[Rec]:
    return [
        r for batch, rs in read_with_kafka_python(data) if not batch.is_control_batch for r in rs
    ]
