"""What a broker leaves in the bucket, read back with a parser written here from DESIGN §5.

Records are produced through a real client (kafka-python, every codec, several flushes, several
batches per flush); then the bucket is listed with boto3 and every segment and index object is
parsed with ``struct`` alone: nothing from the broker is imported, so if the broker's encoder and
decoder drifted together (endianness, CRC range, positions) this test still sees it. The Go
KafScale reads these objects, so the layout is a contract.

Segment: 32-byte header (``KAFS``, u16 version 1, u16 flags, i64 base offset, i32 record count,
i64 created-at ms, u32 reserved), the v2 record batches, 16-byte footer (u32 CRC32C of the
body, i64 last offset, ``END!``). Index: 16-byte header (``IDX\\0``, u16 version 1, i32 entry
count, i32 interval, u16 reserved), then (i64 batch base offset, i32 absolute position) entries.
Big-endian throughout.
"""

from __future__ import annotations

import gzip
import itertools
import re
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import crc32c
import lz4.frame
import pytest
import snappy
import zstandard
from confluent_kafka import Producer
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import (
    FETCH,
    PRODUCE,
    KafkaWire,
    batches_in,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
)
from harness.topics import create_topic
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

pytestmark = pytest.mark.integration

INDEX_INTERVAL_BYTES = 1024
CODECS = ["gzip", "snappy", "lz4", "zstd", None]
CORRUPT_MESSAGE, KAFKA_STORAGE_ERROR = 2, 56
_KEY = re.compile(r"^(\d{20})-e(\d+)\.(kfs|idx)$")


# --- the independent parser --------------------------------------------------------------------


@dataclass
class Batch:
    position: int  # absolute, in the segment object
    size: int
    base_offset: int
    last_offset: int
    record_count: int
    attributes: int
    base_timestamp: int
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]]


@dataclass
class Segment:
    key: str
    base_offset: int
    record_count: int
    created_at_ms: int
    last_offset: int
    batches: list[Batch] = field(default_factory=list)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    shift = raw = 0
    while True:
        byte = data[position]
        position += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), position
        shift += 7


def _bytes(data: bytes, position: int) -> tuple[bytes | None, int]:
    length, position = _varint(data, position)
    if length < 0:
        return None, position
    return data[position : position + length], position + length


def _decompress(codec: int, data: bytes) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return gzip.decompress(data)
    if codec == 2:
        if data.startswith(b"\x82SNAPPY\x00"):  # xerial framing (Java, kafka-python)
            out, position = [], 16
            while position < len(data):
                (length,) = struct.unpack_from(">i", data, position)
                out.append(snappy.decompress(data[position + 4 : position + 4 + length]))
                position += 4 + length
            return b"".join(out)
        return bytes(snappy.decompress(data))
    if codec == 3:
        return bytes(lz4.frame.decompress(data))
    if codec == 4:
        return bytes(zstandard.ZstdDecompressor().decompressobj().decompress(data))
    raise AssertionError(f"unknown codec {codec}")


def parse_batch(data: bytes, position: int) -> tuple[Batch, int]:
    """One v2 record batch at ``position``; checks magic, CRC32C and the record count."""
    (
        base_offset,
        batch_length,
        _leader_epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        base_timestamp,
        _max_timestamp,
        _producer_id,
        _producer_epoch,
        _base_sequence,
        record_count,
    ) = struct.unpack_from(">qiibIhiqqqhii", data, position)
    end = position + 12 + batch_length
    assert magic == 2, f"batch at {position}: magic {magic}"
    assert end <= len(data), f"batch at {position} runs past the body"
    assert crc32c.crc32c(data[position + 21 : end]) == crc, f"batch at {position}: CRC32C"
    assert last_offset_delta == record_count - 1, "the broker stores batches without gaps"
    payload = _decompress(attributes & 0x07, data[position + 61 : end])
    records = []
    cursor = 0
    for _ in range(record_count):
        length, cursor = _varint(payload, cursor)
        record_end = cursor + length
        cursor += 1  # attributes
        _timestamp_delta, cursor = _varint(payload, cursor)
        offset_delta, cursor = _varint(payload, cursor)
        key, cursor = _bytes(payload, cursor)
        value, cursor = _bytes(payload, cursor)
        header_count, cursor = _varint(payload, cursor)
        headers = []
        for _ in range(header_count):
            name, cursor = _bytes(payload, cursor)
            header_value, cursor = _bytes(payload, cursor)
            headers.append(((name or b"").decode(), header_value))
        assert cursor == record_end, "record length disagrees with its fields"
        records.append((base_offset + offset_delta, key, value, headers))
    assert cursor == len(payload), "bytes left over after the last record"
    batch = Batch(
        position,
        end - position,
        base_offset,
        base_offset + last_offset_delta,
        record_count,
        attributes,
        base_timestamp,
        records,
    )
    return batch, end


