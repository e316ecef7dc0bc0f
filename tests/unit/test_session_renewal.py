"""Renewing the broker's etcd session never gives up on an etcd error (``session_renewal``):
grants and registrations are retried, and a session lost before its registration is replaced.
The real broker against a real etcd: ``tests/integration/test_session_renewal.py``."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError, MetadataUnavailable
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.metadata.session_renewal import renew_session

pytestmark = pytest.mark.unit


class FakeEtcd:
    """Leases only: grants fail ``grant_failures`` times, then count up from 1."""

    def __init__(self, grant_failures: int = 0) -> None:
        self.grant_failures = grant_failures
        self.granted: list[int] = []

    async def grant_lease(self, ttl_s: int) -> int:
        if self.grant_failures:
            self.grant_failures -= 1
            raise MetadataUnavailable("etcd lease grant timed out")
        self.granted.append(len(self.granted) + 1)
        return self.granted[-1]

    async def refresh_lease(self, lease_id: int) -> int:
        return 60


async def renew(etcd: FakeEtcd, failures: list[BaseException]) -> tuple[SessionLease, list[int]]:
    adopted: list[int] = []
    registered: list[int] = []

    async def register(session: SessionLease) -> None:
        if failures:
            raise failures.pop(0)
        registered.append(session.id)

    session = await renew_session(
        cast(Any, etcd), 60, lambda s: adopted.append(s.id), register, retry_s=0.0
    )
    await session.close()
    assert registered == [session.id]
    return session, adopted


async def test_grants_and_registrations_are_retried_until_both_land() -> None:
    etcd = FakeEtcd(grant_failures=2)
    failures: list[BaseException] = [
        MetadataUnavailable("etcd put timed out"),
        MetadataError("etcd put failed: permission denied"),
    ]
    session, adopted = await renew(etcd, failures)
    assert session.id == 1 and adopted == [1]


async def test_a_session_lost_before_its_registration_is_replaced() -> None:
    etcd = FakeEtcd()
    session, adopted = await renew(etcd, [LeaseLost("etcd put failed: lease not found")])
    assert session.id == 2 and adopted == [1, 2]
