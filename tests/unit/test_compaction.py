"""The log cleaner's record-level core (``broker/storage/compaction.py``, ``batch_filter.py``).

Every cleaned batch is read back three ways: by the broker's own checks (``split_batches``:
magic, lengths, CRC), by the Spark path's decoder (``pipeline.decode``), and by kafka-python's
``DefaultRecordBatch``, which shares no code with the broker: what it accepts is Kafka's wire
format, whatever the codec.
"""

from __future__ import annotations

import struct

import cramjam
import crc32c
import pytest
from harness.compaction_batches import (
    BASE_TIMESTAMP_MS,
    CODECS,
    CONTROL,
    TRANSACTIONAL,
    Rec,
    keyed_batch,
    read_with_kafka_python,
    split,
)

from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.protocol.control_batch import encode_marker
from kafscale.broker.protocol.record_batch import InvalidBatch, read_header, split_batches
from kafscale.broker.storage.compaction import (
    AbortedRanges,
    DeleteClock,
    OffsetMap,
    clean_batches,
    index_batches,
    key_digest,
)
from kafscale.pipeline.decode import decode_records

pytestmark = pytest.mark.unit


def _rec(offset: int, key: bytes | None, value: bytes | None) -> Rec:
    return Rec(
        offset,
        key,
        value,
        (("h", str(offset).encode()), ("n", None)),
        BASE_TIMESTAMP_MS + 7 * offset,
    )


CLOCK = DeleteClock(BASE_TIMESTAMP_MS + 60_000, 1000)  # a pass: delete horizons from here


def _compact(
    data: bytes, *, drop_tombstones: bool = False, aborted: list[AbortedTxn] | None = None
) -> bytes:
    """One pass at ``CLOCK``; with ``drop_tombstones``, another once its horizons passed."""
    offset_map = OffsetMap(1000)
    assert index_batches(data, offset_map, aborted or [])
    cleaned = clean_batches(data, offset_map, aborted or [], clock=CLOCK)
    if not drop_tombstones:
        return cleaned
    later = DeleteClock(CLOCK.new_horizon_ms, CLOCK.delete_retention_ms)
    return clean_batches(cleaned, OffsetMap(1), aborted or [], clock=later)


def _records(data: bytes) -> list[Rec]:
    return [r for _, records in read_with_kafka_python(data) for r in records]


@pytest.mark.parametrize("codec", list(CODECS))
def test_every_codec_keeps_each_keys_latest_record_readable_by_every_reader(codec: str) -> None:
    first = [_rec(o, f"k{o % 4}".encode(), f"v{o}".encode() * 30) for o in range(100, 120)]
    second = [_rec(o, f"k{o % 3}".encode(), f"w{o}".encode() * 30) for o in range(120, 126)]
    args = {"producer_id": 4001, "producer_epoch": 3, "partition_leader_epoch": 7}
    data = keyed_batch(100, first, codec=codec, base_sequence=10, **args) + keyed_batch(
        120, second, codec=codec, base_sequence=30, **args
    )

    cleaned = _compact(data)

    latest = {r.key: r for r in first + second}
    assert _records(cleaned) == sorted(latest.values())  # kafka-python, CRC checked
    batches = split_batches(cleaned)  # the broker's produce-path validation
    assert len(batches) == 2
    before = [read_header(b) for b in split(data)]
    for old, new in zip(before, (read_header(b) for b in batches), strict=True):
        assert (new.base_offset, new.last_offset_delta) == (old.base_offset, old.last_offset_delta)
        assert (new.producer_id, new.producer_epoch, new.base_sequence) == (
            4001,
            3,
            old.base_sequence,
        )
        assert (new.attributes, new.partition_leader_epoch) == (old.attributes, 7)
        assert (new.base_timestamp, new.max_timestamp) == (old.base_timestamp, old.max_timestamp)
    rows = decode_records(cleaned, "t", 0, 0, 1000, include_headers=True).to_pylist()
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [
        (r.offset, r.key, r.value) for r in sorted(latest.values())
    ]
    assert rows[0]["headers"][1] == {"key": "n", "value": None}


def test_snappy_keeps_the_framing_it_came_in() -> None:
    records = [_rec(o, b"k" if o < 9 else b"j", b"x" * 100) for o in range(10)]
    xerial = _compact(keyed_batch(0, records, codec="xerial"))
    raw = _compact(keyed_batch(0, records, codec="snappy"))
    assert xerial[61:].startswith(b"\x82SNAPPY\x00")
    assert not raw[61:].startswith(b"\x82SNAPPY\x00")
    assert _records(xerial) == _records(raw) == [records[8], records[9]]


def test_lz4_output_has_independent_blocks_as_the_java_client_requires() -> None:
    records = [_rec(o, b"k" if o < 9 else b"j", b"x" * 100) for o in range(10)]
    cleaned = _compact(keyed_batch(0, records, codec="lz4"))
    frame = cleaned[61:]
    assert frame[:4] == b"\x04\x22\x4d\x18"
    assert frame[4] & 0x20, "FLG.BlockIndependence is not set"
    assert _records(cleaned) == [records[8], records[9]]


