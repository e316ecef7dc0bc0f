"""Delete horizons (KIP-534) in the log cleaner's core (``broker/storage/compaction.py``).

A tombstone's, and a removable transaction marker's, ``delete.retention.ms`` runs from the pass
that first keeps it, not from its write: that pass writes a delete horizon into the batch header
(attribute bit 6, the horizon in the base timestamp field, record deltas relative to it), and a
later pass removes it once the clock reaches the horizon. Batches cleaned before horizons existed
have none: their tombstones count as first seen at the next pass. Every reader must see each
record's timestamp as written: kafka-python, aiokafka, the broker's ListOffsets decoder and the
Spark source's decoder read the rewritten batches here (the Java client in
``tests/integration/test_compaction_java_reader.py``, librdkafka in
``tests/integration/test_log_cleaner_horizon.py``).
"""

from __future__ import annotations

import datetime

import pytest
from aiokafka.record.default_records import DefaultRecordBatch as AiokafkaBatch
from harness.compaction_batches import (
    BASE_TIMESTAMP_MS,
    CODECS,
    TRANSACTIONAL,
    Rec,
    keyed_batch,
    read_with_kafka_python,
    split,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.protocol.batch_filter import iter_stored_batches
from kafscale.broker.protocol.control_batch import encode_marker
from kafscale.broker.protocol.record_batch import (
    DELETE_HORIZON_BIT,
    read_header,
    record_timestamps,
    with_log_append_time,
)
from kafscale.broker.storage.compaction import (
    DeleteClock,
    OffsetMap,
    TxnMarkers,
    clean_batches,
    index_batches,
)
from kafscale.pipeline.decode import decode_records

pytestmark = pytest.mark.unit

RETENTION_MS = 5_000
WRITTEN_MS = BASE_TIMESTAMP_MS
LATE_PASS_MS = WRITTEN_MS + 100 * RETENTION_MS  # long after the tombstone's write


def _pass(data: bytes, now_ms: int, markers: TxnMarkers | None = None, **kw: object) -> bytes:
    aborted = kw.get("aborted", [])
    assert isinstance(aborted, list)
    offset_map = OffsetMap(1000)
    assert index_batches(data, offset_map, aborted)
    clock = DeleteClock(now_ms, RETENTION_MS)
    return clean_batches(data, offset_map, aborted, clock=clock, markers=markers)


def _records(data: bytes) -> list[Rec]:
    return [r for b, rs in read_with_kafka_python(data) if not b.is_control_batch for r in rs]


def _horizons(data: bytes) -> list[int | None]:
    return [b.header.delete_horizon_ms for b in iter_stored_batches(data)]


def _log() -> tuple[bytes, list[Rec]]:
    records = [
        Rec(0, b"a", b"1", (), WRITTEN_MS + 40),
        Rec(1, b"b", b"2", (("h", b"x"),), WRITTEN_MS),
        Rec(2, b"a", None, (), WRITTEN_MS + 90),  # the tombstone: a's latest
        Rec(3, b"c", b"3", (), WRITTEN_MS + 10),
    ]
    return keyed_batch(0, records, codec="zstd"), records


def test_a_tombstone_older_than_the_retention_survives_its_first_pass_and_goes_after() -> None:
    data, records = _log()

    first = _pass(data, LATE_PASS_MS)

    assert _records(first) == records[1:]  # the old code dropped the tombstone here
    horizon = LATE_PASS_MS + RETENTION_MS
    assert _horizons(first) == [horizon]
    header = read_header(first)
    assert header.attributes & DELETE_HORIZON_BIT and header.base_timestamp == horizon
    assert header.max_timestamp == WRITTEN_MS + 90

    before = _pass(first, horizon - 1)
    assert before == first  # the horizon is kept, nothing else changes
    after = _pass(first, horizon)
    assert _records(after) == [records[1], records[3]]
    assert _horizons(after) == [horizon]  # a batch keeps its horizon when it loses records


def test_a_batch_without_tombstones_gets_no_horizon_and_is_copied() -> None:
    data = keyed_batch(0, [Rec(0, b"a", b"1"), Rec(1, b"b", b"2")], codec="gzip")
    assert _pass(data, LATE_PASS_MS) == data


def test_a_horizon_already_set_is_kept_by_a_pass_that_removes_other_records() -> None:
    data, records = _log()
    first = _pass(data, WRITTEN_MS)
    horizon = WRITTEN_MS + RETENTION_MS
    newer = keyed_batch(10, [Rec(10, b"b", b"new", (), WRITTEN_MS + 1)])

    second = _pass(first + newer, WRITTEN_MS + 1)

    assert _horizons(second) == [horizon, None]
    assert _records(second) == [records[2], records[3], Rec(10, b"b", b"new", (), WRITTEN_MS + 1)]


def _txn_log() -> tuple[bytes, list[AbortedTxn]]:
    txn = {"producer_id": 7, "producer_epoch": 0, "attributes": TRANSACTIONAL}
    plain = keyed_batch(0, [Rec(0, b"a", b"1")])
    aborted = keyed_batch(1, [Rec(1, b"a", b"bad")], base_sequence=0, **txn)
    abort = encode_marker(7, 0, commit=False, coordinator_epoch=1, timestamp_ms=WRITTEN_MS)
    return plain + aborted + (2).to_bytes(8, "big") + abort[8:], [AbortedTxn(7, 1, 2)]


def test_a_removable_marker_gets_a_horizon_and_goes_only_after_it() -> None:
    data, aborted = _txn_log()

    markers = TxnMarkers()
    first = _pass(data, LATE_PASS_MS, markers, aborted=aborted)

    horizon = LATE_PASS_MS + RETENTION_MS
    assert _horizons(first) == [None, horizon]  # the aborted batch is gone, its marker stays
    assert (markers.removed, markers.last_removed_abort) == (0, -1)
    [_, (marker, _)] = read_with_kafka_python(first)
    assert marker.is_control_batch and marker.is_transactional
    assert record_timestamps(split(first)[1]) == [(2, WRITTEN_MS)]

    markers = TxnMarkers()
    assert _pass(first, horizon - 1, markers) == first
    assert markers.removed == 0
    markers = TxnMarkers()
    gone = _pass(first, horizon, markers)
    assert _horizons(gone) == [None]
    assert (markers.removed, markers.last_removed_abort) == (1, 2)


def test_a_marker_whose_transaction_keeps_records_gets_no_horizon() -> None:
    txn = {"producer_id": 7, "producer_epoch": 0, "attributes": TRANSACTIONAL}
    data = keyed_batch(0, [Rec(0, b"a", b"1")], base_sequence=0, **txn)
    commit = encode_marker(7, 0, commit=True, coordinator_epoch=1, timestamp_ms=WRITTEN_MS)
    data += (1).to_bytes(8, "big") + commit[8:]
    assert _pass(data, LATE_PASS_MS, TxnMarkers()) == data


def _timestamps_everywhere(data: bytes) -> list[list[tuple[int, int]]]:
    """(offset, timestamp) of each record as kafka-python, aiokafka, the broker's ListOffsets
    decoder and the Spark source's decoder read them."""
    python = [(r.offset, r.timestamp) for r in _records(data)]
    aio = [(r.offset, r.timestamp) for raw in split(data) for r in AiokafkaBatch(raw)]
    broker = [pair for raw in split(data) for pair in record_timestamps(raw)]
    rows = decode_records(data, "t", 0, 0, 1 << 40, include_headers=False)
    assert rows is not None
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    spark = [
        (r["offset"], (r["timestamp"] - epoch) // datetime.timedelta(milliseconds=1))
        for r in rows.to_pylist()
    ]
    return [python, aio, broker, spark]


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_reader_sees_the_written_timestamps_in_a_batch_with_a_horizon(codec: str) -> None:
    records = [
        Rec(o, b"k%d" % o, None if o % 3 == 0 else b"v" * o, (), WRITTEN_MS + 1000 * (o % 4))
        for o in range(12)
    ]
    data = keyed_batch(0, records, codec=codec)

    cleaned = _pass(data, LATE_PASS_MS)

    assert _horizons(cleaned) == [LATE_PASS_MS + RETENTION_MS]
    assert read_header(cleaned).max_timestamp == read_header(data).max_timestamp
    written = [(r.offset, r.timestamp) for r in records]
    assert _timestamps_everywhere(cleaned) == [written] * 4


def test_log_append_time_batches_keep_their_append_time() -> None:
    records = [Rec(0, b"a", None, (), WRITTEN_MS), Rec(1, b"b", b"1", (), WRITTEN_MS + 5)]
    appended, _ = with_log_append_time(keyed_batch(0, records), WRITTEN_MS + 777)
    cleaned = _pass(bytes(appended), LATE_PASS_MS)
    assert _horizons(cleaned) == [LATE_PASS_MS + RETENTION_MS]
    assert _timestamps_everywhere(cleaned) == [[(0, WRITTEN_MS + 777), (1, WRITTEN_MS + 777)]] * 4


_times = st.lists(st.integers(0, 4 * RETENTION_MS), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.one_of(st.none(), st.binary(max_size=8)), min_size=1, max_size=8),
    keys=st.lists(st.sampled_from([b"a", b"b", b"c"]), min_size=8, max_size=8),
    stamps=st.lists(st.integers(-50_000, 50_000), min_size=8, max_size=8),
    gaps=_times,
    codec=st.sampled_from(list(CODECS)),
)
def test_a_latest_tombstone_stays_until_a_pass_at_or_after_its_first_pass_plus_the_retention(
    values: list[bytes | None], keys: list[bytes], stamps: list[int], gaps: list[int], codec: str
) -> None:
    """Passes at growing times over one batch: after each, a key's latest record is there,
    unless it is a tombstone and some pass ran at or after (the first pass + retention); every
    record keeps its written timestamp."""
    records = [Rec(o, keys[o], v, (), WRITTEN_MS + stamps[o]) for o, v in enumerate(values)]
    latest = {r.key: r for r in records}
    data = keyed_batch(0, records, codec=codec)
    now, first_pass = WRITTEN_MS + 10 * RETENTION_MS, None
    for gap in gaps:
        now += gap
        first_pass = now if first_pass is None else first_pass
        data = _pass(data, now)
        gone = now >= first_pass + RETENTION_MS
        expected = sorted(
            (r for r in latest.values() if not (r.value is None and gone)), key=lambda r: r.offset
        )
        assert _records(data) == expected
        if any(r.value is None for r in expected):
            assert _horizons(data) == [first_pass + RETENTION_MS]


def test_a_retention_of_long_max_keeps_tombstones_forever_instead_of_failing_the_pass() -> None:
    """``delete.retention.ms=9223372036854775807`` (Kafka's Long.MAX_VALUE, a valid value: keep
    tombstones for good) made ``now + retention`` overflow the batch's 64-bit base timestamp:
    every pass that kept a tombstone raised ``struct.error`` and the partition was never
    cleaned again. The horizon saturates at Long.MAX_VALUE, which no clock passes."""
    data, records = _log()
    long_max = (1 << 63) - 1
    offset_map = OffsetMap(1000)
    assert index_batches(data, offset_map, [])
    for retention in (long_max, int(float(str(long_max)))):  # as ``cleaner_config`` parses it
        first = clean_batches(data, offset_map, [], clock=DeleteClock(LATE_PASS_MS, retention))
        assert _records(first) == records[1:]
        assert _horizons(first) == [long_max]
        later = clean_batches(first, offset_map, [], clock=DeleteClock(long_max - 1, retention))
        assert _records(later) == records[1:]  # the tombstone stays
