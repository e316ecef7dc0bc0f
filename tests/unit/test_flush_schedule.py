"""When flush rounds start (group commit): at once for the first batch, held back only by the
coalescing window, the store's minimum interval (bounded by ``flush_interval_ms``) and the round
slots; whole segments and handoffs go at once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.config import BrokerSettings, LogSettings, StorageKind, StorageSettings
from kafscale.broker.storage.flush_schedule import (
    RoundPolicy,
    Start,
    Wait,
    decide_round,
    round_policy,
)

pytestmark = pytest.mark.unit

POLICY = RoundPolicy(min_interval_s=0.02, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4)


def decide(policy: RoundPolicy = POLICY, now: float = 10.0, **kwargs: object) -> object:
    inputs: dict[str, object] = {
        "pending_since": None,
        "segment_full": False,
        "everything_asked": False,
        "last_round_at": None,
        "rounds_in_flight": 0,
        "rounds_uploading": 0,
    }
    inputs.update(kwargs)
    return decide_round(policy, now, **inputs)  # type: ignore[arg-type]


def test_the_first_batch_starts_a_round_at_once() -> None:
    assert decide(pending_since=10.0) == Start(everything=True)


def test_nothing_buffered_waits_for_data() -> None:
    assert decide() == Wait(None)


def test_a_batch_right_after_a_round_waits_out_the_minimum_interval() -> None:
    assert decide(pending_since=10.0, last_round_at=9.99) == Wait(pytest.approx(10.01))
    assert decide(now=10.01, pending_since=10.0, last_round_at=9.99) == Start(everything=True)


def test_without_a_minimum_interval_a_round_follows_as_soon_as_the_last_one_commits() -> None:
    local = RoundPolicy(min_interval_s=0.0, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4)
    assert decide(local, pending_since=10.0, last_round_at=10.0, rounds_in_flight=3) == Start(
        everything=True
    )


def test_batches_gather_while_the_previous_round_uploads() -> None:
    local = RoundPolicy(min_interval_s=0.0, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4)
    waiting = decide(local, pending_since=9.0, rounds_in_flight=1, rounds_uploading=1)
    assert waiting == Wait(None)  # woken when that upload is handed to its commit
    assert decide(local, pending_since=9.0, rounds_in_flight=1, rounds_uploading=0) == Start(
        everything=True
    )


def test_a_second_round_uploads_beside_the_first_but_not_a_third() -> None:
    """A request arriving during an upload starts its own round (the broker allows two at
    once); a third waits for one of them to hand its upload to the commit."""
    two = RoundPolicy(
        min_interval_s=0.0, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4, max_uploading=2
    )
    second = decide(two, pending_since=9.0, rounds_in_flight=1, rounds_uploading=1)
    assert second == Start(everything=True)
    third = decide(two, pending_since=9.0, rounds_in_flight=2, rounds_uploading=2)
    assert third == Wait(None)


def test_two_rounds_upload_at_once_on_s3_and_one_on_a_local_directory() -> None:
    local = BrokerSettings(storage=StorageSettings(kind=StorageKind.LOCAL))
    s3 = BrokerSettings(storage=StorageSettings(kind=StorageKind.S3))
    assert round_policy(s3, 4).max_uploading == 2
    assert round_policy(local, 4).max_uploading == 1


def test_the_coalescing_window_holds_the_first_batch_briefly() -> None:
    policy = RoundPolicy(min_interval_s=0.0, coalesce_s=0.002, max_wait_s=0.1, max_in_flight=4)
    assert decide(policy, pending_since=10.0) == Wait(pytest.approx(10.002))
    assert decide(policy, now=10.002, pending_since=10.0) == Start(everything=True)


def test_all_round_slots_busy_waits_for_one_to_free_even_for_a_handoff() -> None:
    assert decide(pending_since=9.0, everything_asked=True, rounds_in_flight=4) == Wait(None)


def test_a_full_segment_goes_at_once_as_whole_segments_only() -> None:
    assert decide(pending_since=10.0, last_round_at=9.99, segment_full=True) == Start(
        everything=False
    )
    uploading = decide(pending_since=9.0, segment_full=True, rounds_in_flight=1, rounds_uploading=1)
    assert uploading == Start(everything=False)


def test_a_handoff_takes_everything_at_once() -> None:
    assert decide(everything_asked=True, last_round_at=10.0) == Start(everything=True)


@given(
    pending_since=st.floats(0, 100),
    last_round_at=st.one_of(st.none(), st.floats(0, 100)),
    min_interval_s=st.floats(0, 10),
    coalesce_s=st.floats(0, 10),
    max_wait_s=st.floats(0.001, 1),
)
def test_no_batch_waits_longer_than_the_flush_interval(
    pending_since: float,
    last_round_at: float | None,
    min_interval_s: float,
    coalesce_s: float,
    max_wait_s: float,
) -> None:
    policy = RoundPolicy(min_interval_s, coalesce_s, max_wait_s, max_in_flight=4)
    now = pending_since + max_wait_s
    assert decide(policy, now, pending_since=pending_since, last_round_at=last_round_at) == Start(
        everything=True
    )
    early = decide(policy, pending_since, pending_since=pending_since, last_round_at=last_round_at)
    if isinstance(early, Wait):
        assert early.until is not None and pending_since < early.until <= now


def test_the_default_interval_depends_on_the_store() -> None:
    local = BrokerSettings(storage=StorageSettings(kind=StorageKind.LOCAL))
    s3 = BrokerSettings(storage=StorageSettings(kind=StorageKind.S3))
    assert round_policy(local, 4).min_interval_s == 0.0
    assert round_policy(s3, 4).min_interval_s == pytest.approx(0.02)


def test_a_set_interval_wins_and_the_flush_interval_caps_it() -> None:
    set_ = BrokerSettings(log=LogSettings(flush_min_interval_ms=5))
    capped = BrokerSettings(log=LogSettings(flush_min_interval_ms=500, flush_interval_ms=100))
    assert round_policy(set_, 4).min_interval_s == pytest.approx(0.005)
    assert round_policy(capped, 4).min_interval_s == pytest.approx(0.1)
