"""Bad input on raw sockets: the broker answers with the protocol's error code, or closes that
one connection when a frame cannot be answered; it never crashes and keeps serving everyone else.

One broker serves the module, with a small maximum frame (64 KiB) and topic auto-creation off.
Every test ends by checking that the process is alive, answers ApiVersions on a new
connection and still stores and serves a record.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields, is_dataclass
from typing import Any, get_args, get_origin, get_type_hints

import crc32c
import pytest
import zstandard
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.batches import make_batch
from harness.brokers import BrokerProcess, new_cluster
from harness.kafka_wire import (
    API_VERSIONS,
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    KafkaWire,
    assert_invalid_request_then_served,
    batches_in,
    correlation_id_of,
    fetch_body,
    fetch_partition,
    flexible_request_header,
    metadata_body,
    produce_body,
    produce_partition,
    request_header,
    sample_body,
    uvarint,
)
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader

from kafscale.broker.api.table import API_TABLE
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record

pytestmark = pytest.mark.integration

MAX_FRAME_BYTES = 65536
NONE, OFFSET_OUT_OF_RANGE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION = 0, 1, 2, 3
UNSUPPORTED_VERSION, INVALID_REQUEST, UNKNOWN_TOPIC_ID = 35, 42, 100


@pytest.fixture(scope="module")
def kafka(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    cluster = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path_factory.mktemp("bad-input"),
        "bad-input",
        extra_env={
            "KAFSCALE_LIMITS__MAX_FRAME_BYTES": str(MAX_FRAME_BYTES),
            "KAFSCALE_TOPICS__AUTO_CREATE_TOPICS": "false",
        },
    )
    try:
        broker = cluster.start()
        create_topics(broker.bootstrap, ["healthy", "target"], partitions=2)
        yield broker
    finally:
        cluster.stop_all()


@pytest.fixture(autouse=True)
def broker_still_serves(kafka: BrokerProcess) -> Iterator[None]:
    """After every test: alive, answers ApiVersions, stores and serves a new record."""
    yield
    assert kafka.process is not None and kafka.process.poll() is None, kafka.tail()
    with KafkaWire(kafka.bootstrap) as wire:
        versions = wire.request(API_VERSIONS, 3, {})
        assert int(versions.error_code) == NONE
        code, offset = produce_partition(
            wire.request(PRODUCE, 9, produce_body("healthy", 0, make_batch(0, [b"ok"])))
        )
        assert code == NONE and offset >= 0
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body("healthy", 0, offset)))
        assert int(partition.error_code) == NONE
        assert batches_in(partition.records)[0].base_offset == offset


def high_watermark(wire: KafkaWire, topic: str, partition: int) -> int:
    body = {
        "replica_id": -1,
        "topics": [
            {"name": topic, "partitions": [{"partition_index": partition, "timestamp": -1}]}
        ],
    }
    result = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
    assert int(result.error_code) == NONE
    return int(result.offset)


# --- frames that cannot be answered: that connection closes, the others live on -------------


GARBAGE = {
    "http request": b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n",
    "tls client hello": bytes.fromhex("16030100a5010000a10303") + bytes(32),
    "frame shorter than a header": struct.pack(">i", 3) + b"\x00\x01\x02",
    "unknown api key": struct.pack(">i", 10) + struct.pack(">hhi", 999, 0, 7) + b"\x00\x00",
    "negative length": struct.pack(">i", -5) + b"\x00" * 8,
    "zeros": bytes(64),
}


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_closes_that_connection_only(kafka: BrokerProcess, garbage: bytes) -> None:
    with KafkaWire(kafka.bootstrap) as bystander, KafkaWire(kafka.bootstrap) as attacker:
        assert int(bystander.request(API_VERSIONS, 3, {}).error_code) == NONE
        attacker.send_raw(garbage)  # "zeros": a zero-length frame, no readable header
        assert attacker.is_closed_by_peer(), "the broker kept a connection it cannot parse"
        assert int(bystander.request(API_VERSIONS, 3, {}).error_code) == NONE


def test_frame_above_the_maximum_is_refused_before_its_body(kafka: BrokerProcess) -> None:
    """The length prefix alone (over 64 KiB) closes the connection; no body is awaited."""
    with KafkaWire(kafka.bootstrap) as wire:
        wire.send_raw(struct.pack(">i", MAX_FRAME_BYTES + 1))
        assert wire.is_closed_by_peer()
    with KafkaWire(kafka.bootstrap) as wire:
        wire.send_raw(struct.pack(">i", 2**31 - 1) + b"\x00" * 100)
        assert wire.is_closed_by_peer()


def test_frame_just_under_the_maximum_is_served(kafka: BrokerProcess) -> None:
    """A produce of a batch close to the limit is an ordinary request."""
    value = b"x" * (MAX_FRAME_BYTES - 1024)
    with KafkaWire(kafka.bootstrap) as wire:
        code, _ = produce_partition(
            wire.request(PRODUCE, 9, produce_body("target", 1, make_batch(0, [value])))
        )
        assert code == NONE
    with KafkaWire(kafka.bootstrap) as wire:
        big = make_batch(0, [b"x" * MAX_FRAME_BYTES])
        wire.send(PRODUCE, 9, produce_body("target", 1, big))
        assert wire.is_closed_by_peer()


# --- requests that parse but are wrong: error codes, per partition ----------------------------


def _corrupt(batch: bytes) -> bytes:
    broken = bytearray(batch)
    broken[-1] ^= 0xFF  # inside the records: covered by the CRC
    return bytes(broken)


def test_corrupt_batch_crc_is_corrupt_message_and_stores_nothing(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        before = high_watermark(wire, "target", 0)
        good = make_batch(0, [b"good"])
        body = {
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [
                {
                    "name": "target",
                    "partition_data": [
                        {"index": 0, "records": _corrupt(make_batch(0, [b"a", b"b"]))},
                        {"index": 1, "records": good},
                    ],
                }
            ],
        }
        response = wire.request(PRODUCE, 9, body)
        codes = {int(p.index): int(p.error_code) for p in response.responses[0].partition_responses}
        assert codes == {0: CORRUPT_MESSAGE, 1: NONE}
        assert high_watermark(wire, "target", 0) == before

        # a good batch followed by a corrupt one in the same records field: all or nothing
        both = make_batch(0, [b"fine"]) + _corrupt(make_batch(0, [b"bad"]))
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body("target", 0, both)))
        assert code == CORRUPT_MESSAGE
        assert high_watermark(wire, "target", 0) == before


@pytest.mark.parametrize(
    "records",
    [
        pytest.param(b"\x00" * 10, id="shorter than a batch header"),
        pytest.param(make_batch(0, [b"v"])[:-3], id="truncated batch"),
        pytest.param(
            make_batch(0, [b"v"])[:16] + b"\x01" + make_batch(0, [b"v"])[17:], id="magic 1"
        ),
        pytest.param(b"", id="empty records"),
    ],
)
def test_malformed_records_are_corrupt_message(kafka: BrokerProcess, records: bytes) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        code, offset = produce_partition(
            wire.request(PRODUCE, 9, produce_body("target", 1, records))
        )
    assert (code, offset) == (CORRUPT_MESSAGE, -1)


def _zstd_bomb(base_offset: int, timestamp_ms: int) -> bytes:
    """One record of 96 MiB of zeros, zstd-compressed into a batch of a few KB."""
    plain = make_batch(base_offset, [bytes(96 << 20)], timestamp_ms=timestamp_ms)
    records = zstandard.ZstdCompressor().compress(plain[61:])
    fields = bytearray(plain[21:61])  # attributes .. record count, after the CRC
    struct.pack_into(">h", fields, 0, 4)  # compression: zstd
    after_crc = bytes(fields) + records
    head = struct.pack(">qiibI", base_offset, 9 + len(after_crc), -1, 2, crc32c.crc32c(after_crc))
    return head + after_crc


def test_a_decompression_bomb_is_refused_or_stored_but_never_expanded(
    kafka: BrokerProcess,
) -> None:
    """Where the broker reads records (a topic with message.timestamp.before.max.ms checks every
    record's time) a batch decompressing past 64 MiB is CORRUPT_MESSAGE; elsewhere it is stored
    as produced, and a look-up by timestamp answers with its first offset. Decompressed whole,
    it took the broker's memory."""
    now = int(time.time() * 1000)
    create_topics(
        kafka.bootstrap,
        ["bomb-checked"],
        1,
        {"message.timestamp.before.max.ms": "86400000"},
    )
    create_topics(kafka.bootstrap, ["bomb-plain"], 1)
    bomb = _zstd_bomb(0, now)
    assert len(bomb) < 20_000
    with KafkaWire(kafka.bootstrap) as wire:
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body("bomb-checked", 0, bomb)))
        assert code == CORRUPT_MESSAGE
        code, offset = produce_partition(
            wire.request(PRODUCE, 9, produce_body("bomb-plain", 0, make_batch(0, [b"before"])))
        )
        assert code == NONE
        code, bomb_offset = produce_partition(
            wire.request(PRODUCE, 9, produce_body("bomb-plain", 0, bomb))
        )
        assert (code, bomb_offset) == (NONE, offset + 1)
        body = {
            "replica_id": -1,
            "topics": [
                {"name": "bomb-plain", "partitions": [{"partition_index": 0, "timestamp": now}]}
            ],
        }
        found = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
        assert (int(found.error_code), int(found.offset)) == (NONE, bomb_offset)
    assert kafka.process is not None and kafka.process.poll() is None, kafka.tail()


