"""Coming back after the broker's etcd session was lost: a new session, and the broker's
registration on it, retried until both are in etcd.

Before, one etcd error while registering again (a put that timed out while the etcd cluster
elected a leader, a new lease that expired before the put landed, a refused put) ended the task
that watches the session, for good and with one line in the log: the broker then ran without a
registration (Metadata no longer named it, so clients could not reach it) and, at its next lost
session, without any session at all: it could own no partition and coordinate no group (every
JoinGroup answered UNKNOWN_SERVER_ERROR) until it was restarted. Found by the fault campaign
(``bench/chaos.py``) killing the leader of a 3-member etcd cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError
from kafscale.broker.metadata.session_lease import SessionLease

log = logging.getLogger(__name__)

RETRY_S = 1.0


async def renew_session(
    etcd: Etcd,
    ttl_s: int,
    adopt: Callable[[SessionLease], None],
    register: Callable[[SessionLease], Awaitable[None]],
    retry_s: float = RETRY_S,
) -> SessionLease:
    """A new session, handed to ``adopt`` (the broker acts on it from then on) and then to
    ``register`` (the broker's registration bound to it), both retried every ``retry_s``
    until they succeed. A session lost before its registration landed is closed and replaced."""
    while True:
        session = await _new_session(etcd, ttl_s, retry_s)
        adopt(session)
        if await _register(session, register, retry_s):
            return session
        log.warning("etcd session %x ended before the broker registered on it; another", session.id)
        await session.close()


async def _new_session(etcd: Etcd, ttl_s: int, retry_s: float) -> SessionLease:
    failures = 0
    while True:
        try:
            return await SessionLease.start(etcd, ttl_s)
        except MetadataError as exc:
            failures += 1
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(level, "etcd session: no new session yet (%s); trying every %g s", exc, retry_s)
            await asyncio.sleep(retry_s)


async def _register(
    session: SessionLease, register: Callable[[SessionLease], Awaitable[None]], retry_s: float
) -> bool:
    """True once registered on ``session``; False if the session was lost first."""
    failures = 0
    while not session.lost.is_set():
        try:
            await register(session)
            return True
        except LeaseLost:
            return False
        except MetadataError as exc:
            failures += 1
            level = logging.WARNING if failures == 1 else logging.DEBUG
            log.log(
                level,
                "etcd session %x: registering the broker failed (%s); trying every %g s",
                session.id,
                exc,
                retry_s,
            )
            await asyncio.sleep(retry_s)
    return False
