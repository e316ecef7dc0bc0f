"""What a topic's configs ask of a produce (``TopicRules.check``): batch size and timestamps,
checked as Kafka checks them, compressed batches included."""

from __future__ import annotations

import asyncio

import pytest
from harness.batches import make_batch

from kafscale.broker.api.produce import TopicRules
from kafscale.broker.metadata.topics import NO_LIMIT_MS
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.protocol.record_batch import read_header

pytestmark = pytest.mark.unit

NOW = 1_763_900_000_000
HOUR = 3_600_000
RULES = TopicRules(
    max_batch_bytes=1_048_588, log_append_time=False, after_max_ms=HOUR, before_max_ms=NO_LIMIT_MS
)


def gzip_batch(timestamps: list[int]) -> memoryview:
    """A gzip-compressed batch from kafka-python's own builder: its timestamps are inside the
    compressed records, where only decoding finds the oldest."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 1 << 20)
    for offset, timestamp in enumerate(timestamps):
        builder.append(offset, timestamp=timestamp, key=None, value=b"v", headers=[])
    return memoryview(bytes(builder.build()))


def code_of(rules: TopicRules, batches: list[memoryview]) -> ErrorCode:
    try:
        asyncio.run(rules.check(batches, [read_header(batch) for batch in batches], NOW))
    except KafkaError as exc:
        return exc.code
    return ErrorCode.NONE


def batch_at(timestamp_ms: int, values: int = 1) -> memoryview:
    return memoryview(make_batch(0, [b"v"] * values, timestamp_ms=timestamp_ms))


def test_a_batch_over_max_message_bytes_is_too_large() -> None:
    small = TopicRules(100, False, HOUR, NO_LIMIT_MS)
    assert code_of(small, [batch_at(NOW)]) == ErrorCode.NONE
    assert code_of(small, [batch_at(NOW, values=20)]) == ErrorCode.MESSAGE_TOO_LARGE


def test_a_timestamp_beyond_the_allowed_lead_is_invalid() -> None:
    assert code_of(RULES, [batch_at(NOW + HOUR)]) == ErrorCode.NONE  # exactly the limit
    assert code_of(RULES, [batch_at(NOW + HOUR - 1, values=2)]) == ErrorCode.NONE
    assert code_of(RULES, [batch_at(NOW + HOUR, values=2)]) == ErrorCode.INVALID_TIMESTAMP
    assert code_of(RULES, [batch_at(0)]) == ErrorCode.NONE  # no limit behind by default


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python's own imports
def test_the_oldest_record_of_a_compressed_batch_counts_behind() -> None:
    rules = TopicRules(1_048_588, False, HOUR, 24 * HOUR)
    assert code_of(rules, [gzip_batch([NOW, NOW - 23 * HOUR])]) == ErrorCode.NONE
    late = [NOW, NOW - 25 * HOUR, NOW]  # out of order, the old one in the middle
    assert code_of(rules, [gzip_batch(late)]) == ErrorCode.INVALID_TIMESTAMP
    assert code_of(rules, [gzip_batch([-1, NOW])]) == ErrorCode.NONE  # no timestamp: exempt


def test_log_append_time_topics_take_any_producer_timestamp() -> None:
    rules = TopicRules(1_048_588, True, HOUR, HOUR)
    assert code_of(rules, [batch_at(NOW + 10 * HOUR), batch_at(0)]) == ErrorCode.NONE


def test_keyless_records_on_a_compacted_topic_are_named_as_kafka_names_them() -> None:
    from kafscale.broker.api.produce import KeylessRecords
    from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record

    records = b"".join(
        encode_record(i, 0, None if i in (1, 2, 3, 5) else b"k", b"v") for i in range(6)
    )
    batch = memoryview(encode_batch(records, 6, base_timestamp=NOW, max_timestamp=NOW))
    compacted = TopicRules(1_048_588, False, HOUR, NO_LIMIT_MS, compacted=True)
    with pytest.raises(KeylessRecords) as refused:
        asyncio.run(compacted.check([batch], [read_header(batch)], NOW))
    assert refused.value.indexes == [1, 2, 3, 5]
    refusal = refused.value.refusal(("orders", 4))
    reason = "Compacted topic cannot accept message without key in topic partition orders-4."
    assert refusal.code == ErrorCode.INVALID_RECORD
    assert refusal.record_errors == [(1, reason), (2, reason), (3, reason), (5, reason)]
    assert refusal.message == (
        "One or more records have been rejected due to 4 record errors in total, and only "
        f"showing the first three errors at most: [RecordError(batchIndex=1, message='{reason}'), "
        f"RecordError(batchIndex=2, message='{reason}'), "
        f"RecordError(batchIndex=3, message='{reason}')]"
    )
    assert code_of(RULES, [batch]) == ErrorCode.NONE  # not compacted: keyless records pass


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # kafka-python's own imports
def test_a_large_compressed_batch_to_a_compacted_topic_is_read_off_the_event_loop() -> None:
    """Fails on the old main: the keyless-record check decompressed and read a compressed
    batch (here some 50 KB of gzip holding 16 MB of records) on the event loop, so no other
    connection was served until it finished. Now other tasks run while it is read, and the
    answer is the same (the one keyless record named)."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from kafscale.broker.api.produce import KeylessRecords

    count = 4_000
    builder = DefaultRecordBatchBuilder(2, 1, False, -1, -1, -1, 1 << 30)
    for offset in range(count):
        key = None if offset == count - 1 else b"k%d" % offset
        builder.append(offset, timestamp=NOW, key=key, value=bytes(4000), headers=[])
    batch = memoryview(bytes(builder.build()))
    assert read_header(batch).compression == 1 and len(batch) < 1_048_588
    compacted = TopicRules(1_048_588, False, HOUR, NO_LIMIT_MS, compacted=True)

    async def run() -> tuple[int, BaseException | None]:
        check = asyncio.ensure_future(compacted.check([batch], [read_header(batch)], NOW))
        ticks = 0  # steps another task (started after the check) took while it was read

        async def other_connection() -> None:
            nonlocal ticks
            while not check.done():
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(other_connection())
        await asyncio.wait([check])
        await other
        return ticks, check.exception()

    ticks, refused = asyncio.run(run())
    assert isinstance(refused, KeylessRecords) and refused.indexes == [count - 1]
    assert ticks > 0