def test_a_compacted_topic_answers_keyless_records_as_kafka_and_bad_lengths_at_once(
    kafka: BrokerProcess,
) -> None:
    """A compacted topic reads every record's key on produce. Keyless records get Kafka's
    INVALID_RECORD with its error_message and one record_errors entry each; a batch of a few
    bytes whose record length is -1 while it claims 2**31-1 records is CORRUPT_MESSAGE at once
    (the key check read that one record 2**31 times: the broker stopped answering anyone)."""
    topic = f"keys-{uuid.uuid4().hex[:6]}"
    create_topics(kafka.bootstrap, [topic], 1, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    records = encode_record(0, 0, b"k", b"v") + encode_record(1, 0, None, b"v")
    keyless = encode_batch(records, 2, base_timestamp=now, max_timestamp=now)
    endless = encode_batch(
        b"\x01\x00\x00\x00\x02k\x02v\x00", 2**31 - 1, base_timestamp=now, max_timestamp=now
    )
    reason = f"Compacted topic cannot accept message without key in topic partition {topic}-0."
    with KafkaWire(kafka.bootstrap) as wire:
        answer = wire.request(PRODUCE, 9, produce_body(topic, 0, keyless))
        partition = answer.responses[0].partition_responses[0]
        assert int(partition.error_code) == INVALID_RECORD
        assert [
            (int(e.batch_index), e.batch_index_error_message) for e in partition.record_errors
        ] == [(1, reason)]
        assert partition.error_message == (
            "One or more records have been rejected due to 1 record errors in total, and only "
            "showing the first three errors at most: "
            f"[RecordError(batchIndex=1, message='{reason}')]"
        )
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, endless)))
        assert code == CORRUPT_MESSAGE
        keyed = encode_batch(
            encode_record(0, 0, b"k", b"v"), 1, base_timestamp=now, max_timestamp=now
        )
        assert produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, keyed))) == (
            NONE,
            0,
        )