def parse_segment(key: str, data: bytes) -> Segment:
    magic, version, flags, base, count, created, reserved = struct.unpack_from(">4sHHqiqI", data, 0)
    assert (magic, version, flags, reserved) == (b"KAFS", 1, 0, 0), f"{key}: header"
    crc, last, end_magic = struct.unpack_from(">Iq4s", data, len(data) - 16)
    assert end_magic == b"END!", f"{key}: footer magic"
    body = data[32 : len(data) - 16]
    assert crc32c.crc32c(body) == crc, f"{key}: footer CRC32C of the body"
    segment = Segment(key, base, count, created, last)
    position = 32
    while position < len(data) - 16:
        batch, position = parse_batch(data[: len(data) - 16], position)
        segment.batches.append(batch)
    assert position == len(data) - 16, f"{key}: the body is not whole batches"
    return segment


def parse_index(key: str, data: bytes) -> tuple[int, list[tuple[int, int]]]:
    magic, version, count, interval, reserved = struct.unpack_from(">4sHiiH", data, 0)
    assert (magic, version, reserved) == (b"IDX\x00", 1, 0), f"{key}: header"
    assert len(data) == 16 + 12 * count, f"{key}: {count} entries do not fill {len(data)} bytes"
    entries = [struct.unpack_from(">qi", data, 16 + 12 * i) for i in range(count)]
    return interval, entries


# --- the test ----------------------------------------------------------------------------------


