"""Record batch handling (``broker/protocol/record_batch.py``): validation on the way in, offset
stamping, and record timestamps of uncompressed and compressed batches.

Compressed batches are built here the way real clients build them: the records section of a
``make_batch`` batch is compressed with the library each client family uses (gzip, xerial-framed
snappy as the Java client and kafka-python send it, raw snappy as librdkafka may, LZ4 frames,
zstd frames with and without a content size) and attributes bits 0-2 name the codec.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable

import cramjam
import crc32c
import lz4.frame
import pytest
import snappy
import zstandard
from harness.batches import make_batch, with_base_offset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.protocol.record_batch import (
    HEADER_SIZE,
    MAX_DECOMPRESSED_BYTES,
    InvalidBatch,
    decompress,
    has_null_key,
    iter_batch_headers,
    read_header,
    read_varint,
    record_timestamps,
    split_batches,
    with_log_append_time,
)

pytestmark = pytest.mark.unit

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordCount
_CRC_START = 21
_TIMESTAMP_TYPE_LOG_APPEND = 0x08

# --- test-local builders ----------------------------------------------------------------------


def _xerial(data: bytes, block_size: int = 32 * 1024) -> bytes:
    """xerial snappy framing, as the Java client's SnappyOutputStream writes it."""
    out = [b"\x82SNAPPY\x00", struct.pack(">ii", 1, 1)]
    for start in range(0, len(data), block_size):
        chunk = snappy.compress(data[start : start + block_size])
        out.append(struct.pack(">i", len(chunk)) + chunk)
    return b"".join(out)


def _zstd_streaming(data: bytes) -> bytes:
    """A zstd frame without a content size, as streaming compressors (zstd-jni) write it."""
    compressor = zstandard.ZstdCompressor().compressobj()
    return compressor.compress(data) + compressor.flush()


COMPRESSORS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "gzip": (1, gzip.compress),
    "gzip-cramjam": (1, lambda d: bytes(cramjam.gzip.compress(d))),
    "snappy-xerial": (2, _xerial),
    "snappy-xerial-small-blocks": (2, lambda d: _xerial(d, block_size=64)),
    "snappy-raw": (2, snappy.compress),
    "lz4-frame": (3, lz4.frame.compress),
    "lz4-frame-independent-blocks": (
        3,
        lambda d: lz4.frame.compress(d, block_linked=False, content_checksum=True),
    ),
    "zstd": (4, zstandard.ZstdCompressor().compress),
    "zstd-streaming": (4, _zstd_streaming),
}


def rebuild(
    batch: bytes,
    *,
    records: bytes | None = None,
    attributes: int | None = None,
    magic: int = 2,
    record_count: int | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """The batch with the given parts replaced and a correct CRC and length."""
    fields = list(_AFTER_CRC.unpack_from(batch, _CRC_START))
    if attributes is not None:
        fields[0] = attributes
    if last_offset_delta is not None:
        fields[1] = last_offset_delta
    if record_count is not None:
        fields[7] = record_count
    body = records if records is not None else batch[HEADER_SIZE:]
    after_crc = _AFTER_CRC.pack(*fields) + body
    base_offset, _, leader_epoch = struct.unpack_from(">qii", batch)
    head = struct.pack(
        ">qiibI", base_offset, 9 + len(after_crc), leader_epoch, magic, crc32c.crc32c(after_crc)
    )
    return head + after_crc


def compress_batch(batch: bytes, codec: str) -> bytes:
    bits, compress = COMPRESSORS[codec]
    (attributes,) = struct.unpack_from(">h", batch, _CRC_START)
    return rebuild(
        batch, records=compress(batch[HEADER_SIZE:]), attributes=(attributes & ~0x07) | bits
    )


value_lists = st.lists(st.binary(max_size=80), min_size=1, max_size=8)


@st.composite
def batch_runs(draw: st.DrawFn) -> list[bytes]:
    """1-6 valid batches, some compressed, at increasing offsets."""
    batches = []
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 6))):
        values = draw(value_lists)
        batch = make_batch(offset, values, timestamp_ms=draw(st.integers(0, 2**41)))
        codec = draw(st.none() | st.sampled_from(sorted(COMPRESSORS)))
        batches.append(batch if codec is None else compress_batch(batch, codec))
        offset += len(values)
    return batches


# --- split_batches ----------------------------------------------------------------------------