def test_unknown_topic_with_auto_create_off(kafka: BrokerProcess) -> None:
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    with KafkaWire(kafka.bootstrap) as wire:
        code, _ = produce_partition(
            wire.request(PRODUCE, 9, produce_body(ghost, 0, make_batch(0, [b"v"])))
        )
        assert code == UNKNOWN_TOPIC_OR_PARTITION
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body(ghost, 0, 0)))
        assert int(partition.error_code) == UNKNOWN_TOPIC_OR_PARTITION
        metadata = wire.request(METADATA, 9, metadata_body([ghost], allow_auto_topic_creation=True))
        assert int(metadata.topics[0].error_code) == UNKNOWN_TOPIC_OR_PARTITION
        listed = wire.request(METADATA, 9, metadata_body(None))
        assert ghost not in {t.name for t in listed.topics}, "auto-created although disabled"

        # a partition beyond the topic's count is just as unknown
        code, _ = produce_partition(
            wire.request(PRODUCE, 9, produce_body("target", 7, make_batch(0, [b"v"])))
        )
        assert code == UNKNOWN_TOPIC_OR_PARTITION
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body("target", 7, 0)))
        assert int(partition.error_code) == UNKNOWN_TOPIC_OR_PARTITION

        # Fetch v13+ names topics by id; the all-zero id (which kio reads as None) is as unknown
        for topic_id in (uuid.uuid4(), uuid.UUID(int=0)):
            body = fetch_body("", 0, 0)
            body["topics"][0]["topic_id"] = topic_id
            partition = fetch_partition(wire.request(FETCH, 13, body))
            assert int(partition.error_code) == UNKNOWN_TOPIC_ID


def test_init_producer_id_at_the_last_epoch_gets_a_new_producer_id(kafka: BrokerProcess) -> None:
    """KIP-360: an idempotent producer re-initialising with its id and epoch gets the next epoch;
    from the last epoch an i16 holds there is no next one (the answer could not even be encoded,
    and the connection closed): a new producer id at epoch 0, as Kafka gives."""
    with KafkaWire(kafka.bootstrap) as wire:
        first = wire.request(22, 4, {"transaction_timeout_ms": 60_000, "producer_id": -1})
        producer_id = int(first.producer_id)
        assert int(first.error_code) == NONE and int(first.producer_epoch) == 0
        bumped = wire.request(
            22,
            4,
            {"transaction_timeout_ms": 60_000, "producer_id": producer_id, "producer_epoch": 7},
        )
        assert (int(bumped.producer_id), int(bumped.producer_epoch)) == (producer_id, 8)
        last = wire.request(
            22,
            4,
            {"transaction_timeout_ms": 60_000, "producer_id": producer_id, "producer_epoch": 32767},
        )
        assert int(last.error_code) == NONE
        assert int(last.producer_id) > producer_id and int(last.producer_epoch) == 0


def test_fetch_outside_the_log_is_offset_out_of_range(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        end = high_watermark(wire, "target", 1)
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body("target", 1, end + 100)))
        assert int(partition.error_code) == OFFSET_OUT_OF_RANGE
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body("target", 1, -5)))
        assert int(partition.error_code) == OFFSET_OUT_OF_RANGE


