"""The data source's pure decisions: options, offset ranges, data loss, admission, splits."""

from __future__ import annotations

import os

import pytest
from pydantic import SecretStr

from kafscale.broker.config import BrokerSettings, StorageKind, StorageSettings
from kafscale.pipeline.options import (
    EARLIEST,
    LATEST,
    Connection,
    SourceOptionError,
    configured_connection,
    connection_options,
    parse_connection,
    parse_duration_ms,
    parse_read_options,
)
from kafscale.pipeline.planning import (
    DataLoss,
    PartitionView,
    SegmentObject,
    clamp_start,
    delay_batch,
    from_json_offsets,
    rate_limit,
    resolve_offset,
    segments_for,
    split_tasks,
    to_json_offsets,
)

pytestmark = pytest.mark.unit

VIEW = PartitionView("t", "id", 0, log_start=10, high_watermark=100)


def test_connection_options_fall_back_to_the_brokers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFSCALE_CLUSTER", "prod")
    monkeypatch.setenv("KAFSCALE_STORAGE__PREFIX", "from-env")
    monkeypatch.setenv("KAFSCALE_ETCD__ENDPOINTS", '["http://etcd:2379"]')
    options = parse_read_options(
        {"subscribe": "a,b", "storage.kind": "local", "storage.local_dir": "/data"},
        streaming=False,
    )
    connection = options.connection
    assert connection.cluster == "prod"
    assert connection.etcd.endpoints == ("http://etcd:2379",)
    assert connection.storage.prefix == "from-env"
    assert connection.storage.kind is StorageKind.LOCAL
    assert str(connection.storage.local_dir) == "/data"
    assert options.subscription.topics == ("a", "b")
    assert (options.starting, options.ending) == (EARLIEST, LATEST)
    explicit = parse_read_options(
        {"subscribe": "a", "cluster": "c", "etcd.endpoints": "http://x:1,http://y:2"},
        streaming=True,
    )
    assert explicit.connection.cluster == "c"
    assert explicit.connection.etcd.endpoints == ("http://x:1", "http://y:2")
    assert explicit.starting == LATEST  # a new stream starts at the end, as Spark's


def test_without_kafscale_variables_the_connection_is_the_broker_settings_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a ``KAFSCALE_*`` variable the source does not build ``BrokerSettings`` (its
    import costs Spark's processes), so its defaults must be those the model would give."""
    for name in [name for name in os.environ if name.upper().startswith("KAFSCALE_")]:
        monkeypatch.delenv(name)
    defaults = BrokerSettings()
    assert configured_connection() == Connection(defaults.cluster, defaults.etcd, defaults.storage)


def test_a_kafscale_variable_in_any_case_is_read_as_the_broker_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("kafscale_cluster", "lower")  # pydantic-settings ignores the case
    assert BrokerSettings().cluster == "lower"
    assert configured_connection().cluster == "lower"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "exactly one of"),
        ({"subscribePattern": "("}, "not a regular expression"),
        ({"assign": '{"a": 0}'}, "list of partitions"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "not allowed"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"x": 1}}'}, "bad partition"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "10"}, "streaming reads only"),
        ({"subscribe": "a", "minOffsetsPerTrigger": "10"}, "streaming reads only"),
        ({"subscribe": "a", "maxTriggerDelay": "1m"}, "streaming reads only"),
        ({"subscribe": "a", "startingTimestamp": "soon"}, "milliseconds"),
        ({"subscribe": "a", "storage.kind": "tape"}, "storage.kind must be s3 or local"),
        ({"subscribe": "a", "startingOffsets": "{oops"}, "startingOffsets is not valid JSON"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_read_options(options, streaming=False)


def test_offsets_resolve_like_sparks_kafka_source() -> None:
    assert resolve_offset(EARLIEST, VIEW, "start") == 10
    assert resolve_offset(LATEST, VIEW, "end") == 100
    spec = {"t": {0: 42}}
    assert resolve_offset(spec, VIEW, "start") == 42
    assert resolve_offset({"t": {0: -2}}, VIEW, "start") == 10
    other = PartitionView("t", "id", 1, 0, 7)
    assert resolve_offset(spec, other, "start") == 0  # unnamed partitions: earliest
    assert resolve_offset(spec, other, "end") == 7  # ... and latest


def test_deleted_offsets_are_data_loss_unless_allowed() -> None:
    assert clamp_start(VIEW, 50, True) == 50
    with pytest.raises(DataLoss, match=r"offsets 3\.\.9 were deleted"):
        clamp_start(VIEW, 3, True)
    assert clamp_start(VIEW, 3, False) == 10
    with pytest.raises(DataLoss, match="beyond the high watermark"):
        clamp_start(VIEW, 150, True)
    assert clamp_start(VIEW, 150, False) == 10


def test_segments_and_splits_cover_the_range_once() -> None:
    segments = [SegmentObject(base, 0, 10) for base in (0, 20, 40, 60, 80)]
    assert [s.base for s in segments_for(segments, 25, 61)] == [20, 40, 60]
    assert segments_for(segments, 30, 30) == ()
    tasks = split_tasks(VIEW, 25, 95, segments, split_bytes=20)
    assert [(t.start, t.end, [s.base for s in t.segments]) for t in tasks] == [
        (25, 60, [20, 40]),
        (60, 95, [60, 80]),
    ]


def test_max_offsets_per_trigger_is_shared_by_backlog() -> None:
    start = {("t", 0): 0, ("t", 1): 0}
    latest = {("t", 0): 300, ("t", 1): 100, ("t", 2): 0}
    limited = rate_limit(start, latest, 100)
    assert limited == {("t", 0): 75, ("t", 1): 25, ("t", 2): 0}
    assert rate_limit(start, latest, 1000) == latest


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"minOffsetsPerTrigger": "0"}, "minOffsetsPerTrigger must be positive"),
        ({"minOffsetsPerTrigger": "200", "maxOffsetsPerTrigger": "100"}, "is higher than"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay must be a time"),
        ({"maxTriggerDelay": "5 weeks"}, "maxTriggerDelay must be a time"),
    ],
)
def test_bad_stream_admission_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(SourceOptionError, match=message):
        parse_read_options({"subscribe": "a", **options}, streaming=True)