@FAST
@given(batch_runs())
def test_split_accepts_concatenated_valid_batches(batches: list[bytes]) -> None:
    assert split_batches(b"".join(batches)) == batches


def test_split_rejects_empty_records() -> None:
    with pytest.raises(InvalidBatch):
        split_batches(b"")


@FAST
@given(batch_runs(), st.data())
def test_split_rejects_any_flipped_bit_under_the_crc(
    batches: list[bytes], data: st.DataObject
) -> None:
    joined = bytearray(b"".join(batches))
    index = data.draw(st.integers(0, len(batches) - 1))
    start = sum(len(b) for b in batches[:index])
    position = data.draw(st.integers(start + _CRC_START - 4, start + len(batches[index]) - 1))
    joined[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(InvalidBatch):
        split_batches(bytes(joined))


@FAST
@given(batch_runs(), st.data())
def test_base_offset_and_leader_epoch_are_outside_the_crc(
    batches: list[bytes], data: st.DataObject
) -> None:
    joined = bytearray(b"".join(batches))
    position = data.draw(st.sampled_from([*range(0, 8), *range(12, 16)]))
    joined[position] ^= 0xFF
    assert len(split_batches(bytes(joined))) == len(batches)


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_split_rejects_other_magic(magic: int) -> None:
    batch = rebuild(make_batch(0, [b"a", b"b"]), magic=magic)
    with pytest.raises(InvalidBatch, match="magic"):
        split_batches(batch)


@FAST
@given(batch_runs(), st.data())
def test_split_rejects_truncated_data(batches: list[bytes], data: st.DataObject) -> None:
    joined = b"".join(batches)
    boundaries = {0}
    for batch in batches:
        boundaries.add(max(boundaries) + len(batch))
    cut = data.draw(st.integers(1, len(joined) - 1).filter(lambda c: c not in boundaries))
    with pytest.raises(InvalidBatch):
        split_batches(joined[:cut])


def test_split_rejects_zero_records() -> None:
    batch = rebuild(make_batch(0, [b"a"]), record_count=0, last_offset_delta=0)
    with pytest.raises(InvalidBatch):
        split_batches(batch)


def test_split_rejects_more_records_than_offsets() -> None:
    batch = rebuild(make_batch(0, [b"a", b"b", b"c"]), last_offset_delta=1)
    with pytest.raises(InvalidBatch):
        split_batches(batch)


@pytest.mark.parametrize("batch_length", [-1, 0, 48, 2**31 - 1])
def test_split_rejects_impossible_lengths(batch_length: int) -> None:
    batch = bytearray(make_batch(0, [b"x"]))
    struct.pack_into(">i", batch, 8, batch_length)
    with pytest.raises(InvalidBatch):
        split_batches(bytes(batch))


def test_split_rejects_trailing_bytes_shorter_than_a_header() -> None:
    with pytest.raises(InvalidBatch):
        split_batches(make_batch(0, [b"x"]) + b"\x00" * 10)


# --- header, iteration, stamping --------------------------------------------------------------


@given(
    st.integers(0, 2**62),
    value_lists,
    st.integers(0, 2**41),
    st.integers(-1, 2**40),
    st.integers(-1, 2**15 - 1),
    st.integers(-1, 2**31 - 100),
)
def test_read_header_fields(
    base: int, values: list[bytes], timestamp: int, pid: int, epoch: int, sequence: int
) -> None:
    batch = make_batch(
        base,
        values,
        timestamp_ms=timestamp,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=sequence,
        attributes=0x10,
    )
    header = read_header(batch)
    assert header.size == len(batch)
    assert (header.base_offset, header.magic, header.record_count) == (base, 2, len(values))
    assert header.last_offset == base + len(values) - 1
    assert (header.base_timestamp, header.max_timestamp) == (timestamp, timestamp + len(values) - 1)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        pid,
        epoch,
        sequence,
    )
    assert header.last_sequence == sequence + len(values) - 1
    assert header.is_transactional and not header.is_control
    assert header.compression == 0


@FAST
@given(batch_runs(), st.integers(0, HEADER_SIZE + 20))
def test_iter_batch_headers_stops_before_a_partial_batch(
    batches: list[bytes], partial: int
) -> None:
    data = b"".join(batches) + batches[0][: min(partial, len(batches[0]) - 1)]
    found = list(iter_batch_headers(data))
    positions = [sum(len(b) for b in batches[:i]) for i in range(len(batches))]
    assert [p for p, _ in found] == positions
    assert [h.size for _, h in found] == [len(b) for b in batches]


