"""Message format v0/v1 to v2 and back (broker/protocol/legacy_messages.py)."""

from __future__ import annotations

import contextlib
import struct
import zlib

import lz4.frame
import pytest
from harness.batches import make_batch
from hypothesis import given
from hypothesis import strategies as st
from kafka.record import MemoryRecords
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from kafscale.broker.protocol import legacy_messages as lm
from kafscale.broker.protocol.record_batch import read_header, record_timestamps, split_batches

optional_bytes = st.one_of(st.none(), st.binary(max_size=40))
timestamps = st.integers(min_value=0, max_value=2**41)


@st.composite
def message_sets(draw: st.DrawFn) -> tuple[list[lm.LegacyMessage], int]:
    magic = draw(st.sampled_from([0, 1]))
    count = draw(st.integers(min_value=1, max_value=8))
    messages = [
        lm.LegacyMessage(
            magic,
            draw(timestamps) if magic == 1 else lm.NO_TIMESTAMP,
            draw(optional_bytes),
            draw(optional_bytes),
        )
        for _ in range(count)
    ]
    return messages, draw(st.sampled_from([0, 1, 2, 3]))


@given(message_sets())
def test_message_set_to_v2_batch_and_back_keeps_everything(
    case: tuple[list[lm.LegacyMessage], int],
) -> None:
    messages, codec = case
    parsed = lm.parse_message_set(lm.encode_message_set(messages, codec))
    assert parsed.messages == messages
    assert parsed.codec == codec
    batch = lm.to_record_batch(parsed)
    (checked,) = split_batches(batch)  # a valid v2 batch: size, magic and CRC32C
    header = read_header(checked)
    assert header.compression == codec
    assert header.record_count == len(messages)
    assert header.producer_id == -1
    stored = list(lm.stored_records(batch))
    assert [(r.offset, r.key, r.value) for r in stored] == [
        (i, m.key, m.value) for i, m in enumerate(messages)
    ]
    assert [r.timestamp for r in stored] == [m.timestamp for m in messages]
    assert [t for _, t in record_timestamps(batch)] == [m.timestamp for m in messages]


@given(message_sets(), st.sampled_from([0, 1]))
def test_down_converted_set_parses_back_to_the_same_messages(
    case: tuple[list[lm.LegacyMessage], int], magic: int
) -> None:
    messages, codec = case
    batch = lm.to_record_batch(lm.parse_message_set(lm.encode_message_set(messages, codec)))
    converted = lm.down_convert(batch, magic, 0, 1 << 20)
    back = lm.parse_message_set(converted).messages
    assert [(m.key, m.value, m.magic) for m in back] == [(m.key, m.value, magic) for m in messages]
    if magic == 1 and messages[0].magic == 1:
        assert [m.timestamp for m in back] == [m.timestamp for m in messages]


def test_kafka_python_legacy_builder_output_is_read() -> None:
    """Message sets from another implementation (kafka-python's, as its 0.9/0.10 producers
    send them), compressed with gzip, snappy (xerial framing) and lz4 (v1; v0's lz4 needs
    xxhash in kafka-python, see the next test)."""
    for magic in (0, 1):
        for codec in (0, 1, 2, 3) if magic else (0, 1, 2):
            builder = LegacyRecordBatchBuilder(magic, codec, batch_size=1 << 20)
            for i in range(5):
                builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v%d" % i)
            data = bytes(builder.build())
            parsed = lm.parse_message_set(data)
            assert [m.value for m in parsed.messages] == [b"v%d" % i for i in range(5)]
            assert parsed.codec == codec
            expected = [1_700_000_000_000 + i for i in range(5)] if magic else [-1] * 5
            assert [m.timestamp for m in parsed.messages] == expected


def test_v0_lz4_with_the_broken_header_checksum_is_read() -> None:
    """Kafka 0.8/0.9 computed the LZ4 frame's header checksum over the magic number too
    (KAFKA-3160); their clients still send such frames in v0 messages."""
    plain = lm.encode_message_set([lm.LegacyMessage(0, -1, b"k", b"v" * 50)])
    frame = bytearray(lz4.frame.compress(plain, content_checksum=False))
    end = 6 + (8 if frame[4] & 0x08 else 0)
    frame[end] = (lm.xxh32(bytes(frame[:end])) >> 8) & 0xFF  # the old, wrong checksum
    assert bytes(frame) != lz4.frame.compress(plain, content_checksum=False)
    middle = struct.pack(">bb", 0, 3) + struct.pack(">i", -1)
    middle += struct.pack(">i", len(frame)) + bytes(frame)
    message = struct.pack(">I", zlib.crc32(middle)) + middle
    parsed = lm.parse_message_set(struct.pack(">qi", 0, len(message)) + message)
    assert [(m.key, m.value) for m in parsed.messages] == [(b"k", b"v" * 50)]
    assert parsed.codec == 3