def test_invalid_acks_is_refused(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        code, _ = produce_partition(
            wire.request(PRODUCE, 9, produce_body("target", 0, make_batch(0, [b"v"]), acks=5))
        )
    assert code == 21  # INVALID_REQUIRED_ACKS


# --- versions --------------------------------------------------------------------------------


def test_api_versions_above_the_range_answers_v0_with_the_list(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        correlation_id = 4711
        wire.send_frame(request_header(API_VERSIONS, 99, correlation_id) + b"\x00\x00\x00")
        frame = wire.recv_frame()
        assert correlation_id_of(frame) == correlation_id
        response = codec.decode_response(frame, API_VERSIONS, 0)
        assert int(response.error_code) == UNSUPPORTED_VERSION
        ranges = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys
        }
        for api in (PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS):
            assert api in ranges
        assert ranges[API_VERSIONS][1] < 99
        # the connection stays usable: the client retries with a version from the list
        assert int(wire.request(API_VERSIONS, ranges[API_VERSIONS][1], {}).error_code) == NONE


def test_unadvertised_version_is_unsupported_version(kafka: BrokerProcess) -> None:
    """Fetch v17 is not advertised (v4-v16): the answer carries error 35 and the same
    correlation id, and the connection goes on serving."""
    with KafkaWire(kafka.bootstrap) as wire:
        advertised = wire.request(API_VERSIONS, 3, {})
        ranges = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in advertised.api_keys
        }
        version = ranges[FETCH][1] + 1
        try:
            codec.request_schema(FETCH, version)
        except codec.UnknownApi:
            pytest.skip(f"kio has no Fetch v{version} to encode")
        sent = wire.send(FETCH, version, fetch_body("target", 0, 0) | {"topics": []})
        received, response = wire.recv(FETCH, version)
        assert received == sent
        assert int(response.error_code) == UNSUPPORTED_VERSION
        assert int(wire.request(API_VERSIONS, 3, {}).error_code) == NONE


def test_produce_v0_is_advertised_and_served(kafka: BrokerProcess) -> None:
    """Produce v0 (message format v0) is served, as Kafka 3.9 serves it: a v0 request without
    topics is answered under its correlation id, and the connection goes on serving."""
    with KafkaWire(kafka.bootstrap) as wire:
        advertised = wire.request(API_VERSIONS, 3, {})
        ranges = {
            int(k.api_key): (int(k.min_version), int(k.max_version)) for k in advertised.api_keys
        }
        assert ranges[PRODUCE][0] == 0
        wire.send_frame(request_header(PRODUCE, 0, 8) + b"\x00\x01\x00\x00\x03\xe8\x00\x00\x00\x00")
        frame = wire.recv_frame()
        assert correlation_id_of(frame) == 8
        assert codec.decode_response(frame, PRODUCE, 0).responses == ()
        assert int(wire.request(API_VERSIONS, 3, {}).error_code) == NONE


def test_version_unknown_to_the_protocol_closes_the_connection(kafka: BrokerProcess) -> None:
    """CreateTopics v0 (long gone, not served) has no response layout the broker could answer
    in."""
    with KafkaWire(kafka.bootstrap) as wire:
        wire.send_frame(request_header(19, 0, 9) + b"\x00" * 20)
        assert wire.is_closed_by_peer()


# --- bodies that do not parse: an error response with the same correlation id ---------------


@pytest.mark.parametrize(
    ("api_key", "version"),
    [(PRODUCE, 9), (FETCH, 11), (METADATA, 8), (LIST_OFFSETS, 5)],
)
def test_unparsable_body_gets_an_error_response(
    kafka: BrokerProcess, api_key: int, version: int
) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        request = request_header(api_key, version, 777) + b"\xff\xff\xff\x7f\x01"
        assert_invalid_request_then_served(wire, request, api_key, version, 777)


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    [
        # Metadata v12: topics claims 2^32 - 2 elements (kio reserved 34 GB and aborted)
        (METADATA, 12, uvarint(2**32 - 1)),
        # OffsetCommit v8: group "g", then a member claiming a string of 2^32 - 2 bytes
        (8, 8, uvarint(2) + b"g" + struct.pack(">i", -1) + uvarint(2**32 - 1)),
        # Produce v9: no transactional id, acks, timeout, topic_data of 2^31 elements
        (PRODUCE, 9, b"\x00" + struct.pack(">hi", -1, 1000) + uvarint(2**31)),
        # Metadata v8 (not flexible): an i32 array length of 2^31 - 1
        (METADATA, 8, struct.pack(">i", 2**31 - 1)),
        # OffsetCommit v8 with topics = null, which the schema does not allow
        (8, 8, uvarint(2) + b"g" + struct.pack(">i", -1) + uvarint(1) + b"\x00\x00\x00"),
    ],
    ids=["compact-array-2^32", "compact-string-2^32", "produce-array-2^31", "i32-array", "null"],
)
def test_lengths_past_the_frame_and_forbidden_nulls_get_invalid_request(
    kafka: BrokerProcess, api_key: int, version: int, body: bytes
) -> None:
    """Found by mutation fuzzing: one such frame took the whole broker down."""
    header = flexible_request_header(api_key, version, 4321)
    if api_key == METADATA and version < 9:
        header = request_header(api_key, version, 4321)
    with KafkaWire(kafka.bootstrap) as wire:
        assert_invalid_request_then_served(wire, header + body, api_key, version, 4321)
    assert kafka.process is not None and kafka.process.poll() is None, kafka.tail()


