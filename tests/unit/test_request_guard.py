"""The structural check that runs before kio's native reader (``broker/protocol/guard.py``).

It must accept every request a client can send (for every API and version the broker serves,
with arrays, strings, records and tagged fields filled in: ``harness.kafka_wire.sample_body``,
it walks to exactly the end), and
refuse what would make kio reserve memory for elements the frame does not hold: a 30-byte frame
claiming 2^32 elements aborted the broker process.
"""

from __future__ import annotations

import struct
import sys

import pytest
from harness import children
from harness.kafka_wire import sample_body, uvarint

from kafscale.broker.api.table import API_TABLE
from kafscale.broker.protocol import codec, guard
from kafscale.broker.protocol.guard import MalformedRequest

pytestmark = pytest.mark.unit

SERVED = [
    (spec.key, version)
    for spec in API_TABLE.values()
    for version in range(spec.min_version, spec.max_version + 1)
]


def header_size(frame: bytes, api_key: int, version: int) -> int:
    """Where the body starts, as the broker finds it (kio's header reader)."""
    from kio.serial import entity_reader

    schema = codec.request_schema(api_key, version)
    _, size = entity_reader(schema.__header_schema__)(memoryview(frame).toreadonly(), 0)
    return int(size)


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=[f"{k}v{v}" for k, v in SERVED])
def test_every_served_request_walks_to_exactly_its_end(api_key: int, version: int) -> None:
    schema = codec.request_schema(api_key, version)
    frame = codec.encode_request(api_key, version, 7, sample_body(schema))[4:]
    start = header_size(frame, api_key, version)
    assert guard.entity_walker(schema)(memoryview(frame), start, []) == len(frame)
    # and the broker's decoder accepts it with the check in front
    assert codec.decode_request(memoryview(frame).toreadonly(), schema).header.api_key == api_key


def test_an_array_longer_than_the_frame_is_refused() -> None:
    metadata_v12 = codec.request_schema(3, 12)  # flexible: compact array length
    with pytest.raises(MalformedRequest, match="topics: array of 4294967294 elements"):
        guard.check_body(metadata_v12, uvarint(2**32 - 1), 0)
    metadata_v8 = codec.request_schema(3, 8)  # not flexible: i32 length
    with pytest.raises(MalformedRequest, match="array of 2147483647 elements"):
        guard.check_body(metadata_v8, struct.pack(">i", 2**31 - 1), 0)
    # the same frames, whole, through the broker's decoder: a DecodeError, not an abort
    header = struct.pack(">hhih", 3, 8, 1, 1) + b"t"
    with pytest.raises(codec.DecodeError, match="array of 2147483647 elements"):
        codec.decode_request(header + struct.pack(">i", 2**31 - 1), metadata_v8)


def test_a_null_where_the_schema_allows_none_is_refused() -> None:
    """OffsetCommit's topics are not nullable; kio decoded a null one as None, and the handler
    and its error answer both failed iterating it."""
    offset_commit_v8 = codec.request_schema(8, 8)
    body = sample_body(offset_commit_v8)
    frame = codec.encode_request(8, 8, 1, body)[4:]
    start = header_size(frame, 8, 8)
    assert guard.entity_walker(offset_commit_v8)(memoryview(frame), start, []) == len(frame)
    # group_id "ab", generation, member_id "ab", group_instance_id (nullable), then topics:
    topics_at = frame.index(uvarint(3), start + 1 + 2 + 4 + 1 + 2 + 1 + 2)
    nulled = frame[:topics_at] + b"\x00" + b"\x00"  # topics = null, no tagged fields
    with pytest.raises(MalformedRequest, match="topics: null where the schema allows none"):
        guard.check_body(offset_commit_v8, nulled, start)
    # a nullable array may be null: Metadata v12's topics (null = every topic)
    metadata_v12 = codec.request_schema(3, 12)
    assert guard.check_body(metadata_v12, b"\x00\x01\x00\x00", 0) == []


def test_lengths_and_varints_that_run_past_the_end_are_refused() -> None:
    find_coordinator_v4 = codec.request_schema(10, 4)
    with pytest.raises(MalformedRequest, match="bytes wanted"):
        guard.check_body(find_coordinator_v4, b"\x00" + uvarint(2) + uvarint(2**32 - 1), 0)
    with pytest.raises(MalformedRequest, match="varint"):
        guard.check_body(find_coordinator_v4, b"\x00\xff\xff\xff\xff\xff\xff", 0)
    with pytest.raises(MalformedRequest, match="runs past the end"):
        guard.check_body(find_coordinator_v4, b"\x00\xff", 0)


