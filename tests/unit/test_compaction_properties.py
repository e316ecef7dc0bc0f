"""Properties of the log cleaner's core over any keyed log (Hypothesis).

A log is drawn as segments of batches (any codec), each batch plain, in a committed transaction
or in an aborted one (each transaction followed by its marker), with tombstones and keyless
records. The cleaned log, read back with kafka-python, must equal what a one-line model of
Kafka's rule keeps: below the dirty end, the latest committed record of each key (a tombstone
until a pass after its delete horizon: ``drop_tombstones`` runs that second pass); at and after
it, everything as it was, and every record with the timestamp it was written with.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
import pytest
from harness.compaction_batches import (
    BASE_TIMESTAMP_MS,
    TRANSACTIONAL,
    Rec,
    keyed_batch,
    read_with_kafka_python,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kafscale.broker.metadata.aborted_index import kept_aborts_from, without_cleaned_aborts
from kafscale.broker.metadata.partition_state import AbortedTxn, PartitionState, TxnIndexRef
from kafscale.broker.protocol.batch_filter import batch_records, iter_stored_batches
from kafscale.broker.protocol.control_batch import encode_marker
from kafscale.broker.protocol.record_batch import InvalidBatch, RecordsTooLarge
from kafscale.broker.storage.compaction import (
    AbortedRanges,
    DeleteClock,
    OffsetMap,
    TxnMarkers,
    clean_batches,
    index_batches,
    key_digest,
)

pytestmark = pytest.mark.unit

RETENTION_MS = 60_000
FIRST = DeleteClock(BASE_TIMESTAMP_MS + 20_000, RETENTION_MS)  # a pass: horizons from here
AFTER = DeleteClock(FIRST.new_horizon_ms, RETENTION_MS)  # a pass once those horizons passed
PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_CODECS = ["none", "gzip", "xerial", "snappy", "lz4", "zstd"]


@dataclass
class Log:
    segments: list[bytes]
    bases: list[int]  # each segment's base offset; the log's end is ``end``
    end: int
    records: list[Rec]  # every data record, in offset order
    aborted_offsets: set[int]
    aborted: list[AbortedTxn]
    markers: list[int]  # offsets of control batches


_record = st.tuples(
    st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", None]),
    st.one_of(st.none(), st.binary(max_size=12), st.binary(min_size=60, max_size=200)),
    st.lists(
        st.tuples(st.sampled_from(["h", "x"]), st.one_of(st.none(), st.binary(max_size=3))),
        max_size=2,
    ),
    st.integers(0, 10_000),
)
_batch = st.tuples(
    st.lists(_record, min_size=1, max_size=6),
    st.sampled_from(_CODECS),
    st.sampled_from(["plain", "committed", "aborted"]),
    st.integers(1, 3),  # producer id of a transaction
)


@st.composite
def logs(draw: st.DrawFn) -> Log:
    segments_spec = draw(st.lists(st.lists(_batch, min_size=1, max_size=4), min_size=1, max_size=5))
    log = Log([], [], 0, [], set(), [], [])
    offset = draw(st.integers(0, 1000))
    for segment_spec in segments_spec:
        log.bases.append(offset)
        parts = []
        for records_spec, codec, kind, pid in segment_spec:
            records = [
                Rec(offset + i, key, value, tuple(headers), BASE_TIMESTAMP_MS + ts)
                for i, (key, value, headers, ts) in enumerate(records_spec)
            ]
            txn = (
                {}
                if kind == "plain"
                else {
                    "producer_id": pid,
                    "producer_epoch": 0,
                    "base_sequence": 0,
                    "attributes": TRANSACTIONAL,
                }
            )
            parts.append(keyed_batch(offset, records, codec=codec, **txn))
            log.records.extend(records)
            offset += len(records)
            if kind != "plain":
                if kind == "aborted":
                    log.aborted.append(AbortedTxn(pid, records[0].offset, offset))
                    log.aborted_offsets.update(r.offset for r in records)
                marker = encode_marker(pid, 0, kind == "committed", 0, BASE_TIMESTAMP_MS)
                parts.append(offset.to_bytes(8, "big") + marker[8:])
                log.markers.append(offset)
                offset += 1
        log.segments.append(b"".join(parts))
    log.end = offset
    return log


def model(log: Log, dirty_end: int, drop_tombstones: bool) -> list[Rec]:
    """Kafka's rule, written plainly: what a cleaned log holds."""
    below = [r for r in log.records if r.offset < dirty_end]
    committed = [r for r in below if r.offset not in log.aborted_offsets and r.key is not None]
    latest = {r.key: r.offset for r in committed}
    kept = [
        r
        for r in committed
        if latest[r.key] == r.offset and not (drop_tombstones and r.value is None)
    ]
    return kept + [r for r in log.records if r.offset >= dirty_end]