# --- pipelining --------------------------------------------------------------------------------


def test_pipelined_requests_are_answered_in_order(kafka: BrokerProcess) -> None:
    """20 requests sent back to back (produces waiting for their upload among fast metadata
    requests, an acks=0 produce that gets no answer): the responses come back in request
    order, each with its own correlation id."""
    plan: list[tuple[int, int, object]] = []
    for i in range(20):
        kind = i % 5
        if kind == 0:
            plan.append((PRODUCE, 9, produce_body("target", i % 2, make_batch(0, [b"p%d" % i]))))
        elif kind == 1:
            plan.append((API_VERSIONS, 3, {}))
        elif kind == 2:
            plan.append((METADATA, 9, metadata_body(["target"])))
        elif kind == 3:
            plan.append((FETCH, 12, fetch_body("target", 0, 0, max_wait_ms=50)))
        else:
            body = {
                "replica_id": -1,
                "topics": [
                    {"name": "target", "partitions": [{"partition_index": 1, "timestamp": -1}]}
                ],
            }
            plan.append((LIST_OFFSETS, 7, body))
    plan.insert(7, (PRODUCE, 9, produce_body("target", 0, make_batch(0, [b"fire"]), acks=0)))
    with KafkaWire(kafka.bootstrap) as wire:
        payload = b"".join(
            codec.encode_request(api, version, 100 + n, body)
            for n, (api, version, body) in enumerate(plan)
        )
        wire.send_raw(payload)  # all 21 frames in one write
        expected = [(100 + n, api, v) for n, (api, v, _) in enumerate(plan) if n != 7]
        for correlation_id, api, version in expected:
            frame = wire.recv_frame()
            assert correlation_id_of(frame) == correlation_id
            response = codec.decode_response(frame, api, version)
            if api == PRODUCE:
                assert produce_partition(response)[0] == NONE


# --- fuzzing ---------------------------------------------------------------------------------

_SERVED = [
    (spec.key, version)
    for spec in API_TABLE.values()
    for version in range(spec.min_version, spec.max_version + 1)
]
_ADVERTISED = [
    (PRODUCE, 0, 11),
    (FETCH, 0, 16),
    (LIST_OFFSETS, 0, 8),
    (METADATA, 0, 12),
    (API_VERSIONS, 0, 3),
    (19, 2, 7),
    (20, 1, 6),
    (21, 0, 2),
    (22, 0, 5),
    (23, 2, 4),
    (32, 1, 4),
    (37, 0, 3),
    (44, 0, 1),
    (48, 0, 1),
    (49, 0, 1),
    (60, 0, 1),
]


@st.composite
def fuzz_frames(draw: st.DrawFn) -> bytes:
    """Whole frames: random bytes, or a plausible header (any API, any version) + random body."""
    kind = draw(st.sampled_from(["random", "header", "valid-prefix", "any-api"]))
    if kind == "random":
        payload = draw(st.binary(max_size=300))
    elif kind == "header":
        api_key, low, high = draw(st.sampled_from(_ADVERTISED))
        version = draw(st.integers(min_value=low - 2, max_value=high + 2))
        client = draw(st.text(max_size=10))
        payload = request_header(api_key, version, 1, client) + draw(st.binary(max_size=300))
    elif kind == "any-api":
        # a full request of any served API and version with a few bytes set to anything: the
        # class of frame (a huge claimed array length) that once aborted the broker
        api_key, version = draw(st.sampled_from(_SERVED))
        schema = codec.request_schema(api_key, version)
        broken = bytearray(codec.encode_request(api_key, version, 1, sample_body(schema))[4:])
        for _ in range(draw(st.integers(min_value=1, max_value=4))):
            position = draw(st.integers(min_value=8, max_value=len(broken) - 1))
            broken[position] = draw(st.integers(min_value=0, max_value=255))
        payload = bytes(broken)
    else:
        # a real request cut short or with bytes flipped
        frame = codec.encode_request(
            PRODUCE, 9, 1, produce_body("target", 0, make_batch(0, [b"fuzz"]), acks=1)
        )[4:]
        cut = draw(st.integers(min_value=0, max_value=len(frame)))
        flips = draw(st.lists(st.integers(min_value=0, max_value=max(cut - 1, 0)), max_size=4))
        broken = bytearray(frame[:cut])
        for position in flips:
            if position < len(broken):
                broken[position] ^= 0xFF
        payload = bytes(broken)
    return struct.pack(">i", len(payload)) + payload


