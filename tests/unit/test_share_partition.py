"""The share-partition state machine (KIP-932): acquire, acknowledge, release, expire, archive,
and the share-partition start offset (SPSO); its durable form; share sessions."""

from __future__ import annotations

from harness.batches import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.share.batches import batch_ends, covered_last, overlapping, skipped
from kafscale.broker.share.partition import (
    AckType,
    Acquired,
    Limits,
    RecordState,
    SharePartition,
    ordered_batches,
)
from kafscale.broker.share.sessions import ShareSessions

LIMITS = Limits(lock_ms=1000, delivery_count_limit=3, max_records_in_flight=10)
ACCEPT, RELEASE, REJECT, GAP = AckType.ACCEPT, AckType.RELEASE, AckType.REJECT, AckType.GAP


def test_acquire_hands_records_out_once_and_accept_moves_the_start() -> None:
    sp = SharePartition(5)
    assert sp.first_available(readable_end=10, limits=LIMITS) == 5
    assert sp.acquire("a", 5, 9, 3, 0, LIMITS) == [Acquired(5, 7, 1)]
    assert sp.acquire("b", 5, 9, 10, 0, LIMITS) == [Acquired(8, 9, 1)]
    assert sp.first_available(readable_end=10, limits=LIMITS) is None
    assert sp.acknowledge("b", 8, 9, [ACCEPT], 0, LIMITS) is ErrorCode.NONE
    assert sp.start_offset == 5  # 5..7 still acquired by a
    assert sp.acknowledge("a", 5, 7, [ACCEPT], 0, LIMITS) is ErrorCode.NONE
    assert (sp.start_offset, sp.next_offset, sp.records) == (10, 10, {})


def test_release_redelivers_with_a_higher_count_until_the_limit_archives() -> None:
    sp = SharePartition(0)
    for count in (1, 2, 3):
        assert sp.acquire("a", 0, 0, 1, 0, LIMITS) == [Acquired(0, 0, count)]
        assert sp.acknowledge("a", 0, 0, [RELEASE], 0, LIMITS) is ErrorCode.NONE
    # Third delivery released: the limit (3) is reached, the record is archived, SPSO moves.
    assert sp.start_offset == 1
    assert sp.acquire("a", 0, 0, 1, 0, LIMITS) == []


def test_an_expired_lock_makes_records_available_again() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 4, 10, now_ms=0, limits=LIMITS)
    assert sp.next_deadline_ms() == 1000
    assert sp.expire(999, LIMITS) == 0
    assert sp.expire(1000, LIMITS) == 5
    assert sp.acquire("b", 0, 4, 10, 1000, LIMITS) == [Acquired(0, 4, 2)]
    # a's lock is gone: its late acknowledgement is refused.
    assert sp.acknowledge("a", 0, 4, [ACCEPT], 1000, LIMITS) is ErrorCode.INVALID_RECORD_STATE


def test_acknowledging_records_not_acquired_by_the_member_changes_nothing() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 3, 10, 0, LIMITS)
    before = sp.durable()
    assert sp.acknowledge("b", 0, 1, [ACCEPT], 0, LIMITS) is ErrorCode.INVALID_RECORD_STATE
    assert sp.acknowledge("a", 2, 9, [ACCEPT], 0, LIMITS) is ErrorCode.INVALID_RECORD_STATE
    assert sp.acknowledge("a", 3, 2, [ACCEPT], 0, LIMITS) is ErrorCode.INVALID_REQUEST
    assert sp.acknowledge("a", 0, 1, [ACCEPT, ACCEPT, ACCEPT], 0, LIMITS) is (
        ErrorCode.INVALID_REQUEST
    )
    assert sp.acknowledge("a", 0, 0, [9], 0, LIMITS) is ErrorCode.INVALID_REQUEST
    assert sp.durable() == before


def test_per_record_types_reject_and_gap_archive() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 3, 10, 0, LIMITS)
    assert sp.acknowledge("a", 0, 3, [ACCEPT, REJECT, RELEASE, GAP], 0, LIMITS) is ErrorCode.NONE
    assert sp.start_offset == 2
    assert sp.records[2].state is RecordState.AVAILABLE
    assert sp.records[3].state is RecordState.ARCHIVED