def _read(data: bytes) -> tuple[list[Rec], list[int]]:
    parsed = read_with_kafka_python(data)
    records = [r for batch, rs in parsed if not batch.is_control_batch for r in rs]
    markers = [batch.base_offset for batch, _ in parsed if batch.is_control_batch]
    return records, markers


def _clean(log: Log, segments: list[bytes], offset_map: OffsetMap, drop: bool, end: int) -> bytes:
    """A pass at ``FIRST``; with ``drop``, then another at ``AFTER`` over its output (which
    needs no offset map: its keys are unique), when the horizons the first wrote have passed."""
    cleaned = b"".join(
        clean_batches(s, offset_map, log.aborted, clock=FIRST, dirty_end=end) for s in segments
    )
    if not drop:
        return cleaned
    return clean_batches(cleaned, OffsetMap(1), log.aborted, clock=AFTER, dirty_end=end)


@PROPS
@given(log=logs(), drop_tombstones=st.booleans())
def test_a_pass_keeps_exactly_each_keys_latest_committed_record(
    log: Log, drop_tombstones: bool
) -> None:
    offset_map = OffsetMap(1000)
    assert all(index_batches(s, offset_map, log.aborted) for s in log.segments)

    cleaned = _clean(log, log.segments, offset_map, drop_tombstones, log.end)

    records, markers = _read(cleaned)
    assert records == model(log, log.end, drop_tombstones)  # (1), (2), (4), (6)
    keys = [r.key for r in records]
    assert len(keys) == len(set(keys))  # (3)
    assert not {r.offset for r in records} & log.aborted_offsets  # (4)
    assert any(r.value is None for r in records) == (
        not drop_tombstones and any(r.value is None for r in model(log, log.end, False))
    )  # (6)
    assert markers == log.markers  # control batches stay


@PROPS
@given(log=logs(), max_keys=st.integers(1, 6))
def test_a_full_map_stops_the_pass_at_a_segment_boundary(log: Log, max_keys: int) -> None:
    offset_map = OffsetMap(max_keys)
    fitted = 0
    while fitted < len(log.segments) and index_batches(
        log.segments[fitted], offset_map, log.aborted
    ):
        fitted += 1
    assert len(offset_map) <= max_keys  # (5)
    dirty_end = log.bases[fitted] if fitted < len(log.segments) else log.end
    indexed = [
        r for r in log.records if r.offset < dirty_end and r.offset not in log.aborted_offsets
    ]
    latest = {r.key: r.offset for r in indexed if r.key is not None}
    assert {k: offset_map.get(key_digest(k)) for k in latest} == latest
    assert len(offset_map) == len(latest)
    if fitted < len(log.segments):  # the refused segment would not have fitted
        following = {
            r.key
            for r in log.records
            if dirty_end <= r.offset < _next(log, fitted)
            and r.offset not in log.aborted_offsets
            and r.key is not None
        }
        assert len(latest.keys() | following) > max_keys

    cleaned = _clean(log, log.segments, offset_map, False, dirty_end)

    assert _read(cleaned) == (model(log, dirty_end, False), log.markers)


def _next(log: Log, segment: int) -> int:
    return log.bases[segment + 1] if segment + 1 < len(log.bases) else log.end