def _answered_or_closed(bootstrap: str, frame: bytes) -> None:
    """Send ``frame`` then an ApiVersions request; wait for that answer or a close."""
    sentinel = codec.encode_request(API_VERSIONS, 0, 2_000_000_000, {})
    with socket.create_connection(tuple_address(bootstrap), timeout=10) as sock:
        sock.sendall(frame + sentinel)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return
            except TimeoutError:
                return  # a request that parsed into a long poll; the broker is checked below
            if not chunk:
                return
            received += chunk
            if struct.pack(">i", 2_000_000_000) in received:
                return


def tuple_address(bootstrap: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    return host, int(port)


def test_fuzzed_frames_never_take_the_broker_down(kafka: BrokerProcess) -> None:
    """Nor reach a handler in a state it cannot answer: no traceback in the broker's log."""
    seen = 0
    log_start = kafka.log_path.stat().st_size

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frame=fuzz_frames())
    def check(frame: bytes) -> None:
        nonlocal seen
        seen += 1
        _answered_or_closed(kafka.bootstrap, frame)
        assert kafka.process is not None and kafka.process.poll() is None, kafka.tail()

    check()
    assert seen >= 100
    with kafka.log_path.open("rb") as log:
        log.seek(log_start)
        written = log.read().decode(errors="replace")
    assert "Traceback" not in written, written[written.find("Traceback") - 300 :][:3000]


_TOPICS = st.sampled_from(["target", "healthy", "ghost", ""]) | st.text(max_size=20)
_PARTITIONS = st.integers(min_value=-2, max_value=4) | st.sampled_from([2**31 - 1, -(2**31)])
_OFFSETS = st.integers(min_value=-3, max_value=100) | st.sampled_from([2**63 - 1, -(2**63)])
_EPOCHS = st.integers(min_value=-2, max_value=3) | st.sampled_from([2**31 - 1, -(2**31)])


@st.composite
def odd_requests(draw: st.DrawFn) -> tuple[int, int, dict[str, object]]:
    """Well-formed requests with odd values: they must parse and get a proper answer."""
    kind = draw(st.sampled_from(["fetch", "list_offsets", "metadata", "epochs", "configs"]))
    if kind == "fetch":
        body = fetch_body(
            draw(_TOPICS),
            draw(_PARTITIONS),
            draw(_OFFSETS),
            max_wait_ms=draw(st.integers(min_value=0, max_value=50)),
            max_bytes=draw(st.integers(min_value=-1, max_value=1 << 20)),
        )
        body["min_bytes"] = draw(st.integers(min_value=-1, max_value=1 << 20))
        body["topics"][0]["partitions"][0]["current_leader_epoch"] = draw(_EPOCHS)
        return FETCH, draw(st.integers(min_value=4, max_value=12)), body
    if kind == "list_offsets":
        partition = {
            "partition_index": draw(_PARTITIONS),
            "current_leader_epoch": draw(_EPOCHS),
            "timestamp": draw(_OFFSETS | st.sampled_from([-1, -2, -3, 1_700_000_000_000])),
        }
        body = {"replica_id": -1, "topics": [{"name": draw(_TOPICS), "partitions": [partition]}]}
        return LIST_OFFSETS, draw(st.integers(min_value=1, max_value=8)), body
    if kind == "metadata":
        names = draw(st.lists(_TOPICS, max_size=3))
        return METADATA, draw(st.integers(min_value=4, max_value=12)), metadata_body(names, False)
    if kind == "epochs":
        partition = {
            "partition": draw(_PARTITIONS),
            "current_leader_epoch": draw(_EPOCHS),
            "leader_epoch": draw(_EPOCHS),
        }
        body = {"replica_id": -1, "topics": [{"topic": draw(_TOPICS), "partitions": [partition]}]}
        return 23, draw(st.integers(min_value=2, max_value=4)), body
    resource = {
        "resource_type": draw(st.sampled_from([0, 2, 4, 99, -1])),
        "resource_name": draw(_TOPICS),
        "configuration_keys": draw(st.none() | st.lists(st.text(max_size=12), max_size=2)),
    }
    return 32, draw(st.integers(min_value=1, max_value=4)), {"resources": [resource]}


def _error_codes(entity: object) -> list[int]:
    """Every error_code anywhere in a decoded response."""
    codes = []
    if hasattr(entity, "__dataclass_fields__"):
        for name in entity.__dataclass_fields__:
            value = getattr(entity, name)
            if name == "error_code":
                codes.append(int(value))
            else:
                codes += _error_codes(value)
    elif isinstance(entity, tuple):
        for item in entity:
            codes += _error_codes(item)
    return codes