def test_a_batch_that_loses_nothing_is_copied_byte_for_byte() -> None:
    data = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"b", b"2")], codec="zstd")
    assert _compact(data) == data


def test_a_batch_that_loses_every_record_is_dropped() -> None:
    old = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"b", b"2")], codec="gzip")
    new = keyed_batch(2, [_rec(2, b"a", b"3"), _rec(3, b"b", b"4")])
    offset_map = OffsetMap(10)
    assert index_batches(old, offset_map) and index_batches(new, offset_map)
    assert clean_batches(old, offset_map, clock=CLOCK) == b""
    assert clean_batches(new, offset_map, clock=CLOCK) == new


def test_tombstones_stay_until_a_pass_after_their_horizon_and_shadow_older_values() -> None:
    data = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"b", b"2"), _rec(2, b"a", None)])
    assert _records(_compact(data)) == [_rec(1, b"b", b"2"), _rec(2, b"a", None)]
    assert _records(_compact(data, drop_tombstones=True)) == [_rec(1, b"b", b"2")]


def test_records_without_a_key_are_dropped_as_kafka_does() -> None:
    data = keyed_batch(0, [_rec(0, None, b"1"), _rec(1, b"b", b"2")])
    assert _records(_compact(data)) == [_rec(1, b"b", b"2")]


def test_aborted_records_are_dropped_and_do_not_shadow_the_committed_value() -> None:
    committed = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"b", b"1")])
    txn = {"producer_id": 7, "producer_epoch": 0, "attributes": TRANSACTIONAL}
    aborted_data = keyed_batch(2, [_rec(2, b"a", b"bad")], base_sequence=0, **txn)
    abort_marker = _at(4, encode_marker(7, 0, commit=False, coordinator_epoch=1, timestamp_ms=1))
    committed_data = keyed_batch(5, [_rec(5, b"b", b"2")], base_sequence=1, **txn)
    commit_marker = _at(6, encode_marker(7, 0, commit=True, coordinator_epoch=1, timestamp_ms=1))
    data = committed + aborted_data + abort_marker + committed_data + commit_marker

    cleaned = _compact(data, aborted=[AbortedTxn(7, 2, 4)])

    parsed = read_with_kafka_python(cleaned)
    assert [r for batch, records in parsed if not batch.is_control_batch for r in records] == [
        _rec(0, b"a", b"1"),
        _rec(5, b"b", b"2"),
    ]
    assert [b.base_offset for b, _ in parsed if b.is_control_batch] == [4, 6]
    assert [b.is_transactional for b, _ in parsed] == [False, True, True, True]


def test_records_at_or_after_the_dirty_end_are_untouched() -> None:
    data = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"a", b"2")]) + keyed_batch(
        2, [_rec(2, b"a", b"3"), _rec(3, None, b"4")]
    )
    offset_map = OffsetMap(10)
    assert index_batches(split(data)[0], offset_map)
    cleaned = clean_batches(data, offset_map, clock=CLOCK, dirty_end=2)
    assert cleaned.endswith(split(data)[1])
    assert _records(cleaned) == [_rec(1, b"a", b"2"), _rec(2, b"a", b"3"), _rec(3, None, b"4")]


def test_a_full_map_refuses_a_whole_segment_and_stays_as_it_was() -> None:
    offset_map = OffsetMap(3)
    first = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"b", b"1")])
    second = keyed_batch(2, [_rec(2, b"a", b"2"), _rec(3, b"c", b"2")])
    third = keyed_batch(4, [_rec(4, b"d", b"3"), _rec(5, b"a", b"3")])
    assert index_batches(first, offset_map) and index_batches(second, offset_map)
    assert offset_map.full()
    assert not index_batches(third, offset_map)
    assert len(offset_map) == 3
    assert offset_map.get(key_digest(b"a")) == 2


def test_the_offset_map_needs_room_and_never_exceeds_it() -> None:
    with pytest.raises(ValueError):
        OffsetMap(0)
    offset_map = OffsetMap(2)
    offset_map.update({key_digest(b"a"): 5, key_digest(b"b"): 6})
    offset_map.update({key_digest(b"a"): 3})  # an older offset never replaces a newer one
    assert offset_map.get(key_digest(b"a")) == 5
    with pytest.raises(ValueError):
        offset_map.update({key_digest(b"c"): 7})
    many = keyed_batch(10, [_rec(o, b"%d" % o, b"") for o in range(10, 1010)], codec="zstd")
    assert not index_batches(many, offset_map)
    assert (len(offset_map), offset_map.room) == (2, 0)


def _at(base_offset: int, batch: bytes) -> bytes:
    return struct.pack(">q", base_offset) + batch[8:]


def _damaged_crc(batch: bytes) -> bytes:
    return batch[:-1] + bytes([batch[-1] ^ 1])


def _with_records(records: bytes, count: int, codec: int = 0) -> bytes:
    return encode_batch(records, count, base_timestamp=0, max_timestamp=0, attributes=codec)