def test_release_member_gives_back_only_that_members_records() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 1, 10, 0, LIMITS)
    sp.acquire("b", 0, 3, 10, 0, LIMITS)
    assert sp.release_member("a", LIMITS) == 2
    assert [r.state for r in sp.records.values()] == [
        RecordState.AVAILABLE,
        RecordState.AVAILABLE,
        RecordState.ACQUIRED,
        RecordState.ACQUIRED,
    ]


def test_in_flight_records_are_capped() -> None:
    sp = SharePartition(0)
    assert sp.acquire("a", 0, 100, 100, 0, LIMITS) == [Acquired(0, 9, 1)]
    assert sp.first_available(readable_end=100, limits=LIMITS) is None
    sp.acknowledge("a", 0, 4, [ACCEPT], 0, LIMITS)
    assert sp.first_available(readable_end=100, limits=LIMITS) == 10
    assert sp.acquire("a", 10, 100, 100, 0, LIMITS) == [Acquired(10, 14, 1)]


def test_max_records_is_soft_at_batch_boundaries() -> None:
    """Kafka's batch-optimized acquire mode: the batch holding the last record wanted goes
    whole (batches 0-4 and 5-9 here), never past the window's limit."""
    sp = SharePartition(0)
    ends = frozenset({4, 9, 14})
    assert sp.acquire("a", 0, 14, 2, 0, LIMITS, batch_ends=ends) == [Acquired(0, 4, 1)]
    assert sp.acquire("a", 5, 14, 6, 0, LIMITS, batch_ends=ends) == [Acquired(5, 9, 1)]
    assert sp.in_flight() == 10  # the limit: nothing of 10-14 although it is one batch
    assert sp.acquire("a", 10, 14, 1, 0, LIMITS, batch_ends=ends) == []


def test_skipped_offsets_are_archived_never_delivered() -> None:
    sp = SharePartition(0)
    assert sp.acquire("a", 0, 5, 10, 0, LIMITS, skip=[(2, 3)]) == [
        Acquired(0, 1, 1),
        Acquired(4, 5, 1),
    ]
    sp.acknowledge("a", 0, 1, [ACCEPT], 0, LIMITS)
    assert sp.start_offset == 4


def test_durable_form_turns_acquired_into_available_and_keeps_counts() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 5, 10, 0, LIMITS)
    sp.acknowledge("a", 1, 1, [ACCEPT], 0, LIMITS)
    sp.acknowledge("a", 2, 2, [RELEASE], 0, LIMITS)
    sp.acknowledge("a", 3, 3, [REJECT], 0, LIMITS)
    durable = sp.durable()
    assert durable == [(0, 0, 1, 0), (1, 1, 1, 2), (2, 2, 1, 0), (3, 3, 1, 4), (4, 5, 1, 0)]
    restored = SharePartition.restore(sp.start_offset, durable)
    redelivered = restored.acquire("b", 0, 5, 10, 0, LIMITS)
    assert redelivered == [Acquired(0, 0, 2), Acquired(2, 2, 2), Acquired(4, 5, 2)]
    assert restored.acknowledge("b", 0, 0, [ACCEPT], 0, LIMITS) is ErrorCode.NONE
    assert restored.start_offset == 2


def test_move_start_drops_records_below_it() -> None:
    sp = SharePartition(0)
    sp.acquire("a", 0, 5, 10, 0, LIMITS)
    sp.move_start(4)
    assert (sp.start_offset, sorted(sp.records)) == (4, [4, 5])
    sp.move_start(20)
    assert (sp.start_offset, sp.next_offset, sp.records) == (20, 20, {})


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "ack", "release", "expire"]),
        st.sampled_from(["a", "b"]),
        st.integers(0, 30),
        st.integers(0, 5),
        st.sampled_from(list(AckType)[:4]),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_invariants_hold_whatever_happens(ops: list[tuple[str, str, int, int, AckType]]) -> None:
    """The window stays dense and bounded, the SPSO only moves forward and never past a record
    still to be delivered, an offset is held by at most one member, counts stay in bounds,
    and the durable form restores to the same record states (acquired ones as available)."""
    sp = SharePartition(0)
    now = 0
    delivered: dict[int, int] = {}
    for op, member, offset, length, kind in ops:
        now += 100
        start = sp.start_offset
        if op == "acquire":
            for got in sp.acquire(member, offset, offset + length, 1 + length, now, LIMITS):
                for o in range(got.first, got.last + 1):
                    delivered[o] = delivered.get(o, 0) + 1
                    assert got.delivery_count == delivered[o]
        elif op == "ack":
            sp.acknowledge(member, offset, offset + length, [kind], now, LIMITS)
        elif op == "release":
            sp.release_member(member, LIMITS)
        else:
            sp.expire(now + 2000, LIMITS)
        assert sp.start_offset >= start
        assert sorted(sp.records) == list(range(sp.start_offset, sp.next_offset))
        assert sp.in_flight() <= LIMITS.max_records_in_flight
        if sp.records:
            assert sp.records[sp.start_offset].state not in (
                RecordState.ACKNOWLEDGED,
                RecordState.ARCHIVED,
            )
        for r in sp.records.values():
            assert 0 <= r.delivery_count <= LIMITS.delivery_count_limit
            assert (r.member_id is not None) == (r.state is RecordState.ACQUIRED)
        restored = SharePartition.restore(sp.start_offset, sp.durable())
        assert [(o, r.delivery_count) for o, r in sorted(restored.records.items())] == [
            (o, r.delivery_count) for o, r in sorted(sp.records.items())
        ]