def test_odd_but_well_formed_requests_get_proper_answers(kafka: BrokerProcess) -> None:
    """Negative partitions, offsets at the ends of i64, unknown names, zero budgets: each gets
    a response with its correlation id, and never UNKNOWN_SERVER_ERROR (a handler crash)."""

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(request=odd_requests())
    def check(request: tuple[int, int, dict[str, object]]) -> None:
        api_key, version, body = request
        with KafkaWire(kafka.bootstrap) as wire:
            sent = wire.send(api_key, version, body)
            received, response = wire.recv(api_key, version)
        assert received == sent
        assert -1 not in _error_codes(response), (api_key, version, body, response)

    check()


# Values at the edges of each wire type, names of topics no other test here uses.
_ODD_INTS = [0, 1, -1, 2, 3, 127, -128, 2**15 - 1, -(2**15), 2**31 - 1, -(2**31), 2**63 - 1]
_ODD_NAMES = ["", "fz", "fz2", "g", "x" * 300, "é☃", "__consumer_offsets", "..", "a/b"]
# timedelta_i64: milliseconds as a Python timedelta (kio) holds them, up to ~2**56.
_INT_BITS = {"int8": 7, "int16": 15, "int32": 31, "timedelta_i32": 31, "timedelta_i64": 55}
# Requests that would wait their whole timeout get a short one.
_SHORT_WAITS = {
    "timeout": 500,
    "timeout_ms": 500,
    "max_wait": 10,
    "max_wait_ms": 10,
    "rebalance_timeout_ms": 100,
}


def _odd_value(draw: st.DrawFn, annotation: Any, kafka_type: str | None) -> Any:
    args = [a for a in get_args(annotation) if a is not type(None)]
    nullable = len(args) < len(get_args(annotation))
    inner = args[0] if args and get_origin(annotation) is not tuple else annotation
    if nullable and draw(st.integers(0, 6)) == 0:
        return None
    if get_origin(inner) is tuple:
        item = get_args(inner)[0]
        return [_odd_value(draw, item, kafka_type) for _ in range(draw(st.integers(0, 3)))]
    if is_dataclass(inner):
        return _odd_body(draw, inner)  # type: ignore[arg-type]
    if kafka_type == "string":
        return draw(st.sampled_from(_ODD_NAMES))
    if kafka_type in ("bytes", "records"):
        return draw(st.sampled_from([b"", b"\x00\x01", make_batch(0, [b"odd"]), b"\x00" * 70]))
    if kafka_type == "uuid":
        return draw(st.sampled_from([uuid.UUID(int=0), uuid.UUID(int=12345)]))
    if kafka_type == "bool":
        return draw(st.booleans())
    if kafka_type == "float64":
        return draw(st.sampled_from([0.0, -1.0, 1e308]))
    if kafka_type == "uint16":
        return draw(st.sampled_from([0, 1, 65535]))
    bits = _INT_BITS.get(kafka_type or "", 63)
    value = draw(st.sampled_from(_ODD_INTS))
    return max(-(2**bits), min(2**bits - 1, value))


def _odd_body(draw: st.DrawFn, entity_type: type[Any]) -> dict[str, Any]:
    hints = get_type_hints(entity_type)
    body = {
        field.name: _odd_value(draw, hints[field.name], field.metadata.get("kafka_type"))
        for field in fields(entity_type)
    }
    return {**body, **{k: v for k, v in _SHORT_WAITS.items() if k in body}}


@st.composite
def any_api_requests(draw: st.DrawFn) -> tuple[int, int, dict[str, Any]]:
    """Well-formed requests of every served API but DeleteTopics, with edge values."""
    api_key, version = draw(st.sampled_from([(k, v) for k, v in _SERVED if k != 20]))
    return api_key, version, _odd_body(draw, codec.request_schema(api_key, version))


def test_every_api_answers_edge_values_without_a_server_error(kafka: BrokerProcess) -> None:
    """Found this way: a v13 fetch naming the all-zero topic id failed in its handler, and an
    InitProducerId at the last producer epoch produced an answer that could not be encoded."""
    log_start = kafka.log_path.stat().st_size

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(request=any_api_requests())
    def check(request: tuple[int, int, dict[str, Any]]) -> None:
        api_key, version, body = request
        with KafkaWire(kafka.bootstrap) as wire:
            sent = wire.send(api_key, version, body)
            if api_key == PRODUCE and body.get("acks") == 0:
                return  # no answer
            if api_key == DESCRIBE_TRANSACTIONS:
                # kio refuses the start time -1 that Kafka (and KafScale) send for a transaction
                # that is not ongoing: a handler failure shows in the broker's log, checked below
                assert correlation_id_of(wire.recv_frame()) == sent
                return
            if api_key in DELEGATION_TOKEN_APIS:
                # the same for the -1 timestamps of a refused token request: the error code,
                # the first field of each of these bodies, is read by hand
                frame = wire.recv_frame()
                assert correlation_id_of(frame) == sent
                assert _leading_error_code(frame, api_key, version) != -1, (api_key, body)
                return
            received, response = wire.recv(api_key, version)
        assert received == sent
        assert -1 not in _error_codes(response), (api_key, version, body, response)

    check()
    with kafka.log_path.open("rb") as log:
        log.seek(log_start)
        written = log.read().decode(errors="replace")
    assert "Traceback" not in written, written[written.find("Traceback") - 300 :][:3000]


