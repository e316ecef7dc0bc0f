"""The broker's one etcd session lease and the task that keeps it alive.

Every ownership key a broker writes (partition and group leases, its registration) is bound to
this lease, so ownership ends with the broker: at once on ``revoke()`` (a graceful handoff), or
within one TTL after a crash. ``lost`` tells the broker to stop acting as owner (DESIGN §3.3,
§3.4). Apart from the client (:mod:`etcd`) because it is a long-lived task with its own timing
rules, not a call.
"""

from __future__ import annotations

import asyncio
import logging

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)


class SessionLease:
    """The broker's one session lease, kept alive every TTL/3 by a task this object owns.

    Every ownership key (partition and group leases, the broker registration) is bound to it,
    so a broker that dies loses everything within one TTL, and ``revoke()`` hands everything
    over at once. ``lost`` is set when etcd says the lease is gone, or when no keepalive has
    succeeded for a whole TTL (measured from when the last good one was sent, so it errs on
    the early side): from then on the broker must not act as owner. A lost lease is not
    renewed; start a new session. ``revoke()`` is a deliberate release and does not set ``lost``.
    """

    def __init__(self, etcd: Etcd, lease_id: int, ttl_s: int, valid_until: float = 0.0) -> None:
        self._etcd = etcd
        self._id = lease_id
        self._ttl_s = ttl_s
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._valid_until = valid_until
        """Loop time until which etcd holds the lease at least (the last good keepalive's
        send time + its TTL)."""

    @classmethod
    async def start(cls, etcd: Etcd, ttl_s: int) -> SessionLease:
        loop = asyncio.get_running_loop()
        granted_at = loop.time()
        session = cls(etcd, await etcd.grant_lease(ttl_s), ttl_s, granted_at + ttl_s)
        session._task = start_task(session._keep_alive(), name=f"session-lease-{session.id:x}")
        return session

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def still_valid(self) -> bool:
        """Whether the broker may act as owner at this moment. ``lost`` is set by the keepalive
        task's own timer; a process woken from a freeze longer than the TTL (SIGSTOP, a stalled
        VM) runs its other timers and requests in the same loop turn as that one, before the
        event reaches anyone, so a group coordinator expired members and answered JoinGroups
        with a generation for groups whose lease etcd had already deleted. An owner about to
        act asks here first; a lease past its TTL is marked lost now."""
        if self._task is not None and asyncio.get_running_loop().time() >= self._valid_until:
            self._mark_lost(f"no keepalive succeeded for {self._ttl_s} s")
        return not self.lost.is_set()

    async def revoke(self) -> None:
        """Stop the keepalive and revoke: every key bound to the lease is deleted at once."""
        await self._stop_keepalive()
        await self._etcd.revoke_lease(self._id)

    async def close(self) -> None:
        """Stop the keepalive; the lease then expires within its TTL."""
        await self._stop_keepalive()

    async def _stop_keepalive(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl_s / 3
        retry = min(interval, 0.5)
        delay = interval
        retries = RetryLog(log, f"session lease {self._id:x} keepalive failed")
        try:
            while True:
                await asyncio.sleep(max(0.0, min(delay, self._valid_until - loop.time())))
                if not self.still_valid():
                    return
                sent_at = loop.time()
                try:
                    async with asyncio.timeout(self._valid_until - sent_at):
                        ttl = await self._etcd.refresh_lease(self._id)
                except LeaseLost as error:
                    self._mark_lost(str(error))
                    return
                except (MetadataError, TimeoutError) as error:
                    retries.failed(error)
                    delay = retry
                    continue
                retries.succeeded()
                self._valid_until, delay = sent_at + ttl, interval
        except Exception:
            log.exception("session lease %x keepalive crashed", self._id)
            self._mark_lost("keepalive crashed")

    def _mark_lost(self, reason: str) -> None:
        if self.lost.is_set():
            return  # told once
        log.error("session lease %x lost: %s", self._id, reason)
        self.lost.set()
