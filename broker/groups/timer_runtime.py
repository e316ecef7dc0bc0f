"""The timer task of a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. One task per group
sleeps until the next deadline the group's state machine names (classic: session expiry,
the initial rebalance delay, the rebalance timeout; consumer protocol and share groups:
session expiry) or until something wakes it (``_wake``: a request changed the group, so the
deadline may have moved), then lets the state machine act on the time. The machines keep no
clock of their own: each deadline is a number this task compares with ``_clock``. The
runtime owns the attributes declared below.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.groups.session_resume import resumption_to_apply
from kafscale.broker.protocol.errors import ErrorCode

# The logger these lines had before ``runtime`` was split: a log line's ``logger`` field is
# output operators filter on (docs/monitoring.md), so the split leaves it as it was.
log = logging.getLogger("kafscale.broker.groups.runtime")

_LEASE_GONE_POLL_S = 0.1
"""How often the timers of a group whose session is not valid look again (until it is dropped,
or the session resumes)."""


class TimerRuntime(RuntimeState):
    """The timer task of ``GroupRuntime`` (which sets every attribute named here)."""

    _session_valid: Callable[[], bool]
    _session_resumed_ms: Callable[[], int | None]
    """When the session last resumed (``SessionLease.resumed_at_ms``, in ``_clock`` time)."""
    _resumption_applied_ms: int | None
    """The resumption the members' timers were last moved for (``session_resume``)."""

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        def _queue_consumer(self, consumer: ConsumerGroup) -> asyncio.Future[ErrorCode] | None: ...

        def _maybe_downgrade(self) -> None: ...

        def _tick_share(self) -> None: ...

    def _catch_up_resumption(self) -> None:
        """Move the members' timers for a session resumption they were not moved for yet:
        asked at each timer step and each request, so a suspension reaches the group whether
        or not its timers woke during it (``session_resume``)."""
        resumed_ms = self._session_resumed_ms()
        from_ms = resumption_to_apply(self._resumption_applied_ms, resumed_ms, self._clock())
        if from_ms is None:
            return
        self._resumption_applied_ms = resumed_ms
        if self.closed:
            return
        machines = [m for m in (self.group, self.consumer, self.share) if m is not None]
        for machine in machines:
            machine.resume_sessions(from_ms)
        if not any(machine.members for machine in machines):
            return  # told for the groups with members only: a broker may hold many without
        log.info(
            "group %s: coordinating again; members' sessions (and a rebalance's wait for them)"
            " run from the session's resumption, %d ms ago",
            self.group_id,
            self._clock() - from_ms,
        )

    async def _run_timers(self) -> None:
        while True:
            group = self.group
            deadline = None if group is None else group.next_deadline_ms()
            if self.consumer is not None:
                deadline = self.consumer.next_deadline_ms()
            if self.share is not None:
                deadline = self.share.next_deadline_ms()
            self._wake.clear()
            if deadline is None:
                await self._wake.wait()
            else:
                delay_s = max(deadline - self._clock(), 0) / 1000
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await self._wake.wait()
            if not self._session_valid():
                # Suspended, or woken from a freeze past the session's TTL (the lease is gone):
                # no member expires and no rebalance completes here. A lost session drops the
                # group; a resumed one runs on, its members given a whole session again.
                await asyncio.sleep(_LEASE_GONE_POLL_S)
                continue
            self._catch_up_resumption()
            consumer = self.consumer
            if consumer is not None and not self.closed:
                expired = consumer.tick(self._clock())
                if expired:
                    log_group_change(
                        log, self.group_id, "group %s: members expired: %s", self.group_id,
                        ", ".join(expired),
                    )  # fmt: skip
                self._queue_consumer(consumer)
                self._maybe_downgrade()
            self._tick_share()
            if self.group is not None and not self.closed:
                try:
                    self.group.tick(self._clock())
                    self._apply(self.group.take_effects())
                except Exception:
                    log.exception("group %s: timer failed", self.group_id)
                    await asyncio.sleep(0.1)
