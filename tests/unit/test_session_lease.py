"""The broker's session lease by its own clock and by etcd's answers (``session_lease``): past a
TTL without an answered keepalive it is suspended (no acting as owner) but not lost; it resumes
when etcd renews the lease (an etcd leader change: the new leader extends every lease), and is
lost only when etcd says the lease is gone or nothing answered for one more TTL. The real broker
against a real etcd: ``tests/integration/test_session_lapse.py``."""

from __future__ import annotations

import asyncio
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

    async def grant_lease(self, ttl_s: int) -> int:
        return 7

    async def refresh_lease(self, lease_id: int) -> int:
        if self.expired:
            raise LeaseLost(f"etcd lease {lease_id:x} has expired or was revoked")
        if self.unreachable:
            raise MetadataUnavailable("etcd lease keepalive: no leader")
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
