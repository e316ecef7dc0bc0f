"""Retention (``broker/storage/retention.py``): the new log start offset by time and size, and
which whole segment objects may then be deleted (DESIGN §5); none for compacted-only topics."""

from __future__ import annotations

import asyncio
import functools
import random
from pathlib import Path

import pytest
from harness.stores import CountingStore
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.metadata.topics import validate_configs
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.storage.janitor import (
    list_for_retention,
    segment_facts,
    with_epoch_boundaries,
)
from kafscale.broker.storage.object_store import ObjectInfo
from kafscale.broker.storage.retention import (
    SegmentFacts,
    decide_log_start,
    deletable_bases,
    retention_limits,
)

pytestmark = pytest.mark.unit

NOW = 1_700_000_000_000


@st.composite
def logs(draw: st.DrawFn) -> tuple[list[SegmentFacts], int, int]:
    """Contiguous committed segments (oldest first, creation times non-decreasing), the high
    watermark at the end of the last one, and a log start inside the first one or later."""
    base = draw(st.integers(0, 10_000))
    created = NOW - draw(st.integers(0, 10_000))
    segments = []
    for _ in range(draw(st.integers(0, 12))):
        segments.append(SegmentFacts(base, draw(st.integers(1, 5000)), created))
        base += draw(st.integers(1, 100))
        created += draw(st.integers(0, 1000))
    high_watermark = base
    first = segments[0].base if segments else base
    log_start = draw(st.integers(first, high_watermark))
    return segments, high_watermark, log_start


limits = st.integers(-1, 12_000)


def ends(segments: list[SegmentFacts], high_watermark: int) -> list[int]:
    """Where each segment ends: the next one's base, or the high watermark for the last."""
    return [s.base for s in segments[1:]] + [high_watermark] if segments else []


@given(logs(), limits, limits, st.randoms(use_true_random=False))
def test_new_start_is_a_segment_boundary_between_start_and_high_watermark(
    log: tuple[list[SegmentFacts], int, int],
    retention_ms: int,
    retention_bytes: int,
    rng: random.Random,
) -> None:
    segments, high_watermark, log_start = log
    shuffled = list(segments)
    rng.shuffle(shuffled)  # order of the listing does not matter
    start = decide_log_start(
        shuffled, high_watermark, log_start, NOW, retention_ms, retention_bytes
    )
    assert log_start <= start <= high_watermark
    assert start in {log_start, high_watermark} | {s.base for s in segments}  # whole segments
    assert start == decide_log_start(
        segments, high_watermark, log_start, NOW, retention_ms, retention_bytes
    )


@given(logs(), st.integers(0, 12_000))
def test_time_retention_drops_only_expired_segments_and_all_leading_ones(
    log: tuple[list[SegmentFacts], int, int], retention_ms: int
) -> None:
    segments, high_watermark, log_start = log
    start = decide_log_start(segments, high_watermark, log_start, NOW, retention_ms, -1)
    expired = [s.created_at_ms < NOW - retention_ms for s in segments]
    for end, is_expired in zip(ends(segments, high_watermark), expired, strict=True):
        if end <= start and end > log_start:  # newly dropped
            assert is_expired
    kept = [s for s in segments if s.base >= start]
    if kept and start > log_start:
        assert not expired[segments.index(kept[0])]  # stopped at the first fresh segment
    if all(expired) and segments:
        assert start == high_watermark


@given(logs(), st.integers(0, 12_000))
def test_size_retention_keeps_the_newest_segments_within_the_limit(
    log: tuple[list[SegmentFacts], int, int], retention_bytes: int
) -> None:
    segments, high_watermark, log_start = log
    start = decide_log_start(segments, high_watermark, log_start, NOW, -1, retention_bytes)
    kept = [s for s in segments if s.base >= start]
    if start > log_start:
        assert sum(s.size for s in kept) <= retention_bytes
        dropped_last = max((s for s in segments if s.base < start), key=lambda s: s.base)
        # one segment fewer dropped would exceed the limit: nothing deleted needlessly
        assert sum(s.size for s in kept) + dropped_last.size > retention_bytes


