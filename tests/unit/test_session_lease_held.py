"""Whether etcd may still hold a suspended session's lease (``session_lease.held_after_send``,
``may_be_held``): Metadata names a suspended broker leader of what it owns while it may, as
the other brokers, reading etcd, do (``leaders.live_leaders``); a broker that sent no keepalive
for a TTL (frozen) names itself leader of nothing. The real brokers:
``tests/integration/test_session_lapse.py``."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.session_lease import (
    Phase,
    SessionLease,
    held_after_send,
    may_be_held,
    session_phase,
)

pytestmark = pytest.mark.unit

WAIT_S = 30.0
times = st.floats(0, 1e6, allow_nan=False)
ttls = st.integers(1, 60)


def test_a_keepalive_sent_while_the_lease_may_live_renews_it_from_then() -> None:
    assert held_after_send(10.0, 9.0, 4) == 13.0
    assert held_after_send(10.0, 9.99, 4) == 13.99


def test_a_keepalive_sent_after_the_lease_could_have_run_out_renews_nothing() -> None:
    """A process frozen past its TTL: its first keepalive on waking finds the lease gone."""
    assert held_after_send(10.0, 10.0, 4) == 10.0
    assert held_after_send(10.0, 25.0, 4) == 10.0


@given(times, times, ttls)
def test_sends_never_shorten_what_etcd_may_hold(held: float, sent: float, ttl: int) -> None:
    assert held_after_send(held, sent, ttl) >= held


@given(times, times, times, ttls)
def test_a_valid_session_is_held_and_a_lost_one_is_not(
    now: float, valid_until: float, held: float, ttl: int
) -> None:
    phase = session_phase(now, valid_until, ttl)
    held = max(held, valid_until)  # what the session keeps: never before valid_until
    if phase is Phase.VALID:
        assert may_be_held(phase, now, held)
    if phase is Phase.LOST:
        assert not may_be_held(phase, now, held)


def test_a_suspended_session_is_held_until_its_last_keepalive_could_have_run_out() -> None:
    assert may_be_held(Phase.SUSPENDED, 11.0, 12.0)
    assert not may_be_held(Phase.SUSPENDED, 12.0, 12.0)


class UnansweredEtcd:
    """Keepalives sent and never answered in time (an etcd election)."""

    async def grant_lease(self, ttl_s: int) -> int:
        return 7

    async def refresh_lease(self, lease_id: int) -> int:
        raise MetadataUnavailable("etcd lease keepalive: no leader")


async def until_suspended(session: SessionLease) -> None:
    deadline = time.monotonic() + WAIT_S
    while session.still_valid():
        assert time.monotonic() < deadline, "never suspended"
        await asyncio.sleep(0.02)


async def test_a_suspended_session_still_sending_keepalives_may_be_held() -> None:
    session = await SessionLease.start(cast(Any, UnansweredEtcd()), 1)
    try:
        await until_suspended(session)
        assert session.phase() is Phase.SUSPENDED
        assert session.may_be_held()  # the other brokers still name it: etcd has its keys
        await asyncio.wait_for(session.lost.wait(), WAIT_S)
        assert not session.may_be_held()
    finally:
        await session.close()


async def test_a_session_frozen_past_its_ttl_is_not_held() -> None:
    """No keepalive went out for a TTL: etcd has most likely deleted the lease and the other
    brokers name another leader; this one names itself leader of nothing, as before."""
    ttl_s = 2
    session = await SessionLease.start(cast(Any, UnansweredEtcd()), ttl_s)
    try:
        time.sleep(ttl_s + 0.3)  # noqa: ASYNC251 - a freeze: the loop and its keepalive stop
        assert session.phase() is Phase.SUSPENDED
        assert not session.may_be_held()
    finally:
        await session.close()