# --- record timestamps ------------------------------------------------------------------------


@FAST
@given(st.integers(0, 2**50), value_lists, st.integers(0, 2**41))
def test_record_timestamps_uncompressed(base: int, values: list[bytes], timestamp: int) -> None:
    batch = make_batch(base, values, timestamp_ms=timestamp)
    assert record_timestamps(batch) == [(base + i, timestamp + i) for i in range(len(values))]
    moved = with_base_offset(batch, base + 1000)
    assert record_timestamps(memoryview(moved)) == [
        (base + 1000 + i, timestamp + i) for i in range(len(values))
    ]


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    base=st.integers(0, 2**50),
    values=st.lists(st.binary(max_size=300) | st.none(), min_size=1, max_size=20),
    timestamp=st.integers(0, 2**41),
)
def test_record_timestamps_of_compressed_batches(
    codec: str, base: int, values: list[bytes | None], timestamp: int
) -> None:
    plain = make_batch(base, values, timestamp_ms=timestamp, headers=[("h", b"v")])
    batch = compress_batch(plain, codec)
    assert read_header(batch).compression == COMPRESSORS[codec][0]
    assert split_batches(batch) == [batch]
    assert record_timestamps(batch) == record_timestamps(plain)
    assert record_timestamps(batch) == [(base + i, timestamp + i) for i in range(len(values))]


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
def test_record_timestamps_of_large_compressed_batches(codec: str) -> None:
    """Several xerial chunks (32 KiB each), several LZ4 blocks."""
    values = [bytes([i % 251]) * 3000 + i.to_bytes(4, "big") for i in range(100)]
    plain = make_batch(7, values, timestamp_ms=1_700_000_000_000)
    batch = compress_batch(plain, codec)
    assert len(batch) < len(plain)
    assert record_timestamps(batch) == record_timestamps(plain)


@pytest.mark.parametrize("codec", [None, "gzip", "zstd"])
def test_log_append_time_batches_use_the_batch_max_timestamp(codec: str | None) -> None:
    plain = make_batch(40, [b"a", b"b", b"c"], timestamp_ms=1000)
    batch = rebuild(plain, attributes=_TIMESTAMP_TYPE_LOG_APPEND)
    if codec is not None:
        batch = compress_batch(batch, codec)
    assert record_timestamps(batch) == [(40, 1002), (41, 1002), (42, 1002)]


@pytest.mark.parametrize("codec", sorted(COMPRESSORS))
def test_records_decompressing_past_the_limit_are_refused_not_expanded(codec: str) -> None:
    """A few kilobytes can claim gigabytes: decompressed whole, such a batch took all memory.
    Up to the limit, the output is exact whatever the ratio (the buffer grows fourfold)."""
    bits, compress = COMPRESSORS[codec]
    zeros = compress(bytes(4 << 20))
    assert len(zeros) < 4 << 20
    assert decompress(bits, zeros, limit=4 << 20) == bytes(4 << 20)
    with pytest.raises(InvalidBatch, match=f"more than {1 << 20} bytes"):
        decompress(bits, zeros, limit=1 << 20)


def test_the_default_limit_stops_a_zstd_bomb_in_a_produce_sized_batch() -> None:
    """96 MiB of one record compress to ~3 KB, well under max.message.bytes."""
    plain = make_batch(0, [bytes(96 << 20)], timestamp_ms=1_700_000_000_000)
    bomb = compress_batch(plain, "zstd")
    assert len(bomb) < 10_000 and len(plain) > MAX_DECOMPRESSED_BYTES
    with pytest.raises(InvalidBatch, match="more than"):
        record_timestamps(bomb)


@pytest.mark.parametrize("codec", ["gzip", "lz4-frame", "zstd", "snappy-raw", "snappy-xerial"])
def test_corrupt_compressed_records_are_an_invalid_batch(codec: str) -> None:
    plain = make_batch(3, [b"x" * 500, b"y" * 500], timestamp_ms=1_700_000_000_000)
    batch = bytearray(compress_batch(plain, codec))
    for position in range(HEADER_SIZE + 20, len(batch), 7):
        batch[position] ^= 0x5A
    with pytest.raises(InvalidBatch):
        record_timestamps(rebuild(bytes(batch), records=bytes(batch[HEADER_SIZE:])))