@pytest.mark.parametrize(
    "data",
    [
        _damaged_crc(keyed_batch(0, [_rec(0, b"a", b"1")])),
        keyed_batch(0, [_rec(0, b"a", b"1")])[:-3],  # truncated
        keyed_batch(0, [_rec(0, b"a", b"1")]) + b"\x00" * 20,  # a partial header after it
        _with_records(b"\x02\x00\x00", 1),  # a record shorter than its fields
        _with_records(b"\x7f" + b"\x00" * 10, 1),  # a record longer than the batch
        _with_records(encode_record(0, 0, b"a", b"1"), 2),  # fewer records than counted
        _with_records(b"not gzip at all", 1, codec=1),
        _with_records(b"\x82SNAPPY\x00" + bytes([0, 0, 0, 1, 0, 0, 0, 1, 0]), 1, codec=2),
        _with_records(encode_record(0, 0, b"a", b"1")[:-1] + b"\x01", 1),  # -1 headers
        _with_records(encode_record(0, 0, b"a", b"1")[:-1] + b"\x02", 1),  # header past it
        _with_records(encode_record(0, 0, b"a", b"1", [("h", b"x")])[:-2] + b"\x04x", 1),
    ],
    ids=[
        "crc",
        "truncated",
        "trailing",
        "short-record",
        "long-record",
        "count",
        "gzip",
        "xerial-chunk-length",
        "negative-header-count",
        "header-past-record",
        "header-value-short",
    ],
)
def test_damaged_input_raises_instead_of_a_partial_output(data: bytes) -> None:
    good = keyed_batch(1000, [_rec(1000, b"z", b"1")])
    with pytest.raises(InvalidBatch):
        index_batches(data + good, OffsetMap(10))
    with pytest.raises(InvalidBatch):
        clean_batches(good + data, OffsetMap(10), clock=CLOCK)


def test_a_batch_past_the_decompression_bound_is_kept_whole_and_hides_no_key() -> None:
    """80 MiB of zeros in a few KiB of zstd: more than a broker reads records within. It is
    not bad input to stop cleaning for (a topic compacted later may hold such a batch): it is
    copied whole, and indexes no key."""
    bomb = _with_records(bytes(cramjam.zstd.compress(b"\x00" * (80 << 20))), 1, codec=4)
    good = keyed_batch(1000, [_rec(1000, b"z", b"1")])
    offset_map = OffsetMap(10)
    assert index_batches(bomb + good, offset_map)
    assert len(offset_map) == 1
    assert clean_batches(good + bomb, offset_map, clock=CLOCK) == good + bomb


def test_a_crc_is_computed_over_the_rewritten_batch() -> None:
    data = keyed_batch(0, [_rec(0, b"a", b"1"), _rec(1, b"a", b"2")], codec="gzip")
    cleaned = _compact(data)
    assert struct.unpack_from(">I", cleaned, 17)[0] == crc32c.crc32c(cleaned[21:])
    assert read_header(cleaned).record_count == 1
    assert cleaned != data


def test_control_batch_flags_are_what_kafka_python_calls_control() -> None:
    marker = _at(3, encode_marker(7, 0, commit=True, coordinator_epoch=1, timestamp_ms=1))
    assert read_header(marker).attributes & (CONTROL | TRANSACTIONAL) == CONTROL | TRANSACTIONAL
    assert _compact(marker) == marker


@pytest.mark.parametrize("size", [0, 63, 64, 8000, 8192, 70_000, 1 << 20])
def test_records_whose_lengths_take_one_to_three_varint_bytes_are_read_exactly(size: int) -> None:
    key = b"k" * (size // 3)
    records = [
        Rec(0, key, b"v" * size, (("h" * size, b"x" * size),)),
        Rec(1, b"other", None, (), BASE_TIMESTAMP_MS + size * 1000),
        Rec(2, key, bytes(size // 2)),
    ]
    cleaned = _compact(keyed_batch(0, records, codec="lz4"))
    assert _records(cleaned) == records[1:]


def test_aborted_transactions_can_be_looked_up_once_for_many_inputs() -> None:
    txn = {"producer_id": 9, "producer_epoch": 0, "attributes": TRANSACTIONAL}
    data = (
        keyed_batch(0, [_rec(0, b"a", b"1")], base_sequence=0, **txn)
        + keyed_batch(1, [_rec(1, b"a", b"2")], base_sequence=1, **txn)
        + keyed_batch(2, [_rec(2, b"a", b"3")])  # not transactional: never aborted
        + keyed_batch(3, [_rec(3, b"b", b"4")], base_sequence=2, **txn)
    )
    ranges = AbortedRanges([AbortedTxn(9, 3, 5), AbortedTxn(8, 0, 9), AbortedTxn(9, 1, 2)])
    offset_map = OffsetMap(10)
    assert index_batches(data, offset_map, ranges)
    assert offset_map.get(key_digest(b"b")) is None
    assert _records(clean_batches(data, offset_map, ranges, clock=CLOCK)) == [_rec(2, b"a", b"3")]
