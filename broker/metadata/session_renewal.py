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
from kafscale.broker.metadata.session_lease import SessionCounts, SessionLease
from kafscale.broker.observability.retry_log import RetryLog

log = logging.getLogger(__name__)

RETRY_S = 1.0


async def renew_session(
    etcd: Etcd,
    ttl_s: int,
    adopt: Callable[[SessionLease], None],
    register: Callable[[SessionLease], Awaitable[None]],
    retry_s: float = RETRY_S,
    counts: SessionCounts | None = None,
) -> SessionLease:
    """A new session, handed to ``adopt`` (the broker acts on it from then on) and then to
    ``register`` (the broker's registration bound to it), both retried every ``retry_s``
    until they succeed. A session lost before its registration landed is closed and replaced.
    ``counts``: the broker's suspensions and resumptions so far, counted on by the new one."""
    while True:
        session = await _new_session(etcd, ttl_s, retry_s, counts)
        adopt(session)
        if await _register(session, register, retry_s):
            return session
        log.warning("etcd session %x ended before the broker registered on it; another", session.id)
        await session.close()


async def _new_session(
    etcd: Etcd, ttl_s: int, retry_s: float, counts: SessionCounts | None
) -> SessionLease:
    retries = RetryLog(log, f"etcd session: no new session yet (trying every {retry_s:g} s)")
    while True:
        try:
            session = await SessionLease.start(etcd, ttl_s, counts)
        except MetadataError as exc:
            retries.failed(exc)
            await asyncio.sleep(retry_s)
            continue
        retries.succeeded()
        return session


async def _register(
    session: SessionLease, register: Callable[[SessionLease], Awaitable[None]], retry_s: float
) -> bool:
    """True once registered on ``session``; False if the session was lost first."""
    retries = RetryLog(
        log, f"etcd session {session.id:x}: registering the broker (trying every {retry_s:g} s)"
    )
    while not session.lost.is_set():
        try:
            await register(session)
        except LeaseLost:
            return False
        except MetadataError as exc:
            retries.failed(exc)
            await asyncio.sleep(retry_s)
            continue
        retries.succeeded()
        return True
    return False