def _list(client: Any, bucket: str, prefix: str) -> dict[str, bytes]:
    objects = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            objects[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return objects


def test_segments_and_indexes_in_the_bucket_follow_the_design(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(
        KAFSCALE_LOG__INDEX_INTERVAL_BYTES=str(INDEX_INTERVAL_BYTES),
        KAFSCALE_LOG__INDEX_MIN_SEGMENT_BYTES="0",  # an index beside every segment, small too
        KAFSCALE_LOG__FLUSH_INTERVAL_MS="200",  # several produce requests per flush
        KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS="200",
    )
    topic, partitions = "stored", 2
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()

    began_ms = int(time.time() * 1000)
    produced: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]]]]] = {0: [], 1: []}

    def record(round_number: int, i: int) -> tuple[int, bytes, bytes, list[tuple[str, bytes]]]:
        partition = i % partitions
        key = f"r{round_number}-k{i}".encode()
        # not too repetitive: compressed batches stay big enough to need index entries
        value = f"{round_number}-{i}-".encode() + bytes((i * 7 + n) % 251 for n in range(400))
        headers = [("round", str(round_number).encode())]
        produced[partition].append((key, value, headers))
        return partition, key, value, headers

    # kafka-python compresses with every codec (one batch per partition and round)
    for round_number, codec in enumerate(CODECS):
        producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=50, acks="all"
        )
        futures = []
        for i in range(20):
            partition, key, value, headers = record(round_number, i)
            futures.append(
                producer.send(topic, key=key, value=value, partition=partition, headers=headers)
            )
        producer.flush(30)
        assert all(f.get(30).offset >= 0 for f in futures)
        producer.close(10)
    # librdkafka pipelines small batches per partition: several land in one flush
    for round_number, codec in enumerate(["gzip", "zstd", "none"], start=len(CODECS)):
        ck = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "compression.type": codec,
                "batch.num.messages": 3,
                "linger.ms": 0,
                "enable.idempotence": True,
            }
        )
        for i in range(60):
            partition, key, value, headers = record(round_number, i)
            ck.produce(topic, key=key, value=value, partition=partition, headers=headers)
        assert ck.flush(30) == 0
    ended_ms = int(time.time() * 1000)
    assert broker.stop() == 0, broker.tail()  # indexes go up after the ack: let them land

    client = broker_cluster.s3.client()
    objects = _list(client, broker_cluster.bucket, f"{broker_cluster.cluster}/topics/{topic}/")
    assert objects, "nothing in the bucket"
    for partition in range(partitions):
        mine = {k: v for k, v in objects.items() if k.split("/")[-2] == str(partition)}
        names = {k.rsplit("/", 1)[-1] for k in mine}
        assert all(_KEY.match(n) for n in names), names
        segment_keys = sorted(k for k in mine if k.endswith(".kfs"))
        index_keys = sorted(k for k in mine if k.endswith(".idx"))
        assert [k[:-4] for k in segment_keys] == [k[:-4] for k in index_keys]
        assert len(segment_keys) >= len(CODECS), "each round was flushed on its own"

        next_offset = 0
        stored_records = []
        saw_multi_batch_segment = saw_multi_entry_index = False
        for segment_key, index_key in zip(segment_keys, index_keys, strict=True):
            segment = parse_segment(segment_key, mine[segment_key])
            name_base, _epoch, _ = _KEY.match(segment_key.rsplit("/", 1)[-1]).groups()  # type: ignore[union-attr]
            assert int(name_base) == segment.base_offset
            assert began_ms - 1000 <= segment.created_at_ms <= ended_ms + 5000
            # batches: dense offsets, starting at the header's base, ending at the footer's last
            assert segment.base_offset == next_offset == segment.batches[0].base_offset
            for batch in segment.batches:
                assert batch.base_offset == next_offset
                next_offset = batch.last_offset + 1
            assert segment.last_offset == next_offset - 1
            assert segment.record_count == sum(b.record_count for b in segment.batches)
            saw_multi_batch_segment |= len(segment.batches) > 1

            interval, entries = parse_index(index_key, mine[index_key])
            assert interval == INDEX_INTERVAL_BYTES
            starts = {b.position: b.base_offset for b in segment.batches}
            assert entries[0] == (segment.base_offset, 32)
            for offset, position in entries:
                assert starts.get(position) == offset, f"{index_key}: ({offset}, {position})"
            assert entries == sorted(entries) and len({o for o, _ in entries}) == len(entries)
            # sparse, but an entry at least every interval (plus the batch that crosses it)
            largest = max(b.size for b in segment.batches)
            body_end = len(mine[segment_key]) - 16
            positions = [p for _, p in entries] + [body_end]
            for here, there in itertools.pairwise(positions):
                assert there - here <= INDEX_INTERVAL_BYTES + largest
            saw_multi_entry_index |= len(entries) > 1
            for batch in segment.batches:
                stored_records += batch.records

        assert saw_multi_batch_segment, "no segment held more than one batch"
        assert saw_multi_entry_index, "no index had more than one entry"
        # the records themselves, as the client sent them, at dense offsets from 0
        assert [offset for offset, *_ in stored_records] == list(range(len(produced[partition])))
        assert [(k, v, h) for _, k, v, h in stored_records] == produced[partition]

    # the codecs survived as sent (batches are never re-encoded)
    codecs = set()
    for key, data in objects.items():
        if key.endswith(".kfs"):
            codecs |= {b.attributes & 0x07 for b in parse_segment(key, data).batches}
    assert codecs == {0, 1, 2, 3, 4}


@pytest.mark.parametrize(
    "segments",
    [
        pytest.param(1, id="recent-segment-whole-read"),
        pytest.param(34, id="old-segment-ranged-read"),  # beyond the 32 the state lists
    ],
)
def test_a_corrupted_segment_is_an_error_never_data(
    broker_cluster: BrokerCluster, segments: int
) -> None:
    """CRCs are checked on the way out: a flipped byte in a stored segment makes the fetch of
    that partition fail with a storage error, whether the segment is read whole (recent) or by
    a ranged GET through its index (old); the broker and other partitions live on."""
    broker = broker_cluster.start()
    topic = "corrupted"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    with KafkaWire(broker.bootstrap) as wire:
        for partition in (0, 1):
            for n in range(segments if partition == 0 else 1):  # one acked produce per flush
                batch = make_batch(0, [b"payload-%d" % i for i in range(10)])
                response = wire.request(PRODUCE, 9, produce_body(topic, partition, batch))
                assert produce_partition(response) == (0, 10 * n)

    client = broker_cluster.s3.client()
    prefix = f"{broker_cluster.cluster}/topics/{topic}/"
    first_segment_key = min(
        k
        for k in _list(client, broker_cluster.bucket, prefix)
        if k.endswith(".kfs") and k.split("/")[-2] == "0"
    )
    stored = client.get_object(Bucket=broker_cluster.bucket, Key=first_segment_key)
    data = bytearray(stored["Body"].read())
    data[len(data) - 16 - 5] ^= 0xFF  # inside the last record of the body
    broker.kill()
    client.put_object(Bucket=broker_cluster.bucket, Key=first_segment_key, Body=bytes(data))

    new = broker_cluster.start(port=broker.port, KAFSCALE_LOG__CACHE_BYTES="0")
    with KafkaWire(new.bootstrap) as wire:
        broken = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 0)))
        assert int(broken.error_code) in (CORRUPT_MESSAGE, KAFKA_STORAGE_ERROR), broken
        assert not broken.records
        healthy = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 1, 0)))
        assert int(healthy.error_code) == 0
        assert [(b.base_offset, b.record_count) for b in batches_in(healthy.records)] == [(0, 10)]
        if segments > 1:  # the intact segments after it are still served
            later = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 10)))
            assert int(later.error_code) == 0
            assert batches_in(later.records)[0].base_offset == 10
    assert new.process is not None and new.process.poll() is None


