"""The transaction state machine (``transactions.state``): moves, errors, fencing."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.transactions import state
from kafscale.broker.transactions.markers import Marker, plan_markers, request_body, settled
from kafscale.broker.transactions.state import InitAction, Recovery, TxnMetadata, TxnState
from kafscale.broker.transactions.store import decode_metadata, encode_metadata

pytestmark = pytest.mark.unit

TP = ("orders", 0)


def fresh(epoch: int = 0, **changes: object) -> TxnMetadata:
    meta = TxnMetadata("app", producer_id=7, producer_epoch=epoch, timeout_ms=1000)
    return dataclasses.replace(meta, **changes)  # type: ignore[arg-type]


def ongoing(epoch: int = 0) -> TxnMetadata:
    outcome = state.add_to_transaction(fresh(epoch), 7, epoch, 100, frozenset({TP}))
    assert outcome.error is ErrorCode.NONE and outcome.metadata is not None
    return outcome.metadata


def test_init_of_a_new_transactional_id_takes_a_fresh_producer_id() -> None:
    assert state.decide_init(None, -1, -1).action is InitAction.NEW_PRODUCER_ID
    meta = state.initialised(None, "app", 1000, 5, new_producer_id=42)
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (42, 0, TxnState.EMPTY)


def test_every_init_bumps_the_epoch() -> None:
    current = fresh(epoch=4, state=TxnState.COMPLETE_COMMIT)
    assert state.decide_init(current, -1, -1).action is InitAction.BUMP_EPOCH
    bumped = state.initialised(current, "app", 1000, 5)
    assert (bumped.producer_id, bumped.producer_epoch) == (7, 5)


def test_init_at_the_last_epoch_takes_a_new_producer_id() -> None:
    current = fresh(epoch=state.MAX_PRODUCER_EPOCH - 1)
    assert state.decide_init(current, -1, -1).action is InitAction.NEW_PRODUCER_ID


def test_init_while_ongoing_aborts_first_with_a_bumped_epoch() -> None:
    current = ongoing(epoch=2)
    assert state.decide_init(current, -1, -1).action is InitAction.ABORT_FIRST
    aborting = state.fenced_abort(current, 200)
    assert (aborting.state, aborting.producer_epoch) == (TxnState.PREPARE_ABORT, 3)
    assert aborting.partitions == current.partitions  # the markers still go there


def test_init_while_preparing_says_concurrent_transactions() -> None:
    preparing = fresh(state=TxnState.PREPARE_COMMIT)
    decision = state.decide_init(preparing, -1, -1)
    assert (decision.action, decision.error) == (
        InitAction.RETRY,
        ErrorCode.CONCURRENT_TRANSACTIONS,
    )


def test_kip360_init_with_a_stale_epoch_is_fenced() -> None:
    decision = state.decide_init(fresh(epoch=3), 7, 2)
    assert decision.error is ErrorCode.PRODUCER_FENCED
    assert state.decide_init(fresh(epoch=3), 7, 3).action is InitAction.BUMP_EPOCH


def test_adding_checks_producer_id_and_epoch() -> None:
    current = fresh(epoch=3)
    now = 10
    wrong_id = state.add_to_transaction(current, 8, 3, now, frozenset({TP}))
    assert wrong_id.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    assert state.add_to_transaction(current, 7, 2, now, frozenset({TP})).error is (
        ErrorCode.PRODUCER_FENCED
    )
    missing = state.add_to_transaction(None, 7, 3, now, frozenset({TP}))
    assert missing.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_adding_begins_then_extends_a_transaction() -> None:
    begun = ongoing()
    assert (begun.state, begun.start_ms) == (TxnState.ONGOING, 100)
    again = state.add_to_transaction(begun, 7, 0, 150, frozenset({TP}))
    assert again.error is ErrorCode.NONE and again.metadata is None  # nothing new to write
    grown = state.add_to_transaction(begun, 7, 0, 150, groups=frozenset({"g"})).metadata
    assert grown is not None
    assert (grown.partitions, grown.groups, grown.start_ms) == ({TP}, {"g"}, 100)


def test_adding_while_preparing_says_concurrent_transactions() -> None:
    preparing = dataclasses.replace(ongoing(), state=TxnState.PREPARE_COMMIT)
    outcome = state.add_to_transaction(preparing, 7, 0, 1, frozenset({("x", 1)}))
    assert outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS


@pytest.mark.parametrize(
    ("current", "commit", "error", "next_state"),
    [
        (TxnState.ONGOING, True, ErrorCode.NONE, TxnState.PREPARE_COMMIT),
        (TxnState.ONGOING, False, ErrorCode.NONE, TxnState.PREPARE_ABORT),
        (TxnState.PREPARE_COMMIT, True, ErrorCode.CONCURRENT_TRANSACTIONS, None),
        (TxnState.PREPARE_COMMIT, False, ErrorCode.INVALID_TXN_STATE, None),
        (TxnState.PREPARE_ABORT, False, ErrorCode.CONCURRENT_TRANSACTIONS, None),
        (TxnState.PREPARE_ABORT, True, ErrorCode.INVALID_TXN_STATE, None),
        (TxnState.COMPLETE_COMMIT, True, ErrorCode.NONE, None),
        (TxnState.COMPLETE_COMMIT, False, ErrorCode.INVALID_TXN_STATE, None),
        (TxnState.COMPLETE_ABORT, False, ErrorCode.NONE, None),
        (TxnState.COMPLETE_ABORT, True, ErrorCode.INVALID_TXN_STATE, None),
        (TxnState.EMPTY, True, ErrorCode.INVALID_TXN_STATE, None),
    ],
)
def test_end_transaction(
    current: TxnState, commit: bool, error: ErrorCode, next_state: TxnState | None
) -> None:
    outcome = state.end_transaction(fresh(state=current), 7, 0, commit, 5)
    assert outcome.error is error
    assert (outcome.metadata.state if outcome.metadata else None) is next_state


def test_completion_clears_the_transaction() -> None:
    prepared = dataclasses.replace(ongoing(), state=TxnState.PREPARE_ABORT)
    done = state.completed(prepared, 9)
    assert (done.state, done.partitions, done.groups, done.start_ms) == (
        TxnState.COMPLETE_ABORT,
        frozenset(),
        frozenset(),
        -1,
    )


def test_timeouts_and_recovery() -> None:
    begun = ongoing()  # started at 100, timeout 1000
    assert state.recovery_action(begun, 1100) is Recovery.NOTHING
    assert state.recovery_action(begun, 1101) is Recovery.ABORT
    prepared = dataclasses.replace(begun, state=TxnState.PREPARE_COMMIT)
    assert state.recovery_action(prepared, 0) is Recovery.COMPLETE
    assert state.recovery_action(fresh(state=TxnState.COMPLETE_COMMIT), 10**9) is Recovery.NOTHING


def test_old_clients_get_invalid_producer_epoch() -> None:
    fenced = ErrorCode.PRODUCER_FENCED
    assert state.wire_error(fenced, 26, 1) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.wire_error(fenced, 26, 2) is fenced
    assert state.wire_error(fenced, 22, 3) is ErrorCode.INVALID_PRODUCER_EPOCH
    assert state.wire_error(ErrorCode.INVALID_TXN_STATE, 26, 0) is ErrorCode.INVALID_TXN_STATE


def test_timeout_bounds() -> None:
    assert state.valid_timeout(1, 10) and state.valid_timeout(10, 10)
    assert not state.valid_timeout(0, 10) and not state.valid_timeout(11, 10)


@given(
    st.lists(
        st.sampled_from(["init", "add", "commit", "abort", "complete", "timeout"]), max_size=40
    )
)
def test_the_epoch_never_goes_back_and_stale_epochs_stay_fenced(ops: list[str]) -> None:
    """Any sequence of requests: the epoch only grows, and a request with an epoch below the
    current one is always refused."""
    meta = state.initialised(None, "app", 1000, 0, new_producer_id=1)
    now = 0
    for op in ops:
        now += 400
        before = meta.producer_epoch
        if op == "init" and state.decide_init(meta, -1, -1).action is InitAction.BUMP_EPOCH:
            meta = state.initialised(meta, "app", 1000, now)
        elif op == "add":
            added = state.add_to_transaction(meta, 1, before, now, frozenset({TP}))
            meta = added.metadata or meta
        elif op in ("commit", "abort"):
            ended = state.end_transaction(meta, 1, before, op == "commit", now)
            meta = ended.metadata or meta
        elif op == "complete" and meta.state.preparing:
            meta = state.completed(meta, now)
        elif op == "timeout" and state.timed_out(meta, now):
            meta = state.fenced_abort(meta, now)
        assert meta.producer_epoch >= before
        if meta.producer_epoch > 0:
            stale = state.add_to_transaction(meta, 1, meta.producer_epoch - 1, now, frozenset())
            assert stale.error is ErrorCode.PRODUCER_FENCED


def test_metadata_round_trips_through_json() -> None:
    meta = dataclasses.replace(ongoing(), groups=frozenset({"g/1"}))
    assert decode_metadata(encode_metadata(meta)) == meta


def test_markers_are_planned_per_owner_and_settled_per_partition() -> None:
    owners = {("a", 0): 1, ("a", 1): 2, ("b", 0): 1}
    assert plan_markers(owners, owners.__getitem__) == {1: [("a", 0), ("b", 0)], 2: [("a", 1)]}
    marker_of = Marker(producer_id=7, producer_epoch=1, commit=True, coordinator_epoch=3)
    body = request_body(marker_of, [("a", 0), ("a", 2), ("b", 0)])
    (marker,) = body["markers"]
    assert marker["topics"] == [
        {"name": "a", "partition_indexes": [0, 2]},
        {"name": "b", "partition_indexes": [0]},
    ]
    errors = {
        ("a", 0): ErrorCode.NONE,
        ("a", 1): ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ("gone", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("b", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("c", 0): ErrorCode.INVALID_PRODUCER_EPOCH,
        ("c", 1): ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ("c", 2): ErrorCode.KAFKA_STORAGE_ERROR,
    }
    assert settled(errors, lambda topic: topic != "gone") == {
        ("a", 0),
        ("gone", 0),
        ("c", 0),
        ("c", 1),
    }


@pytest.mark.parametrize(
    ("txn_state", "updated_ms", "now_ms", "expected"),
    [
        (TxnState.COMPLETE_COMMIT, 1_000, 11_000, True),  # unused for the whole expiration
        (TxnState.COMPLETE_ABORT, 1_000, 11_000, True),
        (TxnState.EMPTY, 1_000, 11_000, True),  # initialised, never used
        (TxnState.COMPLETE_COMMIT, 1_000, 10_999, False),  # not quite yet
        (TxnState.ONGOING, 1_000, 99_000, False),  # in flight: the timeout aborts it first
        (TxnState.PREPARE_COMMIT, 1_000, 99_000, False),  # decided, markers owed
        (TxnState.PREPARE_ABORT, 1_000, 99_000, False),
        (TxnState.COMPLETE_COMMIT, -1, 99_000, False),  # no update time known: kept
    ],
)
def test_only_a_settled_transactional_id_unused_for_the_expiration_expires(
    txn_state: TxnState, updated_ms: int, now_ms: int, expected: bool
) -> None:
    meta = TxnMetadata(
        "app", producer_id=7, producer_epoch=0, timeout_ms=1000, state=txn_state,
        updated_ms=updated_ms,
    )  # fmt: skip
    assert state.expired(meta, now_ms, expiration_ms=10_000) is expected