def test_normal_clients_still_work_after_all_of_it(kafka: BrokerProcess) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    for i in range(10):
        producer.produce("healthy", value=b"after-%d" % i, partition=1)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition("healthy", 1, 0)])
        values = []
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if b"after-9" in values:
                break
    finally:
        consumer.close()
    assert [v for v in values if v.startswith(b"after-")] == [b"after-%d" % i for i in range(10)]


# --- protocol honesty: what is not served is never an empty success -------------------------

DESCRIBE_QUORUM, DESCRIBE_TRANSACTIONS = 55, 65
DELEGATION_TOKEN_APIS = frozenset(range(38, 42))  # Create, Renew, Expire, Describe


def _leading_error_code(frame: bytes, api_key: int, version: int) -> int:
    """The int16 right after the response header: where these APIs put their error code."""
    header_schema = codec.response_schema(api_key, version).__header_schema__
    _, header_size = entity_reader(header_schema)(frame, 0)
    return int.from_bytes(frame[header_size : header_size + 2], "big", signed=True)


# Unserved APIs whose responses have no error field: the share coordinator's state RPCs
# (KIP-932: KafScale keeps share state in etcd) and streams groups (KIP-1071).
READ_SHARE_GROUP_STATE_SUMMARY, STREAMS_GROUP_DESCRIBE = 87, 89
INVALID_RECORD, TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 87, 53


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (READ_SHARE_GROUP_STATE_SUMMARY, 0),
        (READ_SHARE_GROUP_STATE_SUMMARY, 1),
        (STREAMS_GROUP_DESCRIBE, 0),
    ],
)
def test_an_unserved_api_without_an_error_field_closes_the_connection(
    kafka: BrokerProcess, api_key: int, version: int
) -> None:
    """TxnOffsetCommit (before transactions were served) used to get a response with no topics:
    a client takes that for a commit. As Kafka does for an API it does not enable, the
    connection is closed instead."""
    assert api_key not in API_TABLE
    schema = codec.request_schema(api_key, version)
    with KafkaWire(kafka.bootstrap) as wire:
        wire.send(api_key, version, sample_body(schema))
        assert wire.is_closed_by_peer()


def test_an_unserved_api_with_an_error_field_gets_unsupported_version(
    kafka: BrokerProcess,
) -> None:
    assert DESCRIBE_QUORUM not in API_TABLE
    with KafkaWire(kafka.bootstrap) as wire:
        body = sample_body(codec.request_schema(DESCRIBE_QUORUM, 1))
        response = wire.request(DESCRIBE_QUORUM, 1, body)
        assert int(response.error_code) == UNSUPPORTED_VERSION


def test_api_versions_names_only_apis_in_the_table(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        advertised = wire.request(API_VERSIONS, 3, {})
    keys = {int(k.api_key) for k in advertised.api_keys}
    assert keys == set(API_TABLE)
    assert not keys & {
        READ_SHARE_GROUP_STATE_SUMMARY,
        STREAMS_GROUP_DESCRIBE,
        DESCRIBE_QUORUM,
    }


def test_a_control_batch_from_a_client_is_invalid_record_and_not_stored(
    kafka: BrokerProcess,
) -> None:
    """Only a transaction coordinator writes markers (Kafka's LogValidator refuses them). A
    marker with the transactional bit too gets the transactional refusal below first."""
    with KafkaWire(kafka.bootstrap) as wire:
        before = high_watermark(wire, "target", 1)
        marker = make_batch(0, [b"\x00\x00\x00\x00"], attributes=0x20, producer_id=7)
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body("target", 1, marker)))
        assert code == INVALID_RECORD
        assert high_watermark(wire, "target", 1) == before


def test_a_transactional_batch_without_a_transactional_id_is_refused(
    kafka: BrokerProcess,
) -> None:
    """As KafkaApis does: transactional records need a transactional id, so the whole request
    gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED."""
    with KafkaWire(kafka.bootstrap) as wire:
        before = high_watermark(wire, "target", 1)
        batch = make_batch(
            0, [b"txn"], attributes=0x10, producer_id=7, producer_epoch=0, base_sequence=0
        )
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body("target", 1, batch)))
        assert code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert high_watermark(wire, "target", 1) == before