def test_a_graceful_stop_leaves_an_index_beside_every_segment(
    broker_cluster: BrokerCluster,
) -> None:
    """Indexes go up after the ack, in tasks of their own; SIGTERM must not cut off the ones
    of the last flush (the handoff flush), or older data loses its ranged reads."""
    broker = broker_cluster.start(
        KAFSCALE_LOG__FLUSH_INTERVAL_MS="60000",  # only the stop flushes
        KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS="60000",
        KAFSCALE_LOG__INDEX_MIN_SEGMENT_BYTES="0",
    )
    topic, partitions = "stopped", 3
    create_topic(broker.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
    acked: list[int] = []
    for i in range(30):
        producer.produce(
            topic,
            value=b"v%d" % i,
            partition=i % partitions,
            on_delivery=lambda err, msg: acked.append(msg.offset()) if err is None else None,
        )
    producer.poll(1.0)  # sent; the broker buffers them until it stops
    assert acked == []

    assert broker.stop() == 0, broker.tail()
    assert producer.flush(10) == 0
    assert len(acked) == 30

    client = broker_cluster.s3.client()
    objects = _list(client, broker_cluster.bucket, f"{broker_cluster.cluster}/topics/{topic}/")
    segments = sorted(k[:-4] for k in objects if k.endswith(".kfs"))
    indexes = sorted(k[:-4] for k in objects if k.endswith(".idx"))
    assert len(segments) == partitions
    assert indexes == segments


def test_only_segments_read_by_ranges_get_an_index(broker_cluster: BrokerCluster) -> None:
    """By default only segments of at least ``log.index_min_segment_bytes`` (8 MiB, the size up
    to which readers GET a segment whole) get an index: no PUT for an index nobody reads. A
    broker without a cache reads the small segment whole and the large one through its index."""
    broker = broker_cluster.start()
    topic = "sparse-indexes"
    create_topic(broker.bootstrap, topic, 1, {"max.message.bytes": str(16 << 20)})
    with KafkaWire(broker.bootstrap) as wire:
        small = make_batch(0, [b"small-%d" % i for i in range(10)])
        assert produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, small)))[0] == 0
        big_values = [bytes([i % 251]) * 1000 + b"%d" % i for i in range(9000)]  # ~9 MB
        big = make_batch(0, big_values)  # one batch: a segment of its own, over 8 MiB
        assert produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, big)))[0] == 0
    assert broker.stop() == 0, broker.tail()  # indexes go up after the ack: let them land

    client = broker_cluster.s3.client()
    objects = _list(client, broker_cluster.bucket, f"{broker_cluster.cluster}/topics/{topic}/")
    sizes = {k[:-4]: len(v) for k, v in objects.items() if k.endswith(".kfs")}
    indexes = {k[:-4] for k in objects if k.endswith(".idx")}
    assert sorted(sizes.values())[0] < 8 * 1024 * 1024 <= sorted(sizes.values())[-1], sizes
    assert indexes == {name for name, size in sizes.items() if size >= 8 * 1024 * 1024}
    assert len(indexes) == 1

    new = broker_cluster.start(port=broker.port, KAFSCALE_LOG__CACHE_BYTES="0")
    with KafkaWire(new.bootstrap) as wire:
        response = wire.request(FETCH, 12, fetch_body(topic, 0, 0, max_bytes=16 << 20))
        batches = batches_in(fetch_partition(response).records)
        assert [(b.base_offset, b.record_count) for b in batches] == [(0, 10), (10, 9000)]
        response = wire.request(FETCH, 12, fetch_body(topic, 0, 10, max_bytes=1 << 20))
        batches = batches_in(fetch_partition(response).records)
        assert [(b.base_offset, b.record_count) for b in batches] == [(10, 9000)]
