"""The classic group protocol in a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. This mixin turns
JoinGroup, SyncGroup, Heartbeat and LeaveGroup into calls of the pure state machine
(``group.Group``) and its answers into awaited responses: a join or sync the machine parks
(``Pending``) waits on a future keyed by its ticket, and the machine's effects either answer
such a future (``Reply``) or go to the runtime's single etcd writer (``Store``). A classic
member of a consumer-protocol group (online migration) is answered by ``migration`` instead.
The runtime owns the attributes declared below.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kafscale.broker.groups import migration
from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.consumer_codec import Document
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    UNKNOWN_MEMBER_ID,
    Effect,
    GroupState,
    JoinRequest,
    JoinResult,
    Pending,
    Reply,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.protocol.errors import ErrorCode


class ClassicRuntime(RuntimeState):
    """Classic protocol methods of ``GroupRuntime`` (which sets every attribute named here)."""

    _consumer_doc: Document | None
    _waiters: dict[int, asyncio.Future[JoinResult | SyncResult]]
    """The parked JoinGroup/SyncGroup calls, by ticket."""

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        async def _store_consumer(self, consumer: ConsumerGroup) -> ErrorCode: ...

        def _queue_consumer(self, consumer: ConsumerGroup) -> asyncio.Future[ErrorCode] | None: ...

        def _maybe_downgrade(self) -> None: ...

    async def join(
        self, request: JoinRequest, topics: Mapping[str, int] | None = None
    ) -> JoinResult:
        """JoinGroup. ``topics``: every topic's partition count (for a consumer group, whose
        assignor runs here)."""
        self._check_open()
        if self.share is not None:
            return JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        if self.consumer is not None:
            if not self.consumer.is_empty():
                # A classic member inside a consumer group (online migration).
                joined = migration.join(self.consumer, self._clock(), request, topics or {})
                error = await self._store_consumer(self.consumer)
                return joined if error is ErrorCode.NONE else JoinResult(error, request.member_id)
            self.consumer = None  # an empty consumer group becomes a classic one
            self._consumer_doc = None
        group = self.group
        if group is None:
            if request.member_id != UNKNOWN_MEMBER_ID:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, request.member_id)
            if not self._config.session_timeout_ok(request.session_timeout_ms):
                return JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, request.member_id)
            group = self.group = Group(self.group_id, self._config, self._clock())
        result = await self._settle(group, group.join(self._clock(), request))
        assert isinstance(result, JoinResult)
        return result

    async def sync(self, request: SyncRequest) -> SyncResult:
        self._check_open()
        if self.consumer is not None:
            return migration.sync(self.consumer, self._clock(), request)
        if self.group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        result = await self._settle(self.group, self.group.sync(self._clock(), request))
        assert isinstance(result, SyncResult)
        return result

    def heartbeat(
        self, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        self._check_open()
        if self.consumer is not None:
            error = migration.heartbeat(
                self.consumer, self._clock(), member_id, group_instance_id, generation
            )
            self._wake.set()
            return error
        if self.group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = self.group.heartbeat(self._clock(), member_id, group_instance_id, generation)
        self._apply(self.group.take_effects())
        return error

    def leave(self, members: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """(group error, per-member errors)."""
        self._check_open()
        if self.consumer is not None:
            errors = migration.leave(self.consumer, members)
            self._queue_consumer(self.consumer)
            self._maybe_downgrade()
            return ErrorCode.NONE, errors
        if self.group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        if self.group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        errors = self.group.leave(self._clock(), members)
        self._apply(self.group.take_effects())
        return ErrorCode.NONE, errors

    # --- effects of the state machine ---------------------------------------------------------

    async def _settle(
        self, group: Group, outcome: JoinResult | SyncResult | Pending
    ) -> JoinResult | SyncResult:
        """Register the waiter (if any) before applying effects: they may already answer it."""
        future: asyncio.Future[JoinResult | SyncResult] | None = None
        if isinstance(outcome, Pending):
            future = asyncio.get_running_loop().create_future()
            self._waiters[outcome.ticket] = future
        self._apply(group.take_effects())
        if future is None:
            assert not isinstance(outcome, Pending)
            return outcome
        assert isinstance(outcome, Pending)
        try:
            return await future
        finally:
            self._waiters.pop(outcome.ticket, None)

    def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Reply):
                future = self._waiters.get(effect.ticket)
                if future is not None and not future.done():
                    future.set_result(effect.result)
            elif not self.closed:
                self._stores.put_nowait(effect)
        self._wake.set()
        self._note_members()