def test_trigger_delays_read_like_sparks_time_strings() -> None:
    assert parse_duration_ms("d", "15m") == 900_000
    assert parse_duration_ms("d", "30s") == 30_000
    assert parse_duration_ms("d", "250") == 250  # no unit: milliseconds, as Spark
    assert parse_duration_ms("d", "2 h") == 7_200_000
    options = parse_read_options(
        {"subscribe": "a", "minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "50"},
        streaming=True,
    )
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (50, 900_000)


def test_min_offsets_per_trigger_waits_for_enough_or_for_the_delay() -> None:
    start = {("t", 0): 10, ("t", 1): 10}
    few = {("t", 0): 30, ("t", 1): 20, ("t", 2): 5}  # 20 + 10 + 5 (new partition from 0)
    enough = {("t", 0): 40, ("t", 1): 30, ("t", 2): 5}
    assert delay_batch(start, few, 36, 5_000, 1_000, 60_000)
    assert not delay_batch(start, few, 35, 5_000, 1_000, 60_000)
    assert not delay_batch(start, enough, 36, 5_000, 1_000, 60_000)
    assert not delay_batch(start, few, 36, 61_000, 1_000, 60_000)  # the delay passed
    assert not delay_batch(start, few, 36, 5_000, 0, 5_000)  # a new reader's first batch


def test_checkpoint_offsets_round_trip_in_sparks_kafka_shape() -> None:
    offsets = {("b", 1): 5, ("a", 0): 7, ("b", 0): 3}
    document = to_json_offsets(offsets)
    assert document == {"a": {"0": 7}, "b": {"0": 3, "1": 5}}
    assert from_json_offsets(document) == offsets


def test_etcd_tls_and_auth_options_override_the_environment_and_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFSCALE_ETCD__CA_FILE", "/env/ca.crt")
    monkeypatch.setenv("KAFSCALE_ETCD__USERNAME", "env-user")
    monkeypatch.setenv("KAFSCALE_ETCD__PASSWORD", "env-secret")
    from_env = parse_connection({})
    assert str(from_env.etcd.ca_file) == "/env/ca.crt"
    assert from_env.etcd.username == "env-user"
    assert from_env.etcd.password is not None
    assert from_env.etcd.password.get_secret_value() == "env-secret"
    given = parse_read_options(
        {
            "subscribe": "t",
            "etcd.ca_file": "/job/ca.crt",
            "etcd.cert_file": "/job/client.crt",
            "etcd.key_file": "/job/client.key",
            "etcd.username": "",  # an empty option unsets what the environment set
            "etcd.password": "",
        },
        streaming=False,
    ).connection
    etcd = given.etcd
    assert (str(etcd.ca_file), str(etcd.cert_file), str(etcd.key_file)) == (
        "/job/ca.crt",
        "/job/client.crt",
        "/job/client.key",
    )
    assert etcd.username is None and etcd.password is None
    again = parse_connection(connection_options(from_env))
    assert again.etcd == from_env.etcd
    monkeypatch.delenv("KAFSCALE_ETCD__CA_FILE")
    monkeypatch.delenv("KAFSCALE_ETCD__USERNAME")
    monkeypatch.delenv("KAFSCALE_ETCD__PASSWORD")
    assert parse_connection(connection_options(from_env)).etcd == from_env.etcd


def test_a_process_keeps_one_store_per_settings_secrets_included() -> None:
    """Spark reuses its Python processes across queries: a query with new credentials (after a
    rotation) must get a store that uses them, not the one opened with the old ones."""
    from kafscale.pipeline import fetch

    def s3(secret: str) -> StorageSettings:
        return StorageSettings(
            kind="s3",
            bucket="b",
            endpoint="http://127.0.0.1:1",
            access_key_id=SecretStr("id"),
            secret_access_key=SecretStr(secret),
        )

    assert fetch._store_for(s3("old")) is fetch._store_for(s3("old"))
    assert fetch._store_for(s3("new")) is not fetch._store_for(s3("old"))
