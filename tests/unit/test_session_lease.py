"""The broker's session lease by its own clock and by etcd's answers (``session_lease``): past a
TTL without an answered keepalive it is suspended (no acting as owner) but not lost; it resumes
when etcd renews the lease (an etcd leader change: the new leader extends every lease), and is
lost only when etcd says the lease is gone or nothing answered for one more TTL. The real broker
against a real etcd: ``tests/integration/test_session_lapse.py``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

import pytest

from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataUnavailable
from kafscale.broker.metadata.session_lease import Phase, SessionLease, session_phase

pytestmark = pytest.mark.unit

TTL_S = 1  # the shortest etcd grants; every wait below is for a condition, bounded
WAIT_S = 30.0


class KeepaliveEtcd:
    """Leases only: a keepalive is answered with the TTL, refused while ``unreachable``, and
    answered "gone" once ``expired``."""

    def __init__(self) -> None:
        self.unreachable = False
        self.expired = False
        self.renewals = 0

    async def grant_lease(self, ttl_s: int) -> int:
        return 7

    async def refresh_lease(self, lease_id: int) -> int:
        if self.expired:
            raise LeaseLost(f"etcd lease {lease_id:x} has expired or was revoked")
        if self.unreachable:
            raise MetadataUnavailable("etcd lease keepalive: no leader")
        self.renewals += 1
        return TTL_S


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_the_phases_by_the_clock() -> None:
    assert session_phase(9.9, 10.0, 4) is Phase.VALID
    assert session_phase(10.0, 10.0, 4) is Phase.SUSPENDED
    assert session_phase(13.9, 10.0, 4) is Phase.SUSPENDED
    assert session_phase(14.0, 10.0, 4) is Phase.LOST


async def test_a_session_etcd_still_holds_resumes_without_being_lost() -> None:
    etcd = KeepaliveEtcd()
    session = await SessionLease.start(cast(Any, etcd), TTL_S)
    try:
        assert session.still_valid()
        etcd.unreachable = True  # an etcd election: keepalives fail past the TTL
        await until(lambda: not session.still_valid(), "never suspended")
        assert not session.lost.is_set()
        etcd.unreachable = False  # the new leader extended the lease: the next keepalive lands
        await until(session.still_valid, "never resumed")
        assert not session.lost.is_set()
    finally:
        await session.close()


async def test_a_suspended_session_etcd_says_is_gone_is_lost() -> None:
    etcd = KeepaliveEtcd()
    session = await SessionLease.start(cast(Any, etcd), TTL_S)
    try:
        etcd.unreachable = True
        await until(lambda: not session.still_valid(), "never suspended")
        etcd.expired = True  # the lease really ran out in etcd
        await asyncio.wait_for(session.lost.wait(), WAIT_S)
        etcd.expired = etcd.unreachable = False
        assert not session.still_valid()  # lost for good: a new session is needed
    finally:
        await session.close()


async def test_a_session_nothing_answers_for_two_ttls_is_lost() -> None:
    etcd = KeepaliveEtcd()
    session = await SessionLease.start(cast(Any, etcd), TTL_S)
    try:
        etcd.unreachable = True
        await asyncio.wait_for(session.lost.wait(), WAIT_S)
        etcd.unreachable = False
        assert not session.still_valid()
    finally:
        await session.close()


class StallingEtcd(KeepaliveEtcd):
    """``KeepaliveEtcd`` whose next keepalive, once ``stall_s`` is set, blocks the event loop
    that long before it is answered: the answer comes after the renewal it reports ran out (a
    loop stalled on a loaded machine, or a process frozen with a keepalive in flight)."""

    def __init__(self, ttl_s: int) -> None:
        super().__init__()
        self.ttl_s = ttl_s
        self.stall_s = 0.0
        self.stalled = False

    async def refresh_lease(self, lease_id: int) -> int:
        if self.unreachable:
            raise MetadataUnavailable("etcd lease keepalive: no leader")
        if self.stall_s:
            time.sleep(self.stall_s)  # noqa: ASYNC251 - blocks the loop on purpose: no timeout fires
            self.stall_s, self.stalled = 0.0, True
        return self.ttl_s


def session_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The phase changes the session logged: "suspended", "resumed", "lost", in order."""
    told = []
    for record in caplog.records:
        if record.name.endswith("session_lease"):
            told += [w for w in ("suspended", "resumed", "lost") if f" {w}" in record.getMessage()]
    return told


async def test_an_answer_later_than_the_renewal_it_reports_does_not_resume(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: such an answer logged "resumed", and the session, past its TTL all the same,
    logged "suspended" again at once; it acted as owner for none of it. Now the session stays
    suspended until an answer comes in time, and says "resumed" once, then."""
    caplog.set_level(logging.WARNING)
    ttl_s = 3  # the stall must outlast it, and what follows must come before two TTLs
    etcd = StallingEtcd(ttl_s)
    session = await SessionLease.start(cast(Any, etcd), ttl_s)
    try:
        etcd.unreachable = True
        await until(lambda: not session.still_valid(), "never suspended")
        etcd.stall_s, etcd.unreachable = ttl_s + 0.5, False
        await until(lambda: etcd.stalled, "the stalled keepalive never ran")
        assert not session.still_valid()  # renewed until sent + TTL: already past
        assert session_lines(caplog) == ["suspended"]
        await until(session.still_valid, "never resumed by a keepalive answered in time")
        assert session_lines(caplog) == ["suspended", "resumed"]
    finally:
        await session.close()


async def test_a_suspension_and_its_resumption_are_counted() -> None:
    """For ``kafscale_session_lease_suspensions_total`` and ``..._resumptions_total``: a
    suspension can be shorter than a scrape interval, so a gauge alone may never show it."""
    etcd = KeepaliveEtcd()
    session = await SessionLease.start(cast(Any, etcd), TTL_S)
    try:
        assert (session.counts.suspensions, session.counts.resumptions) == (0, 0)
        etcd.unreachable = True
        await until(lambda: not session.still_valid(), "never suspended")
        etcd.unreachable = False
        await until(session.still_valid, "never resumed")
        assert (session.counts.suspensions, session.counts.resumptions) == (1, 1)
        assert session.phase() is Phase.VALID
    finally:
        await session.close()


async def test_a_resumption_is_told_with_its_time_and_renewals_do_not_change_it() -> None:
    """``resumed_at_ms``: what each group coordinated on the session compares with the
    resumption it last moved its members' timers for (``groups/session_resume``)."""
    etcd = KeepaliveEtcd()
    session = await SessionLease.start(cast(Any, etcd), TTL_S)
    try:
        assert session.resumed_at_ms() is None  # never suspended
        etcd.unreachable = True
        await until(lambda: not session.still_valid(), "never suspended")
        assert session.resumed_at_ms() is None
        etcd.unreachable = False
        before_ms = int(asyncio.get_running_loop().time() * 1000)
        await until(session.still_valid, "never resumed")
        resumed_ms = session.resumed_at_ms()
        after_ms = int(asyncio.get_running_loop().time() * 1000)
        assert resumed_ms is not None and before_ms <= resumed_ms <= after_ms
        resumptions, renewals = session.counts.resumptions, etcd.renewals
        await until(lambda: etcd.renewals >= renewals + 3, "no more keepalives")
        # ordinary keepalives are no resumption (unless the loop stalled past the TTL again)
        moved = session.resumed_at_ms() != resumed_ms
        assert not moved or session.counts.resumptions > resumptions
    finally:
        await session.close()