def test_down_converted_set_is_read_by_kafka_python() -> None:
    batch = make_batch(10, [b"a", b"b", b"c"], keys=[b"x", None, b"z"], headers=[("h", b"dropped")])
    for magic in (0, 1):
        converted = lm.down_convert(batch, magic, 11, 1 << 20)
        memory = MemoryRecords(converted)
        records = []
        while (batch_read := memory.next_batch()) is not None:
            assert batch_read.magic == magic
            records.extend(batch_read)
        assert [(r.offset, r.key, r.value) for r in records] == [(11, None, b"b"), (12, b"z", b"c")]
        if magic == 1:
            assert [r.timestamp for r in records] == [1_700_000_000_001, 1_700_000_000_002]


def test_bad_crc_is_a_corrupt_message() -> None:
    data = bytearray(lm.encode_message_set([lm.LegacyMessage(1, 5, b"k", b"value")]))
    data[-1] ^= 0xFF
    with pytest.raises(lm.CorruptMessage, match="CRC"):
        lm.parse_message_set(bytes(data))


def test_bad_crc_inside_a_compressed_wrapper_is_a_corrupt_message() -> None:
    inner = bytearray(lm.encode_message_set([lm.LegacyMessage(0, -1, None, b"value")]))
    inner[-1] ^= 0xFF
    middle = struct.pack(">bb", 0, 1) + struct.pack(">i", -1)
    value = zlib.compress(bytes(inner))  # zlib, not gzip: the codec refuses it
    middle += struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(middle)) + middle
    with pytest.raises(lm.CorruptMessage):
        lm.parse_message_set(struct.pack(">qi", 0, len(message)) + message)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00" * 11,
        struct.pack(">qi", 0, 1000) + b"\x00" * 20,
        struct.pack(">qi", 0, 14) + struct.pack(">Ibb", 0, 2, 0) + b"\x00" * 8,
    ],
    ids=["empty", "truncated-entry", "size-past-end", "magic-2"],
)
def test_malformed_message_sets_are_corrupt(data: bytes) -> None:
    with pytest.raises(lm.CorruptMessage):
        lm.parse_message_set(data)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with contextlib.suppress(lm.CorruptMessage):
        lm.parse_message_set(data)


def test_down_convert_respects_max_bytes_but_returns_the_first_message_whole() -> None:
    batch = make_batch(0, [b"x" * 100 for _ in range(10)])
    one = len(lm.down_convert(batch, 1, 0, 1))
    assert one > 100  # the first message whole, though larger than the limit
    assert len(lm.down_convert(batch, 1, 0, 3 * one)) == 3 * one
    assert len(lm.down_convert(batch, 1, 0, 3 * one + one // 2)) == 3 * one


def test_v0_messages_get_no_timestamp_in_the_v2_batch() -> None:
    parsed = lm.parse_message_set(lm.encode_message_set([lm.LegacyMessage(0, -1, None, b"v")]))
    header = read_header(lm.to_record_batch(parsed))
    assert (header.base_timestamp, header.max_timestamp) == (-1, -1)


def test_wrappers_together_decompress_to_at_most_the_limit() -> None:
    """Each wrapper alone is within the limit; together they are not, and are refused."""
    wrapper = lm.encode_message_set([lm.LegacyMessage(1, 5, None, b"\0" * 50_000)], codec=1)
    assert len(wrapper) < 1_000
    assert len(lm.parse_message_set(wrapper * 3, limit=200_000).messages) == 3
    with pytest.raises(lm.CorruptMessage, match="decompress"):
        lm.parse_message_set(wrapper * 5, limit=200_000)


def test_log_append_time_batches_down_convert_with_the_append_time() -> None:
    """A LogAppendTime topic's batch: v1 messages carry the batch's (append) time and the
    timestamp-type bit, as Kafka down-converts them; v0 messages have no time at all."""
    batch = make_batch(0, [b"a", b"b"], attributes=0x08)
    append_time = read_header(batch).max_timestamp
    records = list(lm.stored_records(batch))
    assert [r.timestamp for r in records] == [append_time, append_time]
    converted = lm.down_convert(batch, 1, 0, 1 << 20)
    memory = MemoryRecords(converted)
    read = []
    while (legacy := memory.next_batch()) is not None:
        read.extend((r.timestamp, r.timestamp_type) for r in legacy)
    assert read == [(append_time, 1), (append_time, 1)]


def test_control_batches_are_not_down_converted() -> None:
    control = make_batch(0, [b"\x00\x00\x00\x00"], keys=[b"\x00\x00\x00\x00"], attributes=0x30)
    data = make_batch(1, [b"after"])
    converted = lm.down_convert(control + data, 0, 0, 1 << 20)
    assert [(m.value) for m in lm.parse_message_set(converted).messages] == [b"after"]
