"""The kio glue (``broker/protocol/codec.py``): dict → entity of the asked version, and back.

Handlers answer with dictionaries shaped like the newest version; these tests check that every
version a client may pin gets exactly its own fields (the others dropped), that absent fields
take their defaults, that milliseconds, error codes and UUIDs are converted, and that what the
broker writes is what a reader of that version parses back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import struct
import uuid
from typing import Any

import pytest
from harness.batches import make_batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

API_PRODUCE, API_FETCH, API_METADATA, API_VERSIONS = 0, 1, 3, 18

i16s = st.integers(-(2**15), 2**15 - 1)
i32s = st.integers(-(2**31), 2**31 - 1)
i64s = st.integers(-(2**63), 2**63 - 1)
offsets = st.integers(-1, 2**62)
millis_i32 = st.integers(0, 2**31 - 1)
names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40
)
error_codes = st.sampled_from([ErrorCode.NONE, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode(2)])
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def round_trip(api_key: int, version: int, body: dict[str, Any], correlation_id: int = 7) -> Any:
    frame = codec.encode_response(api_key, version, correlation_id, body)
    (length,) = struct.unpack_from(">i", frame)
    assert length == len(frame) - 4
    (echoed,) = struct.unpack_from(">i", frame, 4)
    assert echoed == correlation_id
    return codec.decode_response(frame[4:], api_key, version)


def field_names(entity: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(entity)}


# --- peek_header ------------------------------------------------------------------------------


@given(st.binary(max_size=7))
def test_peek_header_rejects_frames_shorter_than_a_header(frame: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.peek_header(frame)


@given(i16s, i16s, i32s, st.binary(max_size=20))
def test_peek_header_reads_key_version_and_correlation_id(
    api_key: int, version: int, correlation_id: int, rest: bytes
) -> None:
    frame = struct.pack(">hhi", api_key, version, correlation_id) + rest
    assert codec.peek_header(frame) == (api_key, version, correlation_id)


def test_unknown_api_or_version_is_unknown_api() -> None:
    with pytest.raises(codec.UnknownApi):
        codec.request_schema(9999, 0)
    with pytest.raises(codec.UnknownApi):
        codec.request_schema(API_VERSIONS, 999)


def test_legacy_apis_are_the_apis_of_the_legacy_layouts() -> None:
    from kafscale.broker.protocol import legacy_schemas

    keys = {*legacy_schemas.REQUESTS, *legacy_schemas.RESPONSES}
    assert {api_key for api_key, _ in keys} == codec.LEGACY_APIS


def test_legacy_versions_are_served_from_the_legacy_layouts_kio_lacks() -> None:
    """The codec asks kio first and the legacy layouts on a miss: the same answer as the other
    order only while kio knows none of those versions."""
    from kio.index import load_request_schema, load_response_schema

    from kafscale.broker.protocol import legacy_schemas

    for (api_key, version), schema in legacy_schemas.REQUESTS.items():
        with pytest.raises(Exception):  # noqa: B017 - kio raises its own index errors
            load_request_schema(api_key, version)
        assert codec.request_schema(api_key, version) is schema
    for (api_key, version), schema in legacy_schemas.RESPONSES.items():
        with pytest.raises(Exception):  # noqa: B017
            load_response_schema(api_key, version)
        assert codec.response_schema(api_key, version) is schema
    with pytest.raises(codec.UnknownApi):
        codec.request_schema(0, 999)  # a legacy API, a version in neither


# --- ApiVersions ------------------------------------------------------------------------------

api_version_lists = st.lists(
    st.tuples(st.integers(0, 80), st.integers(0, 5), st.integers(0, 20)).map(
        lambda t: {"api_key": t[0], "min_version": t[1], "max_version": t[1] + t[2]}
    ),
    max_size=30,
)


@FAST
@given(api_version_lists, millis_i32, st.sampled_from([0, 1, 2, 3]))
def test_api_versions_round_trip_in_every_version(
    api_keys: list[dict[str, int]], throttle_ms: int, version: int
) -> None:
    body = {"error_code": ErrorCode.NONE, "api_keys": api_keys, "throttle_time": throttle_ms}
    decoded = round_trip(API_VERSIONS, version, body)
    assert decoded.error_code == KioErrorCode.none
    assert [(a.api_key, a.min_version, a.max_version) for a in decoded.api_keys] == [
        (a["api_key"], a["min_version"], a["max_version"]) for a in api_keys
    ]
    if version == 0:
        assert "throttle_time" not in field_names(decoded)
    else:
        assert decoded.throttle_time == datetime.timedelta(milliseconds=throttle_ms)
    if version == 3:  # fields the handler did not give take the schema's defaults
        assert decoded.supported_features == ()
        assert decoded.finalized_features_epoch == -1
        assert decoded.zk_migration_ready is False


def test_api_versions_v3_response_header_is_not_flexible() -> None:
    """KIP-511: ApiVersions responses keep header v0 (no tag buffer) even at v3, so that a
    client that sent a too-new version can still read the UNSUPPORTED_VERSION answer."""
    frame = codec.encode_response(
        API_VERSIONS,
        3,
        99,
        {
            "error_code": ErrorCode.UNSUPPORTED_VERSION,
            "api_keys": [{"api_key": 18, "max_version": 3}],
        },
    )
    assert frame[4:8] == struct.pack(">i", 99)
    assert frame[8:10] == struct.pack(">h", ErrorCode.UNSUPPORTED_VERSION)
    assert frame[10] == 2  # compact array of one entry, right after the error code


def test_api_versions_v0_accepts_unsupported_version_answer() -> None:
    decoded = round_trip(
        API_VERSIONS, 0, {"error_code": 35, "api_keys": [{"api_key": 18, "max_version": 3}]}
    )
    assert decoded.error_code == KioErrorCode.unsupported_version
    assert decoded.api_keys[0].min_version == 0  # missing int field: zero


# --- Metadata ---------------------------------------------------------------------------------


@st.composite
def metadata_bodies(draw: st.DrawFn) -> dict[str, Any]:
    brokers = [
        {
            "node_id": node_id,
            "host": draw(names),
            "port": draw(st.integers(1, 65535)),
            "rack": draw(st.none() | names),
        }
        for node_id in draw(st.lists(st.integers(0, 1000), unique=True, max_size=5))
    ]
    topics = []
    for name in draw(st.lists(names, unique=True, max_size=4)):
        partitions = [
            {
                "error_code": draw(error_codes),
                "partition_index": index,
                "leader_id": draw(st.integers(-1, 1000)),
                "leader_epoch": draw(st.integers(-1, 2**31 - 1)),
                "replica_nodes": draw(st.lists(st.integers(0, 1000), max_size=3)),
                "isr_nodes": draw(st.lists(st.integers(0, 1000), max_size=3)),
            }
            for index in range(draw(st.integers(0, 4)))
        ]
        topics.append(
            {
                "error_code": ErrorCode.NONE,
                "name": name,
                "topic_id": draw(st.uuids()),
                "partitions": partitions,
            }
        )
    return {
        "throttle_time": draw(millis_i32),
        "brokers": brokers,
        "cluster_id": draw(names),
        "controller_id": draw(st.integers(-1, 1000)),
        "topics": topics,
    }


@FAST
@given(metadata_bodies(), st.sampled_from([1, 4, 9, 12]))
def test_metadata_round_trip_keeps_what_each_version_has(
    body: dict[str, Any], version: int
) -> None:
    decoded = round_trip(API_METADATA, version, body)
    assert [(b.node_id, b.host, b.port, b.rack) for b in decoded.brokers] == [
        (b["node_id"], b["host"], b["port"], b["rack"]) for b in body["brokers"]
    ]
    assert decoded.controller_id == body["controller_id"]
    for got, want in zip(decoded.topics, body["topics"], strict=True):
        assert got.name == want["name"]
        assert got.is_internal is False  # not given: default
        assert [p.partition_index for p in got.partitions] == [
            p["partition_index"] for p in want["partitions"]
        ]
        for got_p, want_p in zip(got.partitions, want["partitions"], strict=True):
            assert int(got_p.error_code) == int(want_p["error_code"])
            assert got_p.leader_id == want_p["leader_id"]
            assert list(got_p.replica_nodes) == want_p["replica_nodes"]
            assert list(got_p.isr_nodes) == want_p["isr_nodes"]
            if version >= 7:
                assert got_p.leader_epoch == want_p["leader_epoch"]
                assert got_p.offline_replicas == ()  # not given: empty
            else:
                assert "leader_epoch" not in field_names(got_p)
        if version >= 10:
            assert got.topic_id == want["topic_id"]
        else:
            assert "topic_id" not in field_names(got)
    if version >= 2:
        assert decoded.cluster_id == body["cluster_id"]
    else:
        assert "cluster_id" not in field_names(decoded)
    if version >= 3:
        assert decoded.throttle_time == datetime.timedelta(milliseconds=body["throttle_time"])
    else:
        assert "throttle_time" not in field_names(decoded)


# --- Produce ----------------------------------------------------------------------------------


@st.composite
def produce_responses(draw: st.DrawFn) -> dict[str, Any]:
    topics = []
    for name in draw(st.lists(names, unique=True, min_size=1, max_size=3)):
        partitions = [
            {
                "index": index,
                "error_code": draw(error_codes),
                "base_offset": draw(offsets),
                "log_append_time": -1,
                "log_start_offset": draw(offsets),
            }
            for index in draw(st.lists(st.integers(0, 100), unique=True, min_size=1, max_size=4))
        ]
        topics.append({"name": name, "partition_responses": partitions})
    return {"responses": topics, "throttle_time": draw(millis_i32)}


@FAST
@given(produce_responses(), st.sampled_from([3, 9]))
def test_produce_response_round_trip(body: dict[str, Any], version: int) -> None:
    decoded = round_trip(API_PRODUCE, version, body)
    assert decoded.throttle_time == datetime.timedelta(milliseconds=body["throttle_time"])
    for got, want in zip(decoded.responses, body["responses"], strict=True):
        assert got.name == want["name"]
        for got_p, want_p in zip(got.partition_responses, want["partition_responses"], strict=True):
            assert (got_p.index, int(got_p.error_code), got_p.base_offset) == (
                want_p["index"],
                int(want_p["error_code"]),
                want_p["base_offset"],
            )
            assert got_p.log_append_time is None  # -1: no log-append time
            if version >= 5:
                assert got_p.log_start_offset == want_p["log_start_offset"]
                assert got_p.record_errors == ()
                assert got_p.error_message is None
            else:
                assert "log_start_offset" not in field_names(got_p)


def test_produce_response_log_append_time_from_millis() -> None:
    body = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {
                        "index": 0,
                        "error_code": 0,
                        "base_offset": 0,
                        "log_append_time": 1_700_000_000_123,
                    }
                ],
            }
        ]
    }
    decoded = round_trip(API_PRODUCE, 9, body)
    stamp = decoded.responses[0].partition_responses[0].log_append_time
    assert codec.millis(stamp) == 1_700_000_000_123


# --- Fetch ------------------------------------------------------------------------------------


@st.composite
def fetch_responses(draw: st.DrawFn) -> dict[str, Any]:
    topics = []
    for name in draw(st.lists(names, unique=True, min_size=1, max_size=3)):
        partitions = []
        for index in draw(st.lists(st.integers(0, 50), unique=True, min_size=1, max_size=3)):
            base = draw(st.integers(0, 2**40))
            values = draw(st.lists(st.binary(max_size=50), min_size=1, max_size=3))
            partitions.append(
                {
                    "partition_index": index,
                    "error_code": ErrorCode.NONE,
                    "high_watermark": base + len(values),
                    "last_stable_offset": base + len(values),
                    "log_start_offset": draw(st.integers(0, base)),
                    "records": make_batch(base, values),
                }
            )
        topics.append({"topic": name, "topic_id": draw(st.uuids()), "partitions": partitions})
    return {
        "throttle_time": draw(millis_i32),
        "error_code": ErrorCode.NONE,
        "session_id": draw(st.integers(0, 2**31 - 1)),
        "responses": topics,
    }


@FAST
@given(fetch_responses(), st.sampled_from([4, 11, 13]))
def test_fetch_response_round_trip_with_names_or_topic_ids(
    body: dict[str, Any], version: int
) -> None:
    decoded = round_trip(API_FETCH, version, body)
    for got, want in zip(decoded.responses, body["responses"], strict=True):
        if version >= 13:
            assert got.topic_id == want["topic_id"]
            assert "topic" not in field_names(got)
        else:
            assert got.topic == want["topic"]
            assert "topic_id" not in field_names(got)
        for got_p, want_p in zip(got.partitions, want["partitions"], strict=True):
            assert got_p.partition_index == want_p["partition_index"]
            assert got_p.high_watermark == want_p["high_watermark"]
            assert got_p.last_stable_offset == want_p["last_stable_offset"]
            assert bytes(got_p.records) == want_p["records"]
            assert got_p.aborted_transactions is None  # nullable and not given
            if version >= 5:
                assert got_p.log_start_offset == want_p["log_start_offset"]
            if version >= 11:
                assert got_p.preferred_read_replica == -1
    if version >= 7:
        assert decoded.session_id == body["session_id"]
    else:
        assert "session_id" not in field_names(decoded)


def test_fetch_v13_defaults_for_fields_left_out() -> None:
    topic_id = uuid.uuid4()
    body = {"responses": [{"topic_id": topic_id, "partitions": [{"partition_index": 3}]}]}
    decoded = round_trip(API_FETCH, 13, body)
    assert decoded.throttle_time == datetime.timedelta(0)
    assert decoded.error_code == KioErrorCode.none
    partition = decoded.responses[0].partitions[0]
    assert partition.error_code == KioErrorCode.none
    assert partition.high_watermark == 0
    assert partition.last_stable_offset == -1  # schema default, not zero
    assert partition.log_start_offset == -1
    assert partition.diverging_epoch.epoch == -1
    assert partition.current_leader.leader_id == -1
    assert partition.records is None


# --- build_entity conversions -----------------------------------------------------------------


@given(millis_i32)
def test_millisecond_ints_become_timedeltas(ms: int) -> None:
    schema = codec.response_schema(API_FETCH, 11)
    entity = codec.build_entity(schema, {"throttle_time": ms, "responses": []})
    assert entity.throttle_time == datetime.timedelta(milliseconds=ms)
    assert codec.millis(entity.throttle_time) == ms


def test_timedeltas_pass_through() -> None:
    schema = codec.response_schema(API_FETCH, 11)
    delta = datetime.timedelta(milliseconds=1234)
    assert codec.build_entity(schema, {"throttle_time": delta}).throttle_time == delta


def test_fields_missing_in_the_version_are_dropped() -> None:
    schema = codec.response_schema(API_METADATA, 1)
    entity = codec.build_entity(
        schema,
        {"throttle_time": 5, "cluster_id": "c", "brokers": [], "topics": [], "not_a_field": 1},
    )
    assert field_names(entity) == {"brokers", "controller_id", "topics"}


def test_missing_fields_get_defaults_or_zero_values() -> None:
    schema = codec.response_schema(API_METADATA, 12)
    entity = codec.build_entity(schema, {"topics": [{"name": "t"}]})
    assert entity.brokers == ()
    assert entity.cluster_id is None  # nullable, default None
    assert entity.controller_id == -1  # schema default
    topic = entity.topics[0]
    assert topic.error_code == KioErrorCode.none
    assert topic.topic_id is None  # nullable uuid
    assert topic.partitions == ()
    assert topic.topic_authorized_operations == -(2**31)


def test_none_for_non_nullable_fields_becomes_zero() -> None:
    schema = codec.response_schema(API_METADATA, 9)
    entity = codec.build_entity(schema, {"brokers": None, "topics": [{"name": None}]})
    assert entity.brokers == ()
    assert entity.topics[0].name == ""


@given(st.uuids())
def test_uuid_forms_are_accepted(value: uuid.UUID) -> None:
    schema = codec.response_schema(API_METADATA, 12)
    for form in (value, str(value), value.bytes, value.hex):
        entity = codec.build_entity(schema, {"topics": [{"name": "t", "topic_id": form}]})
        assert entity.topics[0].topic_id == value
    assert codec.uuid_to_str(value) == value.hex
    assert codec.uuid_to_str(None) == ""


@given(st.integers(-(2**40), 2**42))
def test_millis_of_timestamps_and_ints(ms: int) -> None:
    stamp = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=ms)
    assert codec.millis(stamp) == ms
    assert codec.millis(datetime.timedelta(milliseconds=ms)) == ms
    assert codec.millis(ms) == ms


def test_entities_nest_from_dicts_and_accept_ready_entities() -> None:
    schema = codec.response_schema(API_FETCH, 13)
    entity = codec.build_entity(schema, {"responses": [{"partitions": [{"partition_index": 1}]}]})
    ready_topic = entity.responses[0]
    again = codec.build_entity(schema, {"responses": [ready_topic]})
    assert again.responses[0] is ready_topic


# --- requests ---------------------------------------------------------------------------------


@st.composite
def produce_requests(draw: st.DrawFn) -> dict[str, Any]:
    topics = []
    for name in draw(st.lists(names, unique=True, min_size=1, max_size=3)):
        partitions = [
            {
                "index": index,
                "records": make_batch(
                    0, draw(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
                ),
            }
            for index in draw(st.lists(st.integers(0, 100), unique=True, min_size=1, max_size=3))
        ]
        topics.append({"name": name, "partition_data": partitions})
    return {
        "transactional_id": None,
        "acks": draw(st.sampled_from([-1, 0, 1])),
        "timeout": draw(millis_i32),
        "topic_data": topics,
    }


@FAST
@given(produce_requests(), st.sampled_from([3, 7, 9]), i32s)
def test_produce_request_round_trip(
    body: dict[str, Any], version: int, correlation_id: int
) -> None:
    frame = codec.encode_request(API_PRODUCE, version, correlation_id, body)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    assert codec.peek_header(frame[4:]) == (API_PRODUCE, version, correlation_id)
    decoded = codec.decode_request(frame[4:], codec.request_schema(API_PRODUCE, version))
    assert decoded.header == codec.RequestHeader(API_PRODUCE, version, correlation_id, "kafscale")
    request = decoded.body
    assert request.acks == body["acks"]
    assert codec.millis(request.timeout) == body["timeout"]
    assert request.transactional_id is None
    got = [
        (t.name, p.index, bytes(p.records)) for t in request.topic_data for p in t.partition_data
    ]
    want = [
        (t["name"], p["index"], p["records"])
        for t in body["topic_data"]
        for p in t["partition_data"]
    ]
    assert got == want


@FAST
@given(
    st.sampled_from([4, 11, 13]),
    st.lists(
        st.tuples(names, st.uuids(), st.integers(0, 100), st.integers(0, 2**50)),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 60_000),
)
def test_fetch_request_round_trip(
    version: int, wanted: list[tuple[str, uuid.UUID, int, int]], max_wait_ms: int
) -> None:
    body = {
        "replica_id": -1,
        "max_wait": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "topics": [
            {
                "topic": name,
                "topic_id": topic_id,
                "partitions": [
                    {"partition": p, "fetch_offset": offset, "partition_max_bytes": 1 << 16}
                ],
            }
            for name, topic_id, p, offset in wanted
        ],
        "forgotten_topics_data": [],
    }
    frame = codec.encode_request(API_FETCH, version, 5, body)
    request = codec.decode_request(frame[4:], codec.request_schema(API_FETCH, version)).body
    assert codec.millis(request.max_wait) == max_wait_ms
    for topic, (name, topic_id, p, offset) in zip(request.topics, wanted, strict=True):
        if version >= 13:
            assert topic.topic_id == topic_id
        else:
            assert topic.topic == name
        assert (topic.partitions[0].partition, topic.partitions[0].fetch_offset) == (p, offset)
        if version >= 9:
            assert topic.partitions[0].current_leader_epoch == -1  # default
    if version >= 7:
        assert request.session_epoch == -1  # default: full fetch, no session


@pytest.mark.parametrize("version", [1, 4, 9, 12])
def test_metadata_request_round_trip(version: int) -> None:
    schema = codec.request_schema(API_METADATA, version)
    topics = [{"name": "a", "topic_id": uuid.UUID(int=0)}, {"name": "b.c-d"}]
    frame = codec.encode_request(API_METADATA, version, 11, {"topics": topics})
    request = codec.decode_request(frame[4:], schema).body
    assert [t.name for t in request.topics] == ["a", "b.c-d"]
    null_frame = codec.encode_request(API_METADATA, version, 12, {"topics": None})
    assert codec.decode_request(null_frame[4:], schema).body.topics is None  # all topics


@pytest.mark.parametrize("version", [0, 3])
def test_api_versions_request_round_trip(version: int) -> None:
    body = {"client_software_name": "kcat", "client_software_version": "1.7"}
    frame = codec.encode_request(API_VERSIONS, version, 3, body)
    decoded = codec.decode_request(frame[4:], codec.request_schema(API_VERSIONS, version))
    assert decoded.header.correlation_id == 3
    if version == 3:
        assert decoded.body.client_software_name == "kcat"
    else:
        assert field_names(decoded.body) == set()


def test_encode_request_accepts_an_entity() -> None:
    schema = codec.request_schema(API_VERSIONS, 3)
    entity = schema(client_software_name="x", client_software_version="y")
    frame = codec.encode_request(API_VERSIONS, 3, 1, entity)
    assert codec.decode_request(frame[4:], schema).body == entity


SAMPLE_REQUESTS = [
    (API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"}),
    (API_METADATA, 4, {"topics": [{"name": "orders"}], "allow_auto_topic_creation": True}),
    (API_METADATA, 12, {"topics": [{"name": "orders"}]}),
    (API_PRODUCE, 3, {"acks": -1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": make_batch(0, [b"v"])}]}]}),
    (API_PRODUCE, 9, {"acks": 1, "timeout": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": make_batch(0, [b"v"])}]}]}),
    (API_FETCH, 13, {"max_wait": 500, "min_bytes": 1, "topics": [
        {"topic_id": uuid.uuid4(), "partitions": [
            {"partition": 0, "fetch_offset": 5, "partition_max_bytes": 1000}]}]}),
]  # fmt: skip


@FAST
@given(st.sampled_from(SAMPLE_REQUESTS), st.data())
def test_truncated_requests_raise_decode_error(
    sample: tuple[int, int, dict[str, Any]], data: st.DataObject
) -> None:
    api_key, version, body = sample
    frame = codec.encode_request(api_key, version, 1, body)[4:]
    cut = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(codec.DecodeError):
        codec.decode_request(frame[:cut], codec.request_schema(api_key, version))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SAMPLE_REQUESTS), st.binary(max_size=200))
def test_garbage_bodies_raise_only_decode_error(
    sample: tuple[int, int, dict[str, Any]], garbage: bytes
) -> None:
    """A frame with a readable header but an unparsable body must not escape as anything but
    DecodeError: the server answers it (or drops the connection) and lives on."""
    api_key, version, _ = sample
    schema = codec.request_schema(api_key, version)
    frame = struct.pack(">hhi", api_key, version, 1) + garbage
    with contextlib.suppress(codec.DecodeError):
        codec.decode_request(frame, schema)


# --- the encoder refuses keys no version has ----------------------------------------------------


def test_a_misspelt_top_level_key_is_refused() -> None:
    with pytest.raises(codec.UnknownResponseField, match="erorr_code"):
        codec.encode_response(18, 3, 1, {"erorr_code": 35, "api_keys": []})


def test_a_misspelt_nested_key_is_refused() -> None:
    body = {
        "responses": [
            {"name": "t", "partition_responses": [{"index": 0, "eror_code": 6}]},
        ]
    }
    with pytest.raises(codec.UnknownResponseField, match="partition_responses"):
        codec.encode_response(0, 9, 1, body)


def test_a_key_of_a_newer_version_is_dropped_for_an_older_one() -> None:
    """Handlers answer in the newest shape; fields an older version lacks are not typos."""
    body = {"error_code": 0, "api_keys": [], "throttle_time": 0, "finalized_features_epoch": 3}
    frame = codec.encode_response(18, 0, 1, body)
    response = codec.decode_response(frame[4:], 18, 0)
    assert int(response.error_code) == 0


def test_a_first_answer_loads_the_schema_of_its_own_version_only() -> None:
    """A new broker's first answer of an API used to load the response schema of every version
    (~80 ms of CPU for Produce or Metadata) to look for misspelt keys; a body whose keys its own
    version has needs only that version's schema."""
    codec.response_schema.cache_clear()
    codec.response_fields.cache_clear()
    body = {
        "responses": [
            {
                "name": "t",
                "partition_responses": [
                    {"index": 0, "error_code": 0, "base_offset": 5, "log_start_offset": 0}
                ],
            }
        ],
        "throttle_time": 0,
    }
    frame = codec.encode_response(0, 11, 1, body)
    assert codec.response_schema.cache_info().currsize == 1
    response = codec.decode_response(frame[4:], 0, 11)
    assert int(response.responses[0].partition_responses[0].base_offset) == 5
    with pytest.raises(codec.UnknownResponseField, match="base_ofset"):
        codec.encode_response(0, 11, 1, {"responses": [{"name": "t", "partition_responses": [
            {"index": 0, "base_ofset": 5}]}]})  # fmt: skip


def test_has_error_code_follows_the_schema() -> None:
    assert codec.has_error_code(18, 0)
    assert not codec.has_error_code(28, 3)  # TxnOffsetCommit: per-partition codes only
    assert not codec.has_error_code(1, 4)  # Fetch before v7
    assert codec.has_error_code(1, 7)
    assert not codec.has_error_code(999, 0)