def test_without_the_check_kio_aborts_the_process() -> None:
    """Why the check exists: kio's reader alone, on the 5-byte body claiming 2^32 - 2 topics,
    kills its process (SIGABRT after a failed 34 GB allocation) instead of raising. Should this
    start failing after a kio upgrade, kio checks lengths itself and the guard could go."""
    script = (
        "from kio.serial import entity_reader; from kafscale.broker.protocol import codec; "
        "entity_reader(codec.request_schema(3, 12))(memoryview(b'\\xff\\xff\\xff\\xff\\x0f'), 0)"
    )
    done = children.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=False
    )
    assert done.returncode != 0 and b"Traceback" not in done.stderr, done.stderr[-500:]


def test_tagged_fields_the_schema_does_not_know_are_cut_out_not_refused() -> None:
    """Kafka ignores unknown tagged fields (how a newer client's optional fields reach an older
    broker); kio refused the whole request. Known tags stay, unknown ones go, at any depth."""
    api_versions_v3 = codec.request_schema(18, 3)
    header = struct.pack(">hhih", 18, 3, 5, 1) + b"t" + b"\x00"
    names = uvarint(4) + b"kcl" + uvarint(4) + b"1.0"
    unknown = uvarint(2) + uvarint(97) + uvarint(3) + b"abc" + uvarint(200) + uvarint(0)
    decoded = codec.decode_request(header + names + unknown, api_versions_v3)
    assert (decoded.body.client_software_name, decoded.body.client_software_version) == (
        "kcl",
        "1.0",
    )

    metadata_v12 = codec.request_schema(3, 12)
    header = struct.pack(">hhih", 3, 12, 6, 1) + b"t" + b"\x00"
    topic = bytes(16) + uvarint(3) + b"ab" + uvarint(1) + uvarint(5) + uvarint(2) + b"zz"
    body = uvarint(2) + topic + b"\x01\x00" + b"\x00"
    decoded = codec.decode_request(header + body, metadata_v12)
    assert [t.name for t in decoded.body.topics] == ["ab"]
    assert decoded.body.allow_auto_topic_creation is True

    fetch_v12 = codec.request_schema(1, 12)
    frame = codec.encode_request(1, 12, 7, sample_body(fetch_v12))[4:]
    start = header_size(frame, 1, 12)
    assert guard.check_body(fetch_v12, frame, start) == []  # every tag it sets is known
    known = codec.decode_request(memoryview(frame).toreadonly(), fetch_v12).body
    assert known.cluster_id == "ab"  # tag 0 of FetchRequest v12, kept


def test_tagged_fields_in_the_request_header_are_cut_out() -> None:
    api_versions_v3 = codec.request_schema(18, 3)
    tags = uvarint(1) + uvarint(3) + uvarint(2) + b"hi"
    header = struct.pack(">hhih", 18, 3, 5, 1) + b"t" + tags
    body = uvarint(4) + b"kcl" + uvarint(4) + b"1.0" + b"\x00"
    decoded = codec.decode_request(header + body, api_versions_v3)
    assert (decoded.header.correlation_id, decoded.header.client_id) == (5, "t")
    assert decoded.body.client_software_name == "kcl"
    with pytest.raises(codec.DecodeError, match="client_id"):  # a header cut short
        codec.decode_request(struct.pack(">hhih", 18, 3, 5, 40) + b"t", api_versions_v3)


@pytest.mark.parametrize("replicas", [(2, 1), (3,), None])
def test_a_nullable_array_of_numbers_is_walked_as_an_array(
    replicas: tuple[int, ...] | None,
) -> None:
    """AlterPartitionReassignments' replicas (``[]int32``, null to cancel): walked as one
    4-byte number, a list of two read as a tagged field and the request refused."""
    partition = {"partition_index": 0, "replicas": replicas}
    body = {"timeout": 30_000, "topics": [{"name": "t", "partitions": [partition] * 2}]}
    schema = codec.request_schema(45, 1)
    frame = codec.encode_request(45, 1, 7, body)[4:]
    decoded = codec.decode_request(memoryview(frame).toreadonly(), schema).body
    assert [p.replicas for p in decoded.topics[0].partitions] == [replicas, replicas]