@PROPS
@given(log=logs(), split_at=st.integers(0, 5))
def test_cleaning_again_with_a_map_of_the_new_segments_only_equals_one_pass(
    log: Log, split_at: int
) -> None:
    """How passes follow one another: the second indexes only what was written since the
    first, and cleans the first's output with the new segments."""
    split_at = min(split_at, len(log.segments))
    first_map = OffsetMap(1000)
    for segment in log.segments[:split_at]:
        assert index_batches(segment, first_map, log.aborted)
    first_end = log.bases[split_at] if split_at < len(log.segments) else log.end
    first = _clean(log, log.segments[:split_at], first_map, False, first_end)

    second_map = OffsetMap(1000)
    for segment in log.segments[split_at:]:
        assert index_batches(segment, second_map, log.aborted)
    second = _clean(log, [first, *log.segments[split_at:]], second_map, False, log.end)

    assert _read(second) == (model(log, log.end, False), log.markers)


@PROPS
@given(
    codec=st.sampled_from(_CODECS),
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=8),
    edits=st.lists(st.tuples(st.integers(21), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(61)),
)
@example(  # a zstd frame whose records decompress past the limit: kept whole
    codec="zstd",
    values=[b"", b"", b"\x00", b"\x00\x00", b"\x00", b"\x00\x00\x01", b"\x00\x00\x00\x00"],
    edits=[(974692, 0)],
    cut=None,
)
def test_damaged_records_raise_invalid_batch_or_clean_to_readable_batches(
    codec: str, values: list[bytes], edits: list[tuple[int, int]], cut: int | None
) -> None:
    """Bytes changed past the CRC's reach (the CRC computed again, as a writer with a bug
    would): the core raises InvalidBatch, never another error, or returns valid batches (by
    the spec's reading, as Kafka's Java reader does: kafka-python reads a record's attributes
    byte as a varint, so a changed attributes byte >= 0x80 trips it, not Kafka)."""
    records = [Rec(o, b"k%d" % (o % 3), v) for o, v in enumerate(values)]
    data = bytearray(keyed_batch(0, records, codec=codec))
    for position, byte in edits:
        data[position % len(data)] = byte
    if cut is not None and cut < len(data):
        del data[cut:]
        struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    try:
        offset_map = OffsetMap(100)
        index_batches(bytes(data), offset_map)
        cleaned = clean_batches(bytes(data), offset_map, clock=FIRST)
    except InvalidBatch:
        return
    for batch in iter_stored_batches(cleaned):  # lengths, CRC
        if not batch.header.is_control:  # a marker is copied as it is, never parsed
            try:
                spans = batch_records(batch)[1]
            except RecordsTooLarge:
                # Its records decompress past the limit: the pass keeps such a batch whole
                # (``compaction._clean_batch``), and a reader gets the error the pass got.
                assert bytes(batch.data) == bytes(data)
                continue
            assert len(spans) == batch.header.record_count


# --- transaction markers (Kafka's CleanedTransactionMetadata) ---------------------------------


@dataclass
class TxnLog:
    """A log of interleaved transactions of a few producers (every one ended by its marker),
    and plain batches; segments end at random points between batches."""

    segments: list[bytes]
    bases: list[int]
    end: int
    records: list[Rec]
    txn_of: dict[int, int]  # data record offset -> the marker offset ending its transaction
    aborted_offsets: set[int]
    aborted: list[AbortedTxn]
    markers: dict[int, tuple[int, bool]]  # marker offset -> (producer id, commit)


_txn_event = st.tuples(
    st.sampled_from(["data", "data", "data", "commit", "abort", "plain"]),
    st.integers(1, 3),  # producer id
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.booleans()), min_size=1, max_size=3
    ),  # (key, tombstone)
    st.booleans(),  # a segment ends after this batch
)


@st.composite
def txn_logs(draw: st.DrawFn) -> TxnLog:
    events = draw(st.lists(_txn_event, min_size=1, max_size=30))
    return build_txn_log(events, draw(st.lists(st.booleans(), min_size=3, max_size=3)))


