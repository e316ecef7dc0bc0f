"""The graceful stop's one deadline, shared by the hand-off and the requests in flight."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.stop_budget import HANDOFF_SHARE, left_s, stop_deadlines
from kafscale.broker.stop_deadline import CLOSE_MARGIN_S, stop_bound_s


def test_the_handoff_gets_three_quarters_and_the_requests_the_rest() -> None:
    deadlines = stop_deadlines(now_s=100.0, grace_s=20.0)
    assert deadlines.handoff_until == 115.0
    assert deadlines.graceful_until == 120.0


def test_what_the_handoff_leaves_goes_to_the_requests() -> None:
    """The requests get what is left when the hand-off ends, not only their quarter."""
    deadlines = stop_deadlines(now_s=0.0, grace_s=20.0)
    handoff_ended_at = 3.0
    assert left_s(deadlines.graceful_until, handoff_ended_at) == 17.0


def test_a_step_past_its_deadline_gets_no_time() -> None:
    assert left_s(10.0, 12.5) == 0.0


@given(
    now_s=st.floats(0, 1e6),
    grace_s=st.floats(0, 3600),
    share=st.floats(-1, 2),
    handoff_took_s=st.floats(0, 7200),
)
def test_the_graceful_part_never_outlives_its_grace(
    now_s: float, grace_s: float, share: float, handoff_took_s: float
) -> None:
    """Whatever the share and however long the hand-off runs (it is cut at its deadline), the
    graceful part ends by the grace: the stop bound's close margin is left for closing the
    clients, so a stop within its grace is never cut."""
    deadlines = stop_deadlines(now_s, grace_s, share)
    assert now_s <= deadlines.handoff_until <= deadlines.graceful_until
    assert deadlines.graceful_until == now_s + grace_s
    handoff_ended = min(now_s + handoff_took_s, deadlines.handoff_until)
    requests_end = handoff_ended + left_s(deadlines.graceful_until, handoff_ended)
    assert requests_end <= deadlines.graceful_until + 1e-6  # float rounding only
    assert requests_end - now_s + CLOSE_MARGIN_S <= stop_bound_s(grace_s) + 1e-6


def test_the_share_leaves_the_requests_a_floor() -> None:
    assert 0.5 <= HANDOFF_SHARE < 1.0
