"""The consumer protocol (KIP-848) in a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. This mixin turns
ConsumerGroupHeartbeat into decisions of the pure ``consumer.ConsumerGroup``, moves a group
between the two protocols (``migration``: a classic group with members upgraded in place, a
consumer group left with classic members only downgraded), and queues the group's snapshot
for etcd on the runtime's single writer. Each queued snapshot gets a version number and a
future; a heartbeat that changed the group is answered once its version is in etcd (a new
coordinator must know who holds what). The runtime owns the attributes declared below.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from kafscale.broker.groups import group_configs, migration
from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.consumer import (
    ConsumerConfig,
    ConsumerGroup,
    HeartbeatRequest,
    HeartbeatResult,
)
from kafscale.broker.groups.consumer_codec import Document, snapshot
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    ConsumerStore,
    GroupRecord,
    GroupState,
    JoinResult,
    Store,
    SyncResult,
)
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.protocol.errors import ErrorCode, NotCoordinator

# The logger these lines had before ``runtime`` was split: a log line's ``logger`` field is
# output operators filter on (docs/monitoring.md), so the split leaves it as it was.
log = logging.getLogger("kafscale.broker.groups.runtime")


class ConsumerRuntime(RuntimeState):
    """Consumer protocol methods of ``GroupRuntime`` (which sets every attribute named here)."""

    _own_configs: Callable[[], Mapping[str, str]]
    _consumer_doc: Document | None
    _consumer_version: int
    _consumer_waiters: dict[int, asyncio.Future[ErrorCode]]
    _waiters: dict[int, asyncio.Future[JoinResult | SyncResult]]

    def _consumer_config(self) -> ConsumerConfig:
        broker = ConsumerConfig(
            session_timeout_ms=self._config.consumer_session_timeout_ms,
            heartbeat_interval_ms=self._config.consumer_heartbeat_interval_ms,
            max_size=self._config.consumer_max_size,
        )
        return group_configs.consumer_config(broker, self._own_configs())

    async def consumer_heartbeat(
        self, request: HeartbeatRequest, topics: dict[str, int]
    ) -> HeartbeatResult:
        """ConsumerGroupHeartbeat. An Empty classic group (or one with only offsets) becomes
        a consumer group; one with members is upgraded in place (``migration``), or refused
        with GROUP_ID_NOT_FOUND where Kafka cannot upgrade it. A heartbeat that changed the
        group is answered once the change is in etcd (a new coordinator must know who holds
        what)."""
        self._check_open()
        if self.share is not None:
            message = f"group {self.group_id} is not a consumer group"
            return HeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, message)
        consumer = self.consumer
        if consumer is None and request.member_epoch != 0:
            # Not a member of anything here (Kafka: GROUP_ID_NOT_FOUND); UNKNOWN_MEMBER_ID
            # makes every client rejoin, and nothing is converted for a stray heartbeat.
            message = f"member {request.member_id} is not in group {self.group_id}"
            return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, message)
        if consumer is None:
            group = self.group
            if group is not None and group.state not in (GroupState.EMPTY, GroupState.DEAD):
                refusal = migration.upgrade_refusal(group, self._consumer_config())
                if refusal is not None:
                    return HeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, refusal)
                # Upgrade only if the member's join succeeds (it may be refused, e.g. with
                # UNRELEASED_INSTANCE_ID): a refused join leaves the classic group as it was.
                upgraded = migration.consumer_group_from_classic(
                    group, self._consumer_config(), self._clock()
                )
                result = upgraded.heartbeat(self._clock(), request, topics)
                if result.error is not ErrorCode.NONE:
                    return result
                self._upgrade(group, upgraded)
                return await self._answer_stored(upgraded, result)
            epoch = group.generation if group is not None else 0
            consumer = ConsumerGroup(self.group_id, self._consumer_config(), epoch)
            self.consumer = consumer
            self.group = None
        # The group's own configs may have changed since the last heartbeat: the member's
        # session and the interval answered follow them from this heartbeat on.
        consumer.config = self._consumer_config()
        return await self._answer_stored(
            consumer, consumer.heartbeat(self._clock(), request, topics)
        )

    async def _answer_stored(
        self, consumer: ConsumerGroup, result: HeartbeatResult
    ) -> HeartbeatResult:
        """``result`` once the group's change (if any) is in etcd."""
        stored = self._queue_consumer(consumer)
        self._maybe_downgrade()
        if stored is None:
            return result
        error = await self._await_stored(stored)
        return result if error is ErrorCode.NONE else HeartbeatResult(error)

    async def _store_consumer(self, consumer: ConsumerGroup) -> ErrorCode:
        """Queue the consumer group's state if it changed and wait for the write."""
        stored = self._queue_consumer(consumer)
        return ErrorCode.NONE if stored is None else await self._await_stored(stored)

    @staticmethod
    async def _await_stored(stored: asyncio.Future[ErrorCode]) -> ErrorCode:
        try:
            return await asyncio.shield(stored)
        except NotCoordinator:
            return ErrorCode.NOT_COORDINATOR

    # --- moving between the protocols (``migration``) -----------------------------------------

    def _upgrade(self, group: Group, consumer: ConsumerGroup) -> None:
        """A classic group with members becomes ``consumer`` (online migration). Classic
        members waiting in a rebalance are told to rejoin, which they do into the new group."""
        for member in group.members.values():
            for ticket, result in (
                (member.join_ticket, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id)),
                (member.sync_ticket, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)),
            ):
                future = self._waiters.get(ticket) if ticket is not None else None
                if future is not None and not future.done():
                    future.set_result(result)
        log_group_change(
            log,
            self.group_id,
            "group %s: classic group of %d members upgraded to the consumer protocol",
            self.group_id,
            len(consumer.members),
        )
        self.consumer, self.group = consumer, None

    def _maybe_downgrade(self) -> None:
        """Only classic members left in a consumer group: it becomes a classic group again."""
        consumer = self.consumer
        if (
            consumer is None
            or self.closed
            or not migration.should_downgrade(consumer, self._config.max_size)
        ):
            return
        group = migration.classic_group_from_consumer(consumer, self._config, self._clock())
        log_group_change(
            log,
            self.group_id,
            "group %s: last consumer-protocol member gone, back to a classic group of %d",
            self.group_id,
            len(group.members),
        )
        self.group, self.consumer, self._consumer_doc = group, None, None
        self._apply(group.take_effects())

    # --- the group's snapshot in etcd -----------------------------------------------------------

    def _queue_consumer(self, consumer: ConsumerGroup) -> asyncio.Future[ErrorCode] | None:
        """Queue the group's state for etcd if it changed: the future of that write. Unchanged
        since a write still on its way: that write's future (an answer from this state waits
        for it, as the answer of the change did: a member's retry may not learn early what
        etcd may yet lack)."""
        self._wake.set()
        self._note_members()
        document = snapshot(consumer)
        if self.closed:
            return None
        if document == self._consumer_doc:
            return self._consumer_waiters.get(self._consumer_version)
        self._consumer_doc = document
        self._consumer_version += 1
        record = GroupRecord(
            "consumer", consumer.group_epoch, None, None, group_type="consumer", consumer=document
        )
        self._stores.put_nowait(Store(ConsumerStore(self._consumer_version), record))
        future = asyncio.get_running_loop().create_future()
        self._consumer_waiters[self._consumer_version] = future
        return future

    def _consumer_stored(self, version: int, error: ErrorCode) -> None:
        if error and self.share is not None and version < self._consumer_version:
            return  # a later write carries this change too: its waiters get that outcome
        if error and self.consumer is not None and version == self._consumer_version:
            # Not in etcd, and no later write carries it: the next answer must write the
            # group first, changed or not. Otherwise a member retrying after this error would
            # be told (from memory) partitions etcd does not give it, and a new coordinator
            # would hand them to someone else while it consumes them. The member never heard
            # the assignment this write was for: its next heartbeat carries it again.
            self._consumer_doc = None
            self.consumer.resend_assignments()
        for waiting in [v for v in self._consumer_waiters if v <= version]:
            future = self._consumer_waiters.pop(waiting)
            if not future.done():
                future.set_result(error)
