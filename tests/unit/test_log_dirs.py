"""DescribeLogDirs' parts: the log dir's name and volume, a partition's size from its state's
recent segments (listing only when they do not reach back far enough), the request's partition
filter, and the proxy's joining of the brokers' answers; AlterReplicaLogDirs' decision and the
proxy's split of it by owner."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.api.log_dirs import (
    alter_replica_log_dirs_body,
    alter_replica_log_dirs_error_body,
    alter_result,
    log_dir_topics,
    wanted_partitions,
)
from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState, SegmentRef, commit_segment
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.log_dirs import merge_log_dirs, merge_moves, orphan_codes, split_moves
from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.log_sizes import (
    LogSizes,
    catch_up_from_state,
    log_dir_name,
    volume_bytes,
)
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.size_blocks import SizeBlocks

pytestmark = pytest.mark.unit

RECORDS_PER_SEGMENT = 10


def state_of(segments: int, epoch: int = 0) -> PartitionState:
    """A partition of ``segments`` committed segments of ten records, sizes 100, 101, ..."""
    state = PartitionState(leader_epoch=epoch, epochs=((epoch, 0),))
    for i in range(segments):
        base = i * RECORDS_PER_SEGMENT
        ref = SegmentRef(base, base + RECORDS_PER_SEGMENT - 1, epoch, 100 + i, 0)
        state = commit_segment(state, ref, {})
    return state


def test_the_log_dir_is_named_after_the_store(tmp_path: Path) -> None:
    s3 = StorageSettings(kind=StorageKind.S3, bucket="b", prefix="/team/x/")
    assert log_dir_name(s3) == "s3://b/team/x"
    assert log_dir_name(replace_settings(s3, prefix="")) == "s3://b"
    local = StorageSettings(kind=StorageKind.LOCAL, local_dir=tmp_path / "d", prefix="p")
    assert log_dir_name(local) == str((tmp_path / "d" / "p").resolve())
    assert volume_bytes(s3) == (-1, -1)
    assert volume_bytes(local) == (-1, -1)  # not there (yet): unknown, not an error
    (tmp_path / "d" / "p").mkdir(parents=True)
    total, usable = volume_bytes(local)
    assert total >= usable > 0


def replace_settings(settings: StorageSettings, **changes: Any) -> StorageSettings:
    return settings.model_copy(update=changes)


def test_recent_segments_bring_a_ledger_up_to_date_without_listing() -> None:
    state = state_of(5)
    blocks = SizeBlocks("p/", 0)
    assert catch_up_from_state(blocks, state)
    assert blocks.total == sum(range(100, 105)) and blocks.listed_below == 50
    grown = state_of(7)
    assert catch_up_from_state(blocks, grown)
    assert blocks.total == sum(range(100, 107))
    assert catch_up_from_state(blocks, grown)  # nothing new: nothing added twice
    assert blocks.total == sum(range(100, 107))


def test_a_listing_is_needed_only_when_recent_segments_do_not_reach_back() -> None:
    long_log = state_of(40)  # the state keeps the newest 32
    assert long_log.segments[0].base == 80
    assert not catch_up_from_state(SizeBlocks("p/", 0), long_log)
    # unless what they miss lies below the log start (deleted, not counted)
    trimmed = replace(long_log, log_start_offset=85)
    blocks = SizeBlocks("p/", 0)
    assert catch_up_from_state(blocks, trimmed)
    assert blocks.trim(trimmed.log_start_offset) is None
    assert blocks.total == sum(100 + i for i in range(8, 40))
    # a count certain up to offset 300 needs only what the recent segments hold
    known = SizeBlocks("p/", 0, listed_below=300)
    assert catch_up_from_state(known, long_log)
    # an empty partition has nothing to count
    assert catch_up_from_state(SizeBlocks("p/", 0), PartitionState())


def test_sizes_list_once_then_follow_the_state(tmp_path: Path) -> None:
    """A partition longer than the recent segments is listed once (its older segments' sizes)
    and from then on followed from the state alone."""

    async def run() -> None:
        store = CountingStore(tmp_path)
        state = state_of(40)
        for i in range(40):
            key = keys.segment_object_key("c", "t", "id", 0, i * RECORDS_PER_SEGMENT, 0)
            await store.put(key, b"x" * (100 + i))
        owned = OwnedPartition("t", 0, "id", state, state_revision=1, lease_revision=1)
        sizes = LogSizes("c", store)
        assert await sizes.size_of(owned) == sum(range(100, 140))
        assert store.listings == 1
        longer = state
        for i in range(40, 45):  # committed since: in the state's recent segments
            base = i * RECORDS_PER_SEGMENT
            longer = commit_segment(longer, SegmentRef(base, base + 9, 0, 100 + i, 0), {})
        owned.state = longer
        assert await sizes.size_of(owned) == sum(range(100, 145))
        owned.state = replace(longer, log_start_offset=205)  # DeleteRecords / retention
        assert await sizes.size_of(owned) == sum(range(120, 145))  # from the segment at 200
        assert store.listings == 1
        sizes.keep_only([])  # a new ledger (ownership moved away and back)...
        assert await sizes.size_of(owned) == sum(range(120, 145))
        assert store.listings == 1  # ...whose kept segments are all recent ones: no listing

    asyncio.run(run())


def test_a_long_partition_is_listed_in_pages_and_its_front_again_when_trimmed_into(
    tmp_path: Path,
) -> None:
    """Blocks of eight segments: only the first and last keep per-segment sizes; when the log
    start moves into a block that gave its sizes up, that block alone is listed again."""

    async def run() -> None:
        store = CountingStore(tmp_path)
        state = state_of(40)
        for i in range(40):
            key = keys.segment_object_key("c", "t", "id", 0, i * RECORDS_PER_SEGMENT, 0)
            await store.put(key, b"x" * (100 + i))
        owned = OwnedPartition("t", 0, "id", state, state_revision=1, lease_revision=1)
        sizes = LogSizes("c", store, block_segments=8)
        assert await sizes.size_of(owned) == sum(range(100, 140))
        assert store.listings == 1
        owned.state = replace(state, log_start_offset=205)  # into the third block (160-239)
        assert await sizes.size_of(owned) == sum(range(120, 140))
        assert store.listings == 2
        owned.state = replace(state, log_start_offset=215)  # the same block: exact now
        assert await sizes.size_of(owned) == sum(range(121, 140))
        assert store.listings == 2

    asyncio.run(run())


class CountingStore(LocalDirObjectStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.listings = 0

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.listings += 1
        return await super().list(prefix, start_after=start_after, limit=limit)


def test_the_request_picks_owned_partitions_and_the_answer_groups_them_by_topic() -> None:
    owned = [("b", 1), ("a", 0), ("b", 0)]
    assert wanted_partitions(owned, None) == [("a", 0), ("b", 0), ("b", 1)]
    assert wanted_partitions(owned, {"b": {1, 7}, "gone": {0}}) == [("b", 1)]
    assert wanted_partitions(owned, {}) == []
    topics = log_dir_topics({("b", 1): 5, ("a", 0): 0, ("b", 0): 3})
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in topics] == [
        ("a", [0]),
        ("b", [0, 1]),
    ]


def _answer(error: int, *dirs: tuple[str, dict[tuple[str, int], int]]) -> Any:
    results = [
        SimpleNamespace(
            log_dir=name,
            error_code=0,
            total_bytes=-1,
            usable_bytes=-1,
            topics=[
                SimpleNamespace(
                    name=topic,
                    partitions=[
                        SimpleNamespace(
                            partition_index=p,
                            partition_size=size,
                            offset_lag=0,
                            is_future_key=False,
                        )
                    ],
                )
                for (topic, p), size in parts.items()
            ],
        )
        for name, parts in dirs
    ]
    return SimpleNamespace(error_code=error, results=results)


def test_the_proxy_joins_the_brokers_dirs_by_name() -> None:
    one = _answer(0, ("s3://b", {("t", 0): 10, ("t", 2): 30}))
    two = _answer(0, ("s3://b", {("t", 1): 20, ("t", 2): 99}))  # t-2 moved between answers
    merged = merge_log_dirs([one, two])
    assert merged["error_code"] == ErrorCode.NONE
    (result,) = merged["results"]
    assert result["log_dir"] == "s3://b"
    sizes = {
        (t["name"], p["partition_index"]): p["partition_size"]
        for t in result["topics"]
        for p in t["partitions"]
    }
    assert sizes == {("t", 0): 10, ("t", 1): 20, ("t", 2): 30}
    denied = _answer(int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
    assert merge_log_dirs([denied, denied])["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert merge_log_dirs([denied, one])["error_code"] == ErrorCode.NONE


# --- AlterReplicaLogDirs ------------------------------------------------------------------------

ALTER_REPLICA_LOG_DIRS = 34
DIR = "s3://bucket"


def alter_request(dirs: dict[str, dict[str, list[int]]], version: int = 2) -> Any:
    """A real (kio) AlterReplicaLogDirs request: per path, topics and their partitions."""
    body = {
        "dirs": [
            {
                "path": path,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
            }
            for path, topics in dirs.items()
        ]
    }
    return codec.build_entity(codec.request_schema(ALTER_REPLICA_LOG_DIRS, version), body)


def codes_of(body: dict[str, Any]) -> dict[tuple[str, int], ErrorCode]:
    return {
        (t["topic_name"], p["partition_index"]): p["error_code"]
        for t in body["results"]
        for p in t["partitions"]
    }


def test_a_replica_moves_only_to_the_dir_it_is_in_and_only_if_hosted() -> None:
    """Kafka's order: the dir first (LOG_DIR_NOT_FOUND even for an unknown topic), then the
    partition's existence, then whether this broker hosts it."""
    counts = {"t": 2}
    assert alter_result(DIR, DIR, counts, ("t", 1), hosted=True) is ErrorCode.NONE
    assert alter_result(DIR, DIR, counts, ("t", 1), hosted=False) is (
        ErrorCode.REPLICA_NOT_AVAILABLE
    )
    assert alter_result(DIR, DIR, counts, ("t", 2), hosted=False) is (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert alter_result(DIR, DIR, counts, ("u", 0), hosted=True) is (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    for other in ("/var/lib/kafka", DIR + "/", "s3://other", ""):
        assert alter_result(other, DIR, counts, ("u", 0), hosted=False) is (
            ErrorCode.LOG_DIR_NOT_FOUND
        )


@pytest.mark.parametrize("version", [1, 2])
def test_the_answer_names_every_partition_once_grouped_by_topic(version: int) -> None:
    request = alter_request({DIR: {"t": [0, 1], "u": [0]}, "/elsewhere": {"t": [2]}}, version)
    body = alter_replica_log_dirs_body(request, DIR, {"t": 3, "u": 1}, lambda tp: tp != ("t", 1))
    assert codes_of(body) == {
        ("t", 0): ErrorCode.NONE,
        ("t", 1): ErrorCode.REPLICA_NOT_AVAILABLE,
        ("t", 2): ErrorCode.LOG_DIR_NOT_FOUND,
        ("u", 0): ErrorCode.NONE,
    }
    assert [t["topic_name"] for t in body["results"]] == ["t", "u"]
    codec.encode_response(ALTER_REPLICA_LOG_DIRS, version, 7, body)  # a valid response


def test_a_partition_named_under_two_dirs_goes_to_the_last_as_in_kafka() -> None:
    request = alter_request({DIR: {"t": [0]}, "/elsewhere": {"t": [0]}})
    assert codes_of(alter_replica_log_dirs_body(request, DIR, {"t": 1}, lambda _tp: True)) == {
        ("t", 0): ErrorCode.LOG_DIR_NOT_FOUND
    }


def test_refused_authorization_names_every_partition() -> None:
    request = alter_request({DIR: {"t": [0, 1]}, "/x": {"u": [3]}})
    body = alter_replica_log_dirs_error_body(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    assert set(codes_of(body).values()) == {ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
    assert sorted(codes_of(body)) == [("t", 0), ("t", 1), ("u", 3)]


def test_the_proxy_sends_each_partition_to_its_owner_and_joins_the_answers() -> None:
    request = alter_request({DIR: {"t": [0, 1, 2]}, "/x": {"t": [3], "u": [0]}})
    owners = {("t", 0): 1, ("t", 1): 2, ("t", 2): -1, ("t", 3): 1, ("u", 0): 2}
    parts, orphans = split_moves(request, owners.__getitem__)
    assert orphans == [("t", 2)]

    def named(body: Any) -> list[tuple[str, str, list[int]]]:
        return [
            (d.path, t.name, [int(p) for p in t.partitions]) for d in body.dirs for t in d.topics
        ]

    assert named(parts[1]) == [(DIR, "t", [0]), ("/x", "t", [3])]
    assert named(parts[2]) == [(DIR, "t", [1]), ("/x", "u", [0])]
    for cut in parts.values():  # each cut is a request the owner can read
        codec.encode_request(ALTER_REPLICA_LOG_DIRS, 2, 1, cut)
    answers = [
        codec.build_entity(
            codec.response_schema(ALTER_REPLICA_LOG_DIRS, 2),
            alter_replica_log_dirs_body(cut, DIR, {"t": 4, "u": 1}, lambda _tp: True),
        )
        for cut in parts.values()
    ]
    merged = merge_moves(request, answers, orphan_codes(request, orphans, {DIR}, {"t": 4}))
    assert codes_of(merged) == {
        ("t", 0): ErrorCode.NONE,
        ("t", 1): ErrorCode.NONE,
        ("t", 2): ErrorCode.REPLICA_NOT_AVAILABLE,
        ("t", 3): ErrorCode.LOG_DIR_NOT_FOUND,
        ("u", 0): ErrorCode.LOG_DIR_NOT_FOUND,
    }


def test_a_partition_no_broker_is_alive_for_gets_what_a_broker_answers() -> None:
    """Kafka's order, as a broker that does not host the partition answers: the dir first,
    then the topic, then REPLICA_NOT_AVAILABLE."""
    request = alter_request(
        {DIR: {"t": [0, 9], "gone": [0]}, "/elsewhere": {"t": [1], "gone": [1]}}
    )
    orphans = [("t", 0), ("t", 9), ("gone", 0), ("t", 1), ("gone", 1)]
    assert orphan_codes(request, orphans, {DIR}, {"t": 4}) == {
        ("t", 0): ErrorCode.REPLICA_NOT_AVAILABLE,
        ("t", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("gone", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("t", 1): ErrorCode.LOG_DIR_NOT_FOUND,
        ("gone", 1): ErrorCode.LOG_DIR_NOT_FOUND,
    }
    # No broker ever seen: no dir name to check the path against; the topic still is.
    assert (
        orphan_codes(request, orphans, set(), {"t": 4})[("t", 1)] is ErrorCode.REPLICA_NOT_AVAILABLE
    )
    assert orphan_codes(request, orphans, set(), {"t": 4})[("gone", 1)] is (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )
    merged = merge_moves(request, [], orphan_codes(request, orphans, {DIR}, {"t": 4}))
    assert codes_of(merged)[("t", 1)] is ErrorCode.LOG_DIR_NOT_FOUND
