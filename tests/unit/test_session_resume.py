"""Members' timers when their coordinator's etcd session resumes (``groups/session_resume``):
a whole session from the resumption, never a shorter one than they had."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.consumer import ConsumerConfig, ConsumerGroup, HeartbeatRequest
from kafscale.broker.groups.session_resume import (
    resumed_deadline_ms,
    resumed_join_deadline_ms,
    resumption_to_apply,
)
from kafscale.broker.groups.share import ShareConfig, ShareGroup, ShareHeartbeat

TIMES = st.integers(0, 10**12)


@given(st.one_of(st.none(), TIMES), TIMES, st.integers(0, 10**7))
def test_a_resumed_deadline_is_a_whole_timeout_away_and_never_earlier(
    deadline_ms: int | None, now_ms: int, timeout_ms: int
) -> None:
    resumed = resumed_deadline_ms(deadline_ms, now_ms, timeout_ms)
    if deadline_ms is None:
        assert resumed is None  # no timer was running: none is started
    else:
        assert resumed is not None
        assert resumed >= now_ms + timeout_ms
        assert resumed >= deadline_ms
        assert resumed in (deadline_ms, now_ms + timeout_ms)


def test_a_share_member_refused_past_its_session_is_kept_at_the_resumption() -> None:
    group = ShareGroup("g", ShareConfig(session_timeout_ms=1000, heartbeat_interval_ms=100))
    joined = group.heartbeat(0, ShareHeartbeat("a", 0, None, ("t",), "c", "/h"), {"t": 1})
    assert joined.member_id == "a"
    group.resume_sessions(5000)  # its heartbeats were refused from 0 to 5000
    assert group.tick(5000) == []
    assert group.tick(6000) == ["a"]  # one whole session later, as at a load


def test_a_consumer_protocol_member_refused_past_its_session_is_kept_at_the_resumption() -> None:
    group = ConsumerGroup("g", ConsumerConfig(session_timeout_ms=1000))
    join = HeartbeatRequest(
        member_id="m0",
        member_epoch=0,
        instance_id=None,
        rack_id=None,
        rebalance_timeout_ms=60_000,
        subscribed_topic_names=("a",),
        subscribed_topic_regex=None,
        server_assignor=None,
        owned=frozenset(),
        client_id="c",
        client_host="/127.0.0.1",
        fresh_id="unused",
    )
    assert group.heartbeat(0, join, {"a": 2}).member_id == "m0"
    group.resume_sessions(5000)  # its heartbeats were refused from 0 to 5000
    assert group.tick(5000) == []
    assert group.tick(6000) == ["m0"]


@given(st.one_of(st.none(), TIMES), TIMES, st.integers(0, 10**7), st.integers(0, 10**7))
def test_a_resumed_join_waits_a_whole_rebalance_timeout_or_initial_delay(
    deadline_ms: int | None, now_ms: int, rebalance_timeout_ms: int, delay_ms: int
) -> None:
    rebalance = resumed_join_deadline_ms(deadline_ms, now_ms, rebalance_timeout_ms, None)
    initial = resumed_join_deadline_ms(deadline_ms, now_ms, rebalance_timeout_ms, delay_ms)
    assert rebalance == resumed_deadline_ms(deadline_ms, now_ms, rebalance_timeout_ms)
    assert initial == resumed_deadline_ms(deadline_ms, now_ms, delay_ms)


@given(st.one_of(st.none(), TIMES), st.one_of(st.none(), TIMES), TIMES)
def test_a_group_moves_its_timers_once_for_each_resumption_it_has_not_seen(
    applied_ms: int | None, resumed_ms: int | None, now_ms: int
) -> None:
    """Whenever the group looks (a timer step, a request), it moves its timers for the
    session's last resumption if it has not yet, from the resumption itself (never from the
    future), and not again for one it did."""
    from_ms = resumption_to_apply(applied_ms, resumed_ms, now_ms)
    if resumed_ms is None or resumed_ms == applied_ms:
        assert from_ms is None  # never resumed, or already moved for it
    else:
        assert from_ms == min(resumed_ms, now_ms)
    assert resumption_to_apply(resumed_ms, resumed_ms, now_ms) is None  # once, not twice


def test_a_member_whose_deadline_falls_after_a_resumption_gets_a_whole_session_from_it() -> None:
    """The gap this decision closes: refused from 1000 to 9000 (the suspension), a member
    whose session (10 s, from its last heartbeat at 0) runs to 10 000 is kept until a
    whole session after the resumption, though the timers never woke during the suspension."""
    group = ShareGroup("g", ShareConfig(session_timeout_ms=10_000, heartbeat_interval_ms=100))
    group.heartbeat(0, ShareHeartbeat("a", 0, None, ("t",), "c", "/h"), {"t": 1})
    from_ms = resumption_to_apply(None, 9000, 10_000)  # looked at the old deadline
    assert from_ms == 9000
    group.resume_sessions(from_ms)
    assert group.tick(10_000) == []
    assert group.tick(18_999) == []
    assert group.tick(19_000) == ["a"]  # a whole session from the resumption, not from the look
