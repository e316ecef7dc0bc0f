"""A partition's committed state (``broker/metadata/partition_state.py``): its JSON document and
the pure decisions made on it — epoch history, commits, which listed objects are committed
(fencing, DESIGN §3.4-5), OffsetForLeaderEpoch, the log start offset, and the time marks that
let ListOffsets by timestamp skip what is older."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafscale.broker.metadata.partition_state import (
    MAX_PRODUCERS,
    MAX_TIME_MARKS,
    RECENT_SEGMENTS,
    PartitionState,
    ProducerState,
    SegmentRef,
    advance_log_start,
    commit_segment,
    end_offset_for_epoch,
    epoch_range,
    is_committed_segment,
    start_epoch,
    thin_time_marks,
    time_scan_start,
)

pytestmark = pytest.mark.unit

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
i64 = st.integers(0, 2**62)

segments = st.builds(
    SegmentRef,
    base=i64,
    last=i64,
    epoch=st.integers(0, 2**31 - 1),
    size=st.integers(0, 2**40),
    max_timestamp=st.integers(-1, 2**42),
)
producer_states = st.builds(
    ProducerState,
    epoch=st.integers(0, 2**15 - 1),
    first_seq=st.integers(0, 2**31 - 1),
    last_seq=st.integers(0, 2**32),
    offset=i64,
)
states = st.builds(
    PartitionState,
    high_watermark=i64,
    log_start_offset=i64,
    leader_epoch=st.integers(-1, 2**31 - 1),
    epochs=st.lists(st.tuples(st.integers(0, 2**31 - 1), i64), max_size=10).map(tuple),
    segments=st.lists(segments, max_size=5).map(tuple),
    producers=st.dictionaries(
        st.integers(0, 2**62),
        st.lists(producer_states, min_size=1, max_size=5).map(tuple),
        max_size=5,
    ),
    max_timestamp=st.none() | st.integers(-1, 2**42),
    time_marks=st.lists(st.tuples(i64, st.integers(-1, 2**42)), max_size=5).map(tuple),
)


def segment(base: int, count: int, epoch: int) -> SegmentRef:
    return SegmentRef(base=base, last=base + count - 1, epoch=epoch, size=100, max_timestamp=0)


def commit(state: PartitionState, count: int) -> PartitionState:
    return commit_segment(state, segment(state.high_watermark, count, state.leader_epoch), {})


# --- JSON -------------------------------------------------------------------------------------


@FAST
@given(states)
def test_json_round_trip(state: PartitionState) -> None:
    assert PartitionState.from_json(state.to_json()) == state


def test_json_of_a_minimal_document_takes_defaults() -> None:
    state = PartitionState.from_json(b'{"high_watermark": 12}')
    assert state == PartitionState(high_watermark=12, max_timestamp=None)
    assert state.leader_epoch == -1
    assert state.epochs == () and state.segments == () and state.producers == {}
    # written before time marks existed: the largest timestamp below 12 is unknown
    assert state.max_timestamp is None and state.time_marks == ()


def test_json_document_shape() -> None:
    state = PartitionState(
        high_watermark=120,
        leader_epoch=3,
        epochs=((0, 0), (3, 100)),
        segments=(SegmentRef(100, 119, 3, 2048, 1_700_000_000_000),),
        producers={4001: (ProducerState(0, 10, 19, 110),)},
    )
    document = state.to_json()
    assert b'"epochs":[[0,0],[3,100]]' in document
    assert b'"recent_segments":[[100,119,3,2048,1700000000000]]' in document
    assert b'"segments":[{' not in document
    assert (
        b'"producers":{"4001":[{"epoch":0,"first_seq":10,"last_seq":19,"offset":110}]}' in document
    )


def test_documents_with_segments_as_objects_still_load() -> None:
    old = (
        b'{"high_watermark":120,"segments":[{"base":100,"last":119,"epoch":3,"size":2048,'
        b'"max_timestamp":1700000000000}]}'
    )
    loaded = PartitionState.from_json(old)
    assert loaded.segments == (SegmentRef(100, 119, 3, 2048, 1_700_000_000_000),)
    assert PartitionState.from_json(loaded.to_json()) == loaded


def test_a_full_state_document_stays_small() -> None:
    """Rewritten on every commit: 32 recent segments at realistic magnitudes stay under 2 KB."""
    state = PartitionState(high_watermark=10**9, leader_epoch=12, epochs=((12, 10**8),))
    for n in range(RECENT_SEGMENTS + 3):
        base = 10**9 + 3000 * n
        segment = SegmentRef(base, base + 2999, 12, 3_145_728, 1_763_900_000_000 + n)
        state = commit_segment(state, segment, {})
    assert len(state.to_json()) < 2200, len(state.to_json())


def test_a_log_append_time_is_kept_for_retries_and_only_where_there_is_one() -> None:
    stamped = ProducerState(0, 10, 19, 110, append_time=1_700_000_000_123)
    state = PartitionState(high_watermark=120, producers={4001: (stamped,), 4002: (stamped,)})
    state = replace(state, producers={**state.producers, 4002: (ProducerState(0, 0, 0, 119),)})
    document = state.to_json()
    assert document.count(b'"append_time":1700000000123') == 1  # CreateTime batches: no key
    assert PartitionState.from_json(document) == state


def test_documents_with_one_batch_per_producer_still_load() -> None:
    old = (
        b'{"high_watermark":5,"producers":{"7":{"epoch":1,"first_seq":0,"last_seq":4,"offset":0}}}'
    )
    assert PartitionState.from_json(old).producers == {7: (ProducerState(1, 0, 4, 0),)}


# --- start_epoch ------------------------------------------------------------------------------


def test_first_owner_starts_epoch_zero_at_offset_zero() -> None:
    state = start_epoch(PartitionState())
    assert state.leader_epoch == 0
    assert state.epochs == ((0, 0),)


def test_new_epoch_starts_at_the_high_watermark() -> None:
    state = commit(start_epoch(PartitionState()), 10)
    state = start_epoch(state)
    assert state.leader_epoch == 1
    assert state.epochs == ((0, 0), (1, 10))


def test_an_epoch_that_committed_nothing_is_dropped_from_history() -> None:
    state = commit(start_epoch(PartitionState()), 10)
    state = start_epoch(start_epoch(start_epoch(state)))  # epochs 1 and 2 wrote nothing
    assert state.leader_epoch == 3
    assert state.epochs == ((0, 0), (3, 10))


@FAST
@given(st.lists(st.integers(0, 3), max_size=100))
def test_epoch_history_is_ordered_and_bounded(commits_per_epoch: list[int]) -> None:
    state = PartitionState()
    for count in commits_per_epoch:
        state = start_epoch(state)
        for _ in range(count):
            state = commit(state, 5)
    epochs = [e for e, _ in state.epochs]
    starts = [s for _, s in state.epochs]
    assert epochs == sorted(set(epochs))
    assert starts == sorted(starts)
    if commits_per_epoch:
        assert state.leader_epoch == len(commits_per_epoch) - 1
        assert state.epochs[-1] == (state.leader_epoch, state.high_watermark - 5 * count)


def test_epoch_history_stays_bounded_when_old_data_is_gone() -> None:
    """The etcd document must not grow with every handoff: epochs wholly below the log start
    (nothing of them is served any more) may be forgotten."""
    state = PartitionState()
    for _ in range(200):
        state = commit(start_epoch(state), 5)
        state = advance_log_start(state, state.high_watermark)
    assert len(state.epochs) <= 64
    assert state.epochs[-1] == (199, 5 * 199)


# --- commit_segment ---------------------------------------------------------------------------


def test_commit_must_continue_at_the_high_watermark() -> None:
    state = commit(start_epoch(PartitionState()), 10)
    with pytest.raises(ValueError):
        commit_segment(state, segment(11, 3, 0), {})
    with pytest.raises(ValueError):
        commit_segment(state, segment(5, 3, 0), {})


def test_commit_advances_the_high_watermark_and_keeps_recent_segments() -> None:
    state = start_epoch(PartitionState())
    for _ in range(RECENT_SEGMENTS + 5):
        state = commit(state, 3)
    assert state.high_watermark == 3 * (RECENT_SEGMENTS + 5)
    assert len(state.segments) == RECENT_SEGMENTS
    assert state.segments[-1].last == state.high_watermark - 1
    assert [s.base for s in state.segments] == sorted(s.base for s in state.segments)


def test_commit_merges_producers_and_keeps_the_newest() -> None:
    state = start_epoch(PartitionState())
    first = ProducerState(0, 0, 0, 0)
    state = commit_segment(state, segment(0, 1, 0), {1: (first,)})
    second = ProducerState(0, 1, 1, 1)
    other = ProducerState(0, 0, 0, 1)
    state = commit_segment(state, segment(1, 1, 0), {1: (first, second), 2: (other,)})
    assert state.producers == {1: (first, second), 2: (other,)}
    many = {pid: (ProducerState(0, 0, 0, pid),) for pid in range(10, 10 + MAX_PRODUCERS + 20)}
    state = commit_segment(state, segment(2, 1, 0), many)
    assert len(state.producers) == MAX_PRODUCERS
    assert min(p[-1].offset for p in state.producers.values()) == 10 + 20


# --- committed objects and fencing ------------------------------------------------------------


@dataclass
class History:
    """A simulated partition: owners come and go, commit segments, and fenced owners leave
    orphan uploads (at or after the offset the next epoch starts at) behind."""

    state: PartitionState = field(default_factory=PartitionState)
    committed: list[tuple[int, int]] = field(default_factory=list)  # (base, epoch)
    orphans: list[tuple[int, int]] = field(default_factory=list)


@st.composite
def histories(
    draw: st.DrawFn, min_epochs: int = 0, max_epochs: int = 60, min_commits: int = 0
) -> History:
    history = History()
    for _ in range(draw(st.integers(min_epochs, max_epochs))):
        if history.state.leader_epoch >= 0 and draw(st.booleans()):
            # The current owner is fenced with uploads in flight that never get committed.
            for extra in draw(st.lists(st.integers(0, 20), min_size=1, max_size=3)):
                history.orphans.append(
                    (history.state.high_watermark + extra, history.state.leader_epoch)
                )
        history.state = start_epoch(history.state)
        for count in draw(st.lists(st.integers(1, 10), min_size=min_commits, max_size=3)):
            history.committed.append((history.state.high_watermark, history.state.leader_epoch))
            history.state = commit(history.state, count)
    return history


def check_fencing(history: History) -> None:
    state = history.state
    for base, epoch in history.committed:
        assert is_committed_segment(state, base, epoch), (base, epoch)
    for base, epoch in history.orphans:
        assert not is_committed_segment(state, base, epoch), (base, epoch, state.epochs)


@FAST
@given(histories())
def test_committed_segments_are_committed_and_orphans_never(history: History) -> None:
    check_fencing(history)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # long histories shrink slowly
)
@given(histories(min_epochs=66, max_epochs=90, min_commits=1))
def test_orphans_stay_uncommitted_after_the_epoch_history_is_trimmed(history: History) -> None:
    """Long-lived partitions see more than 64 owners. Trimming the epoch history must not turn
    an old epoch's orphan upload into committed data (it would shadow the segment another
    epoch committed at the same offsets)."""
    check_fencing(history)


def test_orphan_after_trimmed_history_example() -> None:
    history = History()
    history.state = commit(start_epoch(history.state), 10)  # epoch 0 commits 0..9
    history.committed.append((0, 0))
    history.orphans.append((10, 0))  # epoch 0 is fenced while uploading 10..
    for _ in range(70):  # 70 later owners, each committing something
        history.state = start_epoch(history.state)
        history.committed.append((history.state.high_watermark, history.state.leader_epoch))
        history.state = commit(history.state, 10)
    check_fencing(history)


def test_orphan_of_an_epoch_that_committed_nothing() -> None:
    state = commit(start_epoch(PartitionState()), 10)  # epoch 0: 0..9
    state = start_epoch(state)  # epoch 1 uploads at 10, is fenced, commits nothing
    state = commit(start_epoch(state), 5)  # epoch 2: 10..14
    assert state.epochs == ((0, 0), (2, 10))
    assert not is_committed_segment(state, 10, 1)
    assert is_committed_segment(state, 10, 2)
    assert is_committed_segment(state, 0, 0)
    assert not is_committed_segment(state, 10, 0)  # epoch 0's late upload at the next start


def test_nothing_at_or_above_the_high_watermark_is_committed() -> None:
    state = commit(start_epoch(PartitionState()), 10)
    assert not is_committed_segment(state, 10, 0)
    assert not is_committed_segment(state, 11, 0)
    assert epoch_range(state, 0) == (0, 10)
    assert epoch_range(state, 5) == (0, 0)


# --- OffsetForLeaderEpoch ---------------------------------------------------------------------


def test_end_offset_for_epoch_examples() -> None:
    state = PartitionState(high_watermark=120, leader_epoch=5, epochs=((0, 0), (2, 57), (5, 100)))
    assert end_offset_for_epoch(state, 0) == (0, 57)
    assert end_offset_for_epoch(state, 1) == (0, 57)  # epoch 1 never wrote: its predecessor
    assert end_offset_for_epoch(state, 2) == (2, 100)
    assert end_offset_for_epoch(state, 4) == (2, 100)
    assert end_offset_for_epoch(state, 5) == (5, 120)  # current epoch: ends at the HW
    assert end_offset_for_epoch(state, -1) == (-1, -1)
    assert end_offset_for_epoch(PartitionState(), 3) == (-1, -1)


@FAST
@given(histories(max_epochs=30), st.integers(-1, 40))
def test_end_offset_is_the_end_of_the_largest_epoch_not_above_the_request(
    history: History, requested: int
) -> None:
    state = history.state
    epoch, end = end_offset_for_epoch(state, requested)
    known = [e for e, _ in state.epochs if e <= requested]
    if not known:
        assert (epoch, end) == (-1, -1)
        return
    assert epoch == max(known)
    later = [start for e, start in state.epochs if e > epoch]
    assert end == (min(later) if later else state.high_watermark)
    # Every committed offset at or past ``end`` was written by a later epoch.
    for base, writer in history.committed:
        if base >= end:
            assert writer > requested


# --- log start --------------------------------------------------------------------------------


@FAST
@given(states, st.integers(-(2**63), 2**63))
def test_advance_log_start_stays_between_current_start_and_high_watermark(
    state: PartitionState, offset: int
) -> None:
    state = replace(state, log_start_offset=min(state.log_start_offset, state.high_watermark))
    moved = advance_log_start(state, offset)
    assert state.log_start_offset <= moved.log_start_offset <= state.high_watermark
    if state.log_start_offset <= offset <= state.high_watermark:
        assert moved.log_start_offset == offset
    assert replace(moved, log_start_offset=state.log_start_offset) == state


def test_log_start_never_moves_back() -> None:
    state = PartitionState(high_watermark=100, log_start_offset=40)
    assert advance_log_start(state, 10).log_start_offset == 40
    assert advance_log_start(state, 1000).log_start_offset == 100
    assert advance_log_start(state, 60).log_start_offset == 60


# --- time marks (ListOffsets by timestamp) ----------------------------------------------------


def commit_timestamps(state: PartitionState, timestamps: list[int]) -> PartitionState:
    """Commit one segment holding records with these timestamps."""
    base = state.high_watermark
    ref = SegmentRef(base, base + len(timestamps) - 1, 0, 100, max(timestamps))
    return commit_segment(state, ref, {})


@FAST
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(-1, 10_000), min_size=1, max_size=4),  # one segment's records
            st.integers(0, 3),  # records to delete from the log start after it
        ),
        min_size=1,
        max_size=60,
    ),
    st.integers(-1, 10_001),
)
def test_everything_below_the_scan_start_is_older_than_the_target(
    rounds: list[tuple[list[int], int]], target: int
) -> None:
    """The start a look-up by time gets skips only records older than its target, whatever the
    order of timestamps, deletions from the log start and thinning; marks stay bounded."""
    state = PartitionState()
    timestamps: list[int] = []
    for records, deleted in rounds:
        state = commit_timestamps(state, records)
        timestamps += records
        state = advance_log_start(state, state.log_start_offset + deleted)
        assert len(state.time_marks) <= MAX_TIME_MARKS
        assert state.max_timestamp == max(timestamps)
    start = time_scan_start(state, target)
    assert state.log_start_offset <= start <= state.high_watermark
    assert all(t < target for t in timestamps[state.log_start_offset : start])


def test_a_look_up_near_the_head_starts_near_its_answer() -> None:
    """1000 one-record segments with growing timestamps: sixteen marks, dense at the head."""
    state = PartitionState()
    for offset in range(1000):
        state = commit_timestamps(state, [1_000 + offset])
    assert len(state.time_marks) == MAX_TIME_MARKS
    assert 990 <= time_scan_start(state, 1_000 + 995) <= 995
    assert time_scan_start(state, 1_000 + 500) <= 500  # far back: further, but never past it
    assert time_scan_start(state, 0) == 0


def test_a_state_of_unknown_maximum_gets_no_marks() -> None:
    legacy = PartitionState.from_json(b'{"high_watermark": 5}')
    state = commit_timestamps(legacy, [7, 8])
    assert state.max_timestamp is None and state.time_marks == ()
    assert time_scan_start(state, 100) == 0
    assert PartitionState.from_json(state.to_json()).max_timestamp is None


def test_an_unknown_maximum_is_forgotten_once_nothing_below_is_readable() -> None:
    legacy = PartitionState.from_json(b'{"high_watermark": 5}')
    emptied = advance_log_start(legacy, 5)  # retention took everything written before
    state = commit_timestamps(commit_timestamps(emptied, [7, 8]), [9])
    assert state.max_timestamp == 9
    assert state.time_marks == ((7, 8),)
    assert time_scan_start(state, 9) == 7


def test_marks_survive_the_json_document() -> None:
    state = commit_timestamps(commit_timestamps(PartitionState(), [5, 3]), [9])
    assert state.time_marks == ((2, 5),)
    assert state.max_timestamp == 9
    assert b'"max_timestamp":9,"time_marks":[[2,5]]' in state.to_json()
    assert PartitionState.from_json(state.to_json()) == state


def test_thinning_keeps_the_newest_and_drops_marks_below_the_log_start() -> None:
    marks = tuple((offset, offset) for offset in range(1, 41))
    thinned = thin_time_marks(marks, log_start=10, head=41, limit=8)
    assert len(thinned) == 8
    assert thinned[-1] == (40, 40) and all(offset > 10 for offset, _ in thinned)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(thinned)]
    assert gaps[-1] <= gaps[0]  # denser near the head