@given(logs())
def test_no_limits_never_move_the_log_start(log: tuple[list[SegmentFacts], int, int]) -> None:
    segments, high_watermark, log_start = log
    assert decide_log_start(segments, high_watermark, log_start, NOW, -1, -1) == log_start


@pytest.mark.parametrize(("retention_ms", "retention_bytes"), [(-1, -1), (0, -1), (-1, 0), (0, 0)])
def test_an_empty_listing_expires_nothing(retention_ms: int, retention_bytes: int) -> None:
    """No listed segment is no evidence that anything expired: the listing may predate the
    first commit (the janitor lists, a flush commits, then the high watermark is read), and
    moving the start to the high watermark would hide freshly acknowledged records."""
    assert decide_log_start([], 500, 100, NOW, retention_ms, retention_bytes) == 100


@given(logs(), st.integers(0, 12_000), st.integers(0, 20_000))
def test_later_clock_never_moves_the_start_back(
    log: tuple[list[SegmentFacts], int, int], retention_ms: int, later_ms: int
) -> None:
    segments, high_watermark, log_start = log
    now = decide_log_start(segments, high_watermark, log_start, NOW, retention_ms, -1)
    later = decide_log_start(segments, high_watermark, log_start, NOW + later_ms, retention_ms, -1)
    assert later >= now


@pytest.mark.parametrize(("retention_ms", "retention_bytes"), [(-1, -1), (60_000, -1), (-1, 10**9)])
def test_a_listing_starting_above_the_log_start_expires_nothing_unexpired(
    retention_ms: int, retention_bytes: int
) -> None:
    """Fails on the old main: nothing expired, yet the start moved to the first listed
    segment. A compacted partition's listing starts at its cleaned range's end when the cleaned
    objects are not in it (a pass committed and its delete ran while the janitor listed), and
    the log start jumped past every cleaned record: consumers from the beginning got
    OFFSET_OUT_OF_RANGE and reset to the end."""
    listed = [SegmentFacts(40, 100, NOW - 1000), SegmentFacts(50, 100, NOW - 500)]
    assert decide_log_start(listed, 60, 0, NOW, retention_ms, retention_bytes) == 0


def test_examples() -> None:
    segments = [SegmentFacts(0, 100, NOW - 5000), SegmentFacts(10, 100, NOW - 3000)]
    segments.append(SegmentFacts(20, 100, NOW - 1000))
    assert decide_log_start(segments, 30, 0, NOW, 4000, -1) == 10
    assert decide_log_start(segments, 30, 0, NOW, 500, -1) == 30
    assert decide_log_start(segments, 30, 0, NOW, -1, 200) == 10
    assert decide_log_start(segments, 30, 0, NOW, -1, 199) == 20
    assert decide_log_start(segments, 30, 15, NOW, 4000, -1) == 15  # never backwards
    assert decide_log_start(segments, 30, 0, NOW, 10_000, 10_000) == 0


# --- deletable_bases --------------------------------------------------------------------------


@given(st.lists(st.integers(0, 1000), max_size=20), st.integers(-1, 1100))
def test_deletable_bases_are_whole_segments_below_the_log_start(
    bases: list[int], log_start: int
) -> None:
    doomed = deletable_bases(bases, log_start)
    ordered = sorted(set(bases))
    assert doomed == sorted(set(doomed))
    assert set(doomed) <= set(ordered)
    if ordered:
        assert ordered[-1] not in doomed  # the newest segment always stays
    for base in ordered:
        successors = [b for b in ordered if b > base]
        wholly_below = bool(successors) and successors[0] <= log_start
        assert (base in doomed) == wholly_below