def test_records_missing_from_a_batch_are_an_invalid_batch() -> None:
    plain = make_batch(0, [b"a", b"b"], timestamp_ms=1_700_000_000_000)
    with pytest.raises(InvalidBatch, match="past the end"):
        record_timestamps(rebuild(plain, record_count=5))


def _claiming(records: bytes, count: int) -> bytes:
    """A batch whose header claims ``count`` records over ``records`` (CRC valid, as a client
    crafting it would send it)."""
    return encode_batch(records, count, base_timestamp=0, max_timestamp=0)


@pytest.mark.parametrize("length", [b"\x01", b"\x00", b"\x03"], ids=["-1", "0", "-2"])
def test_a_record_length_not_positive_is_invalid_not_read_count_times(length: bytes) -> None:
    # A record of length -1 would be read again and again: one produce of a few bytes claiming
    # 2**31 records held the event loop for hours (has_null_key on a compacted topic) or filled
    # memory (record_timestamps with message.timestamp.before.max.ms).
    batch = _claiming(length + b"\x00\x00\x00\x02a\x02b\x00", 100_000)
    with pytest.raises(InvalidBatch):
        has_null_key(batch)
    with pytest.raises(InvalidBatch):
        record_timestamps(batch)


def test_a_varint_longer_than_ten_bytes_is_invalid() -> None:
    assert read_varint(b"\xff" * 9 + b"\x01", 0)[1] == 10  # the longest Kafka writes
    with pytest.raises(InvalidBatch):
        read_varint(b"\x80" * 10 + b"\x01", 0)  # unbounded, a megabyte took hours


def test_has_null_key_finds_a_keyless_record_in_a_compressed_batch() -> None:
    keyed = encode_record(0, 0, b"k", b"v")
    keyless = encode_record(1, 0, None, b"v")
    body = bytes(cramjam.zstd.compress(keyed + keyless))
    assert has_null_key(encode_batch(body, 2, base_timestamp=0, max_timestamp=0, attributes=4))
    assert not has_null_key(_claiming(keyed, 1))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_compression_is_invalid(codec: int) -> None:
    with pytest.raises(InvalidBatch):
        decompress(codec, b"anything")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python's own imports
@pytest.mark.parametrize(
    "compression", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"]
)
def test_batches_built_by_kafka_python(compression: int) -> None:
    """kafka-python's own v2 batch builder, as its producer sends batches."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=False,
        producer_id=4001,
        producer_epoch=0,
        base_sequence=17,
        batch_size=1 << 20,
    )
    for i in range(40):
        builder.append(
            i, timestamp=1_700_000_000_000 + 3 * i, key=b"k", value=b"v" * 90, headers=[]
        )
    batch = bytes(builder.build())
    assert split_batches(batch) == [batch]
    header = read_header(batch)
    assert (header.compression, header.record_count, header.last_sequence) == (compression, 40, 56)
    stamped = with_base_offset(batch, 500)
    assert split_batches(stamped) == [stamped]
    assert record_timestamps(stamped) == [(500 + i, 1_700_000_000_000 + 3 * i) for i in range(40)]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python's own imports
@pytest.mark.parametrize("compression", [0, 1, 4], ids=["none", "gzip", "zstd"])
def test_log_append_time_stamping_reads_back_in_kafka_python(compression: int) -> None:
    """A LogAppendTime topic's batch: every record reads back with the append time, in a client's
    own parser too, and the CRC still holds; keys and values are untouched."""
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, compression, False, -1, -1, -1, 1 << 20)
    for i in range(5):
        builder.append(i, timestamp=978_307_200_000 + i, key=b"k%d" % i, value=b"v", headers=[])
    sent = bytes(builder.build())
    stamped, header = with_log_append_time(sent, 1_763_900_000_123)
    assert split_batches(stamped) == [stamped]  # CRC valid
    assert header == read_header(stamped) and header.max_timestamp == 1_763_900_000_123
    assert record_timestamps(stamped) == [(i, 1_763_900_000_123) for i in range(5)]
    parsed = DefaultRecordBatch(bytes(stamped))
    assert parsed.validate_crc() and parsed.timestamp_type == 1
    records = list(parsed)
    assert [(r.key, r.timestamp) for r in records] == [
        (b"k%d" % i, 1_763_900_000_123) for i in range(5)
    ]
