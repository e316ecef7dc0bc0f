"""When the proxy re-reads a lease from etcd because its owner keeps refusing it
(``broker/proxy/staleness.py``): after a grace, then at most once per interval per key, and
only for one broker's unbroken streak of refusals."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.proxy.staleness import (
    STREAK_GAP_S,
    RefusalStreaks,
    RouteKey,
    Streak,
    check_due,
    corrected_holder,
)

pytestmark = pytest.mark.unit

P0 = RouteKey.of_partition(("t", 0))
P1 = RouteKey.of_partition(("t", 1))
GROUP = RouteKey("group", "g")


def test_no_check_within_the_grace() -> None:
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0)
    assert not streaks.refused(P0, 1, now=10.0)
    assert not streaks.refused(P0, 1, now=10.2)
    assert not streaks.refused(P0, 1, now=10.49)


def test_check_once_the_broker_refused_past_the_grace_then_once_per_interval() -> None:
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0)
    streaks.refused(P0, 1, now=10.0)
    assert streaks.refused(P0, 1, now=10.5)
    assert not streaks.refused(P0, 1, now=10.9)
    assert not streaks.refused(P0, 1, now=11.4)
    assert streaks.refused(P0, 1, now=11.5)


def test_zero_grace_checks_at_the_first_refusal() -> None:
    streaks = RefusalStreaks(grace_s=0.0, interval_s=1.0)
    assert streaks.refused(P0, 1, now=10.0)
    assert not streaks.refused(P0, 1, now=10.1)


def test_another_broker_refusing_starts_a_new_streak() -> None:
    """The route moved (the watch caught up) and the new owner refuses for a moment: its own
    view of its lease lags. That is no sign of a stale table yet."""
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0)
    streaks.refused(P0, 1, now=10.0)
    assert not streaks.refused(P0, 2, now=10.6)
    assert streaks.refused(P0, 2, now=11.1)


def test_a_pause_between_refusals_starts_a_new_streak() -> None:
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0)
    streaks.refused(P0, 1, now=10.0)
    assert not streaks.refused(P0, 1, now=10.0 + STREAK_GAP_S + 0.1)


def test_keys_are_apart() -> None:
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0)
    streaks.refused(P0, 1, now=10.0)
    assert not streaks.refused(P1, 1, now=10.6)
    assert not streaks.refused(GROUP, 1, now=10.6)
    assert streaks.refused(P0, 1, now=10.6)


def test_streaks_are_bounded() -> None:
    streaks = RefusalStreaks(grace_s=0.5, interval_s=1.0, max_streaks=3)
    for p in range(10):
        streaks.refused(RouteKey.of_partition(("t", p)), 1, now=10.0)
    assert len(streaks) == 3


def test_etcd_disagreeing_is_a_correction() -> None:
    assert corrected_holder(1, 2)
    assert corrected_holder(1, None)  # the lease is gone: the table kept a released one
    assert corrected_holder(None, 2)  # the table missed the new holder
    assert not corrected_holder(2, 2)
    assert not corrected_holder(None, None)


def test_route_keys_name_what_was_refused() -> None:
    assert str(P0) == "partition t/0"
    assert str(GROUP) == "group 'g'"
    assert RouteKey.of_partition(("t", 0)) == P0


@given(
    grace=st.floats(0, 5),
    interval=st.floats(0.01, 5),
    gaps=st.lists(st.floats(0, STREAK_GAP_S), min_size=1, max_size=60),
)
def test_checks_never_come_sooner_than_the_grace_or_the_interval(
    grace: float, interval: float, gaps: list[float]
) -> None:
    streaks = RefusalStreaks(grace_s=grace, interval_s=interval)
    now = 100.0
    checks: list[float] = []
    for gap in gaps:
        now += gap
        if streaks.refused(P0, 1, now):
            checks.append(now)
    first = 100.0 + gaps[0]  # the streak's first refusal (no gap exceeds STREAK_GAP_S)
    assert all(at - first >= grace for at in checks)
    assert all(b - a >= interval for a, b in pairwise(checks))


def test_check_due_reads_the_streak() -> None:
    streak = Streak(broker=1, first_at=10.0, last_at=10.0)
    assert not check_due(streak, 10.4, grace_s=0.5, interval_s=1.0)
    assert check_due(streak, 10.5, grace_s=0.5, interval_s=1.0)
    streak.checked_at = 10.5
    assert not check_due(streak, 11.0, grace_s=0.5, interval_s=1.0)
    assert check_due(streak, 11.5, grace_s=0.5, interval_s=1.0)