def test_the_segment_holding_the_log_start_stays() -> None:
    assert deletable_bases([0, 10, 20], 15) == [0]
    assert deletable_bases([20, 0, 10, 10], 20) == [0, 10]
    assert deletable_bases([0, 10, 20], 1000) == [0, 10]
    assert deletable_bases([0, 10, 20], 0) == []
    assert deletable_bases([], 50) == []


LIMITS = {"retention.ms": "1000", "retention.bytes": "5000"}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("delete", (1000, 5000)),
        ("compact,delete", (1000, 5000)),
        ("delete, compact", (1000, 5000)),
        ("compact", (-1, -1)),
    ],
)
def test_retention_applies_only_to_topics_whose_policy_deletes(
    policy: str, expected: tuple[int, int]
) -> None:
    assert retention_limits({**LIMITS, "cleanup.policy": policy}) == expected


@pytest.mark.parametrize("policy", ["delete", "compact", "compact,delete", "delete,compact"])
def test_cleanup_policies_kafka_accepts_are_accepted(policy: str) -> None:
    validate_configs({"cleanup.policy": policy})


@pytest.mark.parametrize(
    "configs",
    [{"segment.bytes": "1023"}, {"segment.bytes": "0"}, {"max.message.bytes": "-1"}],
)
def test_sizes_below_their_least_are_invalid_configs(configs: dict[str, str]) -> None:
    with pytest.raises(KafkaError) as raised:
        validate_configs(configs)
    assert raised.value.code == ErrorCode.INVALID_CONFIG


@pytest.mark.parametrize("policy", ["deleted", "compact,", "compact,none", ",delete"])
def test_other_cleanup_policies_are_invalid_configs(policy: str) -> None:
    with pytest.raises(KafkaError) as raised:
        validate_configs({"cleanup.policy": policy})
    assert raised.value.code == ErrorCode.INVALID_CONFIG


def test_an_empty_cleanup_policy_is_valid_and_trims_nothing() -> None:
    """Kafka takes an empty list (SUBTRACT of the last policy leaves one): neither delete nor
    compact, so retention never trims the log."""
    validate_configs({"cleanup.policy": ""})
    configs = {"cleanup.policy": "", "retention.ms": "1000", "retention.bytes": "10"}
    assert retention_limits(configs) == (-1, -1)


# --- the janitor reads creation times only where time retention looks ------------------------


def _lazy_facts(
    log: tuple[list[SegmentFacts], int, int], expired_before_ms: int | None
) -> tuple[list[SegmentFacts], list[str]]:
    segments, _, _ = log
    listed = [(s.base, ObjectInfo(f"{s.base:020d}-e0.kfs", s.size)) for s in segments]
    created = {f"{s.base:020d}-e0.kfs": s.created_at_ms for s in segments}
    reads: list[str] = []

    async def created_at_ms(key: str) -> int:
        reads.append(key)
        return created[key]

    facts, _ = asyncio.run(segment_facts(listed, expired_before_ms, created_at_ms))
    return facts, reads


@given(logs(), limits, limits)
def test_reading_creation_times_lazily_decides_the_same(
    log: tuple[list[SegmentFacts], int, int], retention_ms: int, retention_bytes: int
) -> None:
    segments, high_watermark, log_start = log
    expired_before = NOW - retention_ms if retention_ms >= 0 else None
    lazy, reads = _lazy_facts(log, expired_before)
    decide = functools.partial(
        decide_log_start,
        high_watermark=high_watermark,
        log_start_offset=log_start,
        now_ms=NOW,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
    )
    assert decide(lazy) == decide(segments)
    expired = sum(
        1 for s in segments if expired_before is not None and s.created_at_ms < expired_before
    )
    assert len(reads) == (0 if expired_before is None else min(len(segments), expired + 1))


def test_a_week_of_retention_reads_one_header_however_many_new_segments() -> None:
    fresh = [SegmentFacts(10 * i, 1000, NOW - 1000 + i) for i in range(300)]
    _, reads = _lazy_facts((fresh, 3000, 0), NOW - 7 * 24 * 3600 * 1000)
    assert reads == [f"{0:020d}-e0.kfs"]
    _, reads = _lazy_facts((fresh, 3000, 0), None)  # retention.ms=-1: only sizes count
    assert reads == []