def build_txn_log(
    events: list[tuple[str, int, list[tuple[bytes, bool]], bool]], last_commits: list[bool]
) -> TxnLog:
    """The log of ``events`` (kind, producer id, records as (key, tombstone), segment ends
    after it); transactions still open at the end get a commit (``last_commits[pid - 1]``) or
    an abort marker: no transaction stays open (the cleaner stops at the LSO)."""
    log = TxnLog([], [0], 0, [], {}, set(), [], {})
    open_txns: dict[int, list[int]] = {}  # producer -> offsets of its open transaction
    parts: list[bytes] = []
    offset = 0

    def marker(pid: int, commit: bool) -> None:
        nonlocal offset
        batch = encode_marker(pid, 0, commit, 0, BASE_TIMESTAMP_MS)
        parts.append(offset.to_bytes(8, "big") + batch[8:])
        offsets = open_txns.pop(pid, [])
        for o in offsets:
            log.txn_of[o] = offset
        if not commit and offsets:
            log.aborted.append(AbortedTxn(pid, offsets[0], offset))
            log.aborted_offsets.update(offsets)
        log.markers[offset] = (pid, commit)
        offset += 1

    for kind, pid, spec, cut in events:
        if kind in ("commit", "abort"):
            marker(pid, kind == "commit")
        else:
            records = [
                Rec(offset + i, key, None if tomb else b"v%d" % (offset + i))
                for i, (key, tomb) in enumerate(spec)
            ]
            txn = (
                {
                    "producer_id": pid,
                    "producer_epoch": 0,
                    "base_sequence": 0,
                    "attributes": TRANSACTIONAL,
                }
                if kind == "data"
                else {}
            )
            parts.append(keyed_batch(offset, records, **txn))
            if kind == "data":
                open_txns.setdefault(pid, []).extend(r.offset for r in records)
            log.records.extend(records)
            offset += len(records)
        if cut and parts:
            log.segments.append(b"".join(parts))
            log.bases.append(offset)
            parts = []
    for pid in sorted(open_txns):
        marker(pid, last_commits[pid - 1])
    if parts:
        log.segments.append(b"".join(parts))
        log.bases.append(offset)
    log.bases.pop()  # the last entry is the log's end
    log.end = offset
    return log


def java_read_committed(data: bytes, aborted: list[AbortedTxn], start: int) -> list[Rec]:
    """What Kafka's Java consumer (``CompletedFetch.nextFetchedRecord``) returns from one fetch
    at ``start`` of ``data`` with the broker's ``aborted`` list: a producer's transactional
    batches are skipped from its aborted transaction's first offset until its abort marker."""
    pending = sorted((t for t in aborted if t.last_offset >= start), key=lambda t: t.first_offset)
    skipping: set[int] = set()
    out: list[Rec] = []
    for batch, records in read_with_kafka_python(data):
        last = batch.base_offset + batch.last_offset_delta
        if last < start:
            continue
        if batch.producer_id >= 0:
            while pending and pending[0].first_offset <= last:
                skipping.add(pending.pop(0).producer_id)
            if batch.is_control_batch:
                if records and records[0].key is not None and records[0].key[2:4] == b"\0\0":
                    skipping.discard(batch.producer_id)  # an abort marker
                continue
            if batch.is_transactional and batch.producer_id in skipping:
                continue
        out += [r for r in records if r.offset >= start]
    return out


def _txn_model(log: TxnLog, dirty_end: int, drop: bool) -> list[Rec]:
    """Kafka's rule on data records: below the dirty end each key's latest committed record
    (tombstones only while ``drop`` is false), everything at and after it."""
    committed = [
        r for r in log.records if r.offset < dirty_end and r.offset not in log.aborted_offsets
    ]
    latest = {r.key: r.offset for r in committed}
    kept = [r for r in committed if latest[r.key] == r.offset and not (drop and r.value is None)]
    return kept + [r for r in log.records if r.offset >= dirty_end]