# --- batches ----------------------------------------------------------------------------------


def _batch(base: int, count: int, producer_id: int = -1, attributes: int = 0) -> bytes:
    values = [b"v%d" % i for i in range(count)]
    return make_batch(base, values, producer_id=producer_id, attributes=attributes)


def test_batches_cover_skip_and_trim() -> None:
    plain = _batch(0, 3)
    aborted = _batch(3, 2, producer_id=7, attributes=0x10)
    marker = _batch(5, 1, producer_id=7, attributes=0x30)
    committed = _batch(6, 2, producer_id=8, attributes=0x10)
    data = plain + aborted + marker + committed
    assert covered_last(data) == 7
    assert covered_last(b"") is None
    assert batch_ends(data) == {2, 4, 5, 7}
    assert skipped(data, [(7, 3)], read_committed=True) == [(3, 4), (5, 5)]
    assert skipped(data, [(7, 3)], read_committed=False) == [(5, 5)]
    assert overlapping(data, [Acquired(6, 6, 1)]) == committed
    assert overlapping(data, [Acquired(1, 1, 1), Acquired(7, 7, 1)]) == plain + committed


# --- sessions ---------------------------------------------------------------------------------


def test_share_sessions_follow_kafkas_epochs() -> None:
    sessions = ShareSessions(limit=1)
    key = ("g", "m")
    assert sessions.open_or_advance(key, 1, [], [])[0] is ErrorCode.SHARE_SESSION_NOT_FOUND
    error, session = sessions.open_or_advance(key, 0, [("t", 0), ("t", 1)], [])
    assert error is ErrorCode.NONE and session is not None and session.epoch == 1
    assert sessions.open_or_advance(key, 2, [], [])[0] is ErrorCode.INVALID_SHARE_SESSION_EPOCH
    error, session = sessions.open_or_advance(key, 1, [], [("t", 1)])
    assert error is ErrorCode.NONE and session is not None
    assert (session.epoch, session.partitions) == (2, {("t", 0)})
    assert sessions.open_or_advance(("g", "other"), 0, [], [])[0] is (
        ErrorCode.SHARE_SESSION_LIMIT_REACHED
    )
    assert sessions.close(key) is session
    assert sessions.check(key, 2)[0] is ErrorCode.SHARE_SESSION_NOT_FOUND


def test_reversed_overlapping_or_negative_ack_batches_are_refused() -> None:
    assert ordered_batches([(0, 4), (5, 5), (9, 12)])
    assert ordered_batches([])
    assert not ordered_batches([(4, 3)])
    assert not ordered_batches([(0, 4), (4, 6)])
    assert not ordered_batches([(5, 6), (0, 1)])
    assert not ordered_batches([(-3, 2)])


def test_release_departed_gives_back_the_records_of_members_no_longer_in_the_group() -> None:
    sp = SharePartition(0)
    sp.acquire("gone", 0, 1, 10, 0, LIMITS)
    sp.acquire("stays", 0, 3, 10, 0, LIMITS)
    assert sp.release_departed(frozenset({"stays"}), LIMITS) == 2
    assert [(r.state, r.member_id) for r in sp.records.values()] == [
        (RecordState.AVAILABLE, None),
        (RecordState.AVAILABLE, None),
        (RecordState.ACQUIRED, "stays"),
        (RecordState.ACQUIRED, "stays"),
    ]
    assert sp.release_departed(frozenset({"stays"}), LIMITS) == 0