def test_retention_lists_from_the_oldest_only_as_far_as_it_looks(tmp_path: Path) -> None:
    """Ten segments, five past retention, three keys a page: two pages settle it (the sixth
    segment is inside retention); a full listing reads all ten."""
    store = CountingStore(tmp_path)
    prefix = keys.partition_object_prefix("c", "t", "id", 0)
    created = {}
    for n in range(10):
        key = keys.segment_object_key("c", "t", "id", 0, 10 * n, 0)
        created[key] = NOW - 10_000 + 1000 * n  # n <= 4: older than NOW - 5500
        asyncio.run(store.put(key, b"segment"))
    state = PartitionState(high_watermark=100, leader_epoch=0, epochs=((0, 0),))

    async def created_at_ms(key: str) -> int:
        return created[key]

    objects, facts = asyncio.run(
        list_for_retention(store, prefix, state, NOW - 5500, created_at_ms, page=3)
    )
    assert (len(objects), store.lists) == (6, 2)
    assert decide_log_start(facts, 100, 0, NOW, 5500, -1) == 50


def test_a_fenced_writers_uploads_are_found_from_the_epoch_boundaries(tmp_path: Path) -> None:
    """Writers of epochs 0 and 1 were fenced with uploads in flight (at 50 and 60, at 120):
    one page of keys from each boundary finds them, without listing the whole partition."""
    store = CountingStore(tmp_path)
    prefix = keys.partition_object_prefix("c", "t", "id", 0)
    state = PartitionState(high_watermark=200, leader_epoch=2, epochs=((0, 0), (1, 50), (2, 120)))
    committed = [(b, 0) for b in range(0, 50, 10)] + [(b, 1) for b in range(50, 120, 10)]
    committed += [(b, 2) for b in range(120, 200, 10)]
    orphans = [(50, 0), (60, 0), (120, 1)]
    for base, epoch in committed + orphans:
        asyncio.run(store.put(keys.segment_object_key("c", "t", "id", 0, base, epoch), b"s"))
    first_page = asyncio.run(store.list(prefix, limit=3))
    store.lists = 0
    found = asyncio.run(with_epoch_boundaries(store, prefix, state, first_page, page=3))
    orphan_keys = {keys.segment_object_key("c", "t", "id", 0, b, e) for b, e in orphans}
    assert orphan_keys <= {info.key for info in found}
    assert store.lists == 2  # one page per boundary
    assert len({info.key for info in found}) == len(found)  # no object twice


def test_a_long_run_of_expired_segments_is_trimmed_over_several_checks(tmp_path: Path) -> None:
    """Retention shortened on a long log: each check lists a bounded number of pages, moves the
    log start to the last segment it listed, and the next check goes on from there."""
    store = CountingStore(tmp_path)
    prefix = keys.partition_object_prefix("c", "t", "id", 0)
    created = {}
    for n in range(10):
        key = keys.segment_object_key("c", "t", "id", 0, 10 * n, 0)
        created[key] = NOW - 10_000 + n  # all older than NOW - 5000
        asyncio.run(store.put(key, b"segment"))
    state = PartitionState(high_watermark=100, leader_epoch=0, epochs=((0, 0),))

    async def created_at_ms(key: str) -> int:
        return created[key]

    def check() -> int:
        _, facts = asyncio.run(
            list_for_retention(store, prefix, state, NOW - 5000, created_at_ms, 3, 2)
        )
        return decide_log_start(facts, 100, 0, NOW, 5000, -1)

    assert check() == 50  # two pages of three: the sixth segment is kept, for now
    assert store.lists == 2
    asyncio.run(store.delete_many([k for k in created if int(k.rsplit("/", 1)[1][:20]) < 50]))
    assert check() == 100  # 50-90 in two pages, the last one short: all expired, start at HW