def _pass(
    log: TxnLog, dirty_end: int, drop: bool, state: PartitionState
) -> tuple[bytes, TxnMarkers]:
    offset_map = OffsetMap(1000)
    ranges = AbortedRanges(log.aborted)
    for base, segment in zip(log.bases, log.segments, strict=True):
        if base < dirty_end:
            assert index_batches(segment, offset_map, ranges)
    markers = TxnMarkers(kept_aborts_from(state, dirty_end))
    cleaned = b"".join(
        clean_batches(s, offset_map, ranges, clock=FIRST, dirty_end=dirty_end, markers=markers)
        for s in log.segments
    )
    if not drop:
        return cleaned, markers
    assert markers.removed == 0  # no marker had a horizon: the first pass only stamps them
    markers = TxnMarkers(kept_aborts_from(state, dirty_end))
    again = clean_batches(
        cleaned, OffsetMap(1), ranges, clock=AFTER, dirty_end=dirty_end, markers=markers
    )
    return again, markers


@PROPS
@given(log=txn_logs(), drop=st.booleans())
def test_a_marker_goes_in_a_pass_after_the_horizon_its_empty_transaction_gave_it(
    log: TxnLog, drop: bool
) -> None:
    cleaned, markers = _pass(log, log.end, drop, PartitionState(high_watermark=log.end))

    records, kept_markers = _read(cleaned)
    assert records == _txn_model(log, log.end, drop)
    # A marker whose transaction had no record left after the first pass got its horizon
    # there and goes in the second; one whose last records (tombstones) went in the second
    # gets its horizon only then, and stays.
    first = _txn_model(log, log.end, False)
    left = {log.txn_of[r.offset] for r in first if r.offset in log.txn_of}
    assert kept_markers == [m for m in log.markers if not drop or m in left]
    aborts = [m for m in log.markers if not log.markers[m][1] and m not in kept_markers]
    assert markers.last_removed_abort == max(aborts, default=-1)
    assert markers.removed == len(log.markers) - len(kept_markers)


_ABORT_THEN_COMMIT = build_txn_log(
    [
        ("data", 1, [(b"a", False)], True),
        ("abort", 1, [], False),
        ("data", 1, [(b"b", False)], False),
        ("commit", 1, [], True),
        ("plain", 2, [(b"c", False)], False),
    ],
    [True, True, True],
)


@settings(PROPS, max_examples=300)
@example(log=_ABORT_THEN_COMMIT, drop=True, cut=3, spilled=0, start=0)
@example(log=_ABORT_THEN_COMMIT, drop=True, cut=1, spilled=1, start=0)  # the ref stays
@given(
    log=txn_logs(),
    drop=st.booleans(),
    cut=st.integers(0, 30),
    spilled=st.integers(0, 30),
    start=st.integers(0, 200),
)
def test_read_committed_readers_see_the_same_records_whatever_the_cleaner_removed(
    log: TxnLog, drop: bool, cut: int, spilled: int, start: int
) -> None:
    """A pass up to a segment boundary, some aborted transactions spilled to an index object
    (which stays if it reaches past the pass): a Java read_committed consumer fetching from any
    offset of the cleaned log, told of the aborted transactions the committed state keeps, gets
    exactly the committed records a cleaned log holds. (Keeping the entry of an abort marker
    the pass removed would hide the producer's later committed records from it.)"""
    dirty_end = ([*log.bases, log.end])[min(cut, len(log.bases))]
    spilled = min(spilled, len(log.aborted))
    refs = (
        (
            TxnIndexRef(
                log.aborted[0].first_offset, log.aborted[spilled - 1].last_offset, 1, spilled
            ),
        )
        if spilled
        else ()
    )
    state = PartitionState(
        high_watermark=log.end,
        aborted_txns=tuple(log.aborted[spilled:]),
        aborted_txn_index=refs,
    )
    cleaned, markers = _pass(log, dirty_end, drop, state)
    assert markers.last_removed_abort < kept_aborts_from(state, dirty_end)  # the commit goes on
    after = without_cleaned_aborts(state, dirty_end)
    told = list(after.aborted_txns) + (log.aborted[:spilled] if after.aborted_txn_index else [])

    start = min(start, log.end)
    expected = [
        r
        for r in _txn_model(log, dirty_end, drop)
        if r.offset >= start and r.offset not in log.aborted_offsets
    ]
    assert java_read_committed(cleaned, told, start) == expected
    before = java_read_committed(b"".join(log.segments), log.aborted, start)
    assert before == [
        r for r in log.records if r.offset >= start and r.offset not in log.aborted_offsets
    ]  # the reader model itself is right
