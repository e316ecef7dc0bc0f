"""Incremental fetch sessions (``broker/api/fetch_sessions.py``, KIP-227): which partitions a
request reads, which results its response carries, and the session errors a client recovers
from with a full request."""

from __future__ import annotations

import itertools

import pytest

from kafscale.broker.api.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    FetchContext,
    FetchPosition,
    FetchSessionCache,
    PartitionResult,
    next_epoch,
)
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

A, B, C = ("t", 0), ("t", 1), ("t", 2)


def at(offset: int) -> FetchPosition:
    return FetchPosition(offset, 1 << 20, -1)


def quiet(high_watermark: int = 10) -> PartitionResult:
    return PartitionResult(ErrorCode.NONE, high_watermark, 0, has_records=False)


def with_records(high_watermark: int = 10) -> PartitionResult:
    return PartitionResult(ErrorCode.NONE, high_watermark, 0, has_records=True)


def opened(cache: FetchSessionCache, *keys: tuple[str, int]) -> FetchContext:
    context = cache.context(0, INITIAL_EPOCH, [(k, at(0)) for k in keys], [])
    assert isinstance(context, FetchContext) and context.session_id != 0
    assert context.respond([(k, quiet()) for k in keys]) == [True] * len(keys)  # a full answer
    return context


def incremental(
    cache: FetchSessionCache,
    session: FetchContext,
    requested: list[tuple[tuple[str, int], FetchPosition]] | None = None,
    forgotten: list[tuple[str, int]] | None = None,
) -> FetchContext:
    assert session.session is not None
    context = cache.context(
        session.session_id, session.session.epoch, requested or [], forgotten or []
    )
    assert isinstance(context, FetchContext) and context.incremental
    return context


def test_an_incremental_response_carries_only_what_changed() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A, B, C)
    context = incremental(cache, first)
    assert [k for k, _ in context.partitions([])] == [A, B, C]  # the session's, none sent
    results = [(A, quiet()), (B, with_records()), (C, quiet(11))]
    assert context.respond(results) == [False, True, True]
    # Partitions sent with records go to the back (C's moved high watermark alone does not
    # move it): a response cut short by max_bytes serves the others first next.
    assert [k for k, _ in incremental(cache, first).partitions([])] == [A, C, B]
    context = incremental(cache, first)
    assert context.respond([(A, quiet()), (C, quiet(11)), (B, quiet())]) == [False] * 3


def test_rotation_moves_sent_partitions_behind_the_others() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A, B, C)
    context = incremental(cache, first)
    context.respond([(A, with_records()), (B, quiet()), (C, quiet())])
    assert [k for k, _ in incremental(cache, first).partitions([])] == [B, C, A]


def test_a_partition_sent_without_records_keeps_its_place() -> None:
    """Issue 29: moving every partition sent kept their relative order when the first one's
    records filled the response and the next one's moved high watermark was sent alone; the
    next one then never got records. Only partitions sent with records rotate (as in Kafka)."""
    cache = FetchSessionCache(10)
    first = opened(cache, A, B)
    context = incremental(cache, first)
    context.respond([(A, with_records()), (B, quiet(12))])
    assert [k for k, _ in incremental(cache, first).partitions([])] == [B, A]


def test_errors_are_always_sent_and_the_partition_again_once_they_clear() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A)
    gone = PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1, has_records=False)
    assert incremental(cache, first).respond([(A, gone)]) == [True]
    assert incremental(cache, first).respond([(A, gone)]) == [True]
    assert incremental(cache, first).respond([(A, quiet())]) == [True]
    assert incremental(cache, first).respond([(A, quiet())]) == [False]


def test_requests_update_positions_add_and_forget_partitions() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A, B)
    context = incremental(cache, first, requested=[(A, at(7)), (C, at(3))], forgotten=[B])
    assert context.partitions([]) == [(A, at(7)), (C, at(3))]
    # A partition added to the session is sent the first time, whatever its state.
    assert context.respond([(A, quiet()), (C, quiet())]) == [False, True]


def test_epochs_are_checked_and_sessions_found() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A)
    assert first.session is not None and first.session.epoch == 1
    assert cache.context(first.session_id, 2, [], []) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.context(first.session_id + 1, 1, [], []) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    incremental(cache, first)
    assert first.session.epoch == 2
    assert cache.context(first.session_id, 1, [], []) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert [next_epoch(e) for e in (0, 1, MAX_EPOCH)] == [1, 2, 1]


def test_full_requests_close_the_session_they_name() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A)
    again = cache.context(first.session_id, INITIAL_EPOCH, [(B, at(0))], [])
    assert isinstance(again, FetchContext) and again.session_id != first.session_id
    assert again.partitions([(B, at(0))]) == [(B, at(0))]
    assert cache.context(first.session_id, 1, [], []) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    closing = cache.context(again.session_id, FINAL_EPOCH, [(B, at(0))], [])
    assert isinstance(closing, FetchContext) and closing.session_id == 0
    assert not closing.incremental and len(cache) == 0
    assert closing.respond([(B, quiet())]) == [True]


def test_the_least_recently_used_session_is_evicted() -> None:
    ids = itertools.count(1)
    cache = FetchSessionCache(2, new_id=lambda: next(ids))
    first, second = opened(cache, A), opened(cache, B)
    incremental(cache, first)  # used after the second was opened
    opened(cache, C)
    assert len(cache) == 2
    assert second.session is not None
    assert cache.context(second.session_id, second.session.epoch, [], []) == (
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    )
    incremental(cache, first)


def test_no_slots_means_sessionless_fetches() -> None:
    context = FetchSessionCache(0).context(0, INITIAL_EPOCH, [(A, at(5))], [])
    assert isinstance(context, FetchContext) and context.session_id == 0
    assert context.partitions([(A, at(5))]) == [(A, at(5))]


def test_forgetting_every_partition_ends_the_session() -> None:
    cache = FetchSessionCache(10)
    first = opened(cache, A, B)
    assert first.session is not None
    context = cache.context(first.session_id, first.session.epoch, [], [A, B])
    assert isinstance(context, FetchContext) and context.session_id == 0 and len(cache) == 0


def test_a_request_overtaken_by_a_duplicate_is_told_so() -> None:
    """A request still waiting (long-poll) when the session's next request was taken in must
    not answer as if it were current (Kafka answers INVALID_FETCH_SESSION_EPOCH)."""
    cache = FetchSessionCache(10)
    first = opened(cache, A)
    waiting = incremental(cache, first)
    assert not waiting.overtaken
    incremental(cache, first)
    assert waiting.overtaken
