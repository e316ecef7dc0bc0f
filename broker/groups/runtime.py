"""The async shell around one coordinated group: waiting requests, timers, etcd writes.

The state machine (``group.Group``) decides; this class turns its answers into awaited
responses (one future per waiting JoinGroup/SyncGroup, keyed by ticket), runs its deadlines
(session expiry, rebalance and initial-delay timeouts) from one timer task, and performs its
``Store`` effects in order from one writer task. The group's committed offsets are kept by
``offsets.GroupOffsets`` (cached after each fenced commit, so OffsetFetch never reads etcd);
this class decides whether a member may touch them.

A failed fence (the lease is no longer ours) calls ``on_lost``: the coordinator then unloads
the group and every waiting member is told NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping

from kafscale.broker.groups import group_configs, migration, offset_delete
from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.consumer import (
    ConsumerConfig,
    ConsumerGroup,
    HeartbeatRequest,
    HeartbeatResult,
)
from kafscale.broker.groups.consumer_codec import Document, restore, snapshot
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    UNKNOWN_MEMBER_ID,
    AssignmentStore,
    ConsumerStore,
    Effect,
    EmptyStore,
    EmptyTimeStore,
    GroupConfig,
    GroupDescription,
    GroupRecord,
    GroupState,
    JoinRequest,
    JoinResult,
    Pending,
    Reply,
    Store,
    SyncRequest,
    SyncResult,
)
from kafscale.broker.groups.offsets import GroupOffsets
from kafscale.broker.groups.retention_runtime import RetentionRuntime, wall_clock_ms
from kafscale.broker.groups.share import ShareGroup
from kafscale.broker.groups.share_codec import restore as restore_share
from kafscale.broker.groups.share_codec import snapshot as snapshot_share
from kafscale.broker.groups.share_runtime import ShareRuntime
from kafscale.broker.groups.store import (
    CommittedOffset,
    Fence,
    GroupStore,
    LoadedGroup,
    TopicPartition,
)
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.observability.log_limit import ClientEvent, client_log, named
from kafscale.broker.protocol.errors import ErrorCode, NotCoordinator
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)

Clock = Callable[[], int]

_LEASE_GONE_POLL_S = 0.1
"""How often the timers of a group whose session ran out look again until it is dropped."""


def loop_clock_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


class GroupRuntime(ShareRuntime, RetentionRuntime):
    def __init__(
        self,
        group_id: str,
        fence: Fence,
        store: GroupStore,
        config: GroupConfig,
        loaded: LoadedGroup,
        on_lost: Callable[[GroupRuntime, str], None],
        clock: Clock = loop_clock_ms,
        own_configs: Callable[[], Mapping[str, str]] = dict,
        wall_clock: Clock = wall_clock_ms,
        session_valid: Callable[[], bool] = lambda: True,
        sessions_since_ms: int | None = None,
    ) -> None:
        """``own_configs``: the group's own configs now (KIP-848 group configs, kept current
        by the cluster view's watch); they override the broker's consumer-protocol settings.
        ``wall_clock``: the clock of commit timestamps, which offset retention compares.
        ``session_valid``: whether the etcd session holding the group's lease is still valid
        (``SessionLease.still_valid``), asked before the timers act. ``sessions_since_ms``:
        when the last coordinator's lease went (``clock`` time), where the loaded members'
        sessions run from (``Group.from_record``)."""
        self.group_id = group_id
        self._own_configs = own_configs
        self.fence = fence
        self._store = store
        self._config = config
        self._on_lost = on_lost
        self._clock = clock
        self._session_valid = session_valid
        now = clock()
        self.group: Group | None = None
        """The group while it is a classic one (at most one of ``group`` and ``consumer``)."""
        self.consumer: ConsumerGroup | None = None
        """The group while it is a consumer-protocol (KIP-848) one."""
        self._consumer_doc: Document | None = None
        """The last snapshot of ``consumer`` queued for etcd (None after a write failed: the
        next one goes to etcd whatever it holds)."""
        self._consumer_version = 0
        self.share: ShareGroup | None = None
        """The group while it is a share group (KIP-932; ``group`` and ``consumer`` are None)."""
        self._share_doc: Document | None = None
        self._consumer_waiters: dict[int, asyncio.Future[ErrorCode]] = {}
        if loaded.record is not None and loaded.record.group_type == "consumer":
            document = dict(loaded.record.consumer or {})
            self.consumer = restore(group_id, document, self._consumer_config(), now)
            self._consumer_doc = snapshot(self.consumer)
        elif loaded.record is not None and loaded.record.group_type == "share":
            document = dict(loaded.record.consumer or {})
            self.share = restore_share(group_id, document, self._share_config(), now)
            self._share_doc = snapshot_share(self.share)
        elif loaded.record is not None:
            self.group = Group.from_record(group_id, config, loaded.record, now, sessions_since_ms)
        elif loaded.offsets or loaded.pending:
            # A group that only committed offsets (pending in an open transaction, too):
            # Kafka replays its offset records into an empty classic group.
            self.group = Group(group_id, config, now)
        self._share_stored: Document | None = self._share_doc
        """The share group's document etcd last took (``_share_store_done``)."""
        self.closed = False
        self._offsets = GroupOffsets(
            group_id, fence, store, loaded, lambda: self.closed, self._lose
        )
        self._start_retention(loaded, wall_clock)
        self._waiters: dict[int, asyncio.Future[JoinResult | SyncResult]] = {}
        self._wake = asyncio.Event()
        self._stores: asyncio.Queue[Store] = asyncio.Queue()
        self._storing = False
        """A metadata write taken off ``_stores`` and not answered by etcd yet."""
        self._tasks = [
            start_task(self._run_timers(), name=f"group-timers-{group_id}"),
            start_task(self._run_stores(), name=f"group-stores-{group_id}"),
        ]

    @property
    def offsets(self) -> Mapping[TopicPartition, CommittedOffset]:
        """The committed offsets as this coordinator holds them (read-only: writes go through
        ``commit``, ``delete_offsets`` and the transaction path)."""
        return self._offsets.cache

    def generation_text(self) -> str:
        """Where the group stands, for a log line: a classic group's generation, a consumer
        or share group's epoch and member count."""
        for kind, modern in (("consumer", self.consumer), ("share", self.share)):
            if modern is not None:
                return f"{kind} group epoch {modern.group_epoch}, {len(modern.members)} members"
        if self.group is not None:
            return f"generation {self.group.generation}"
        return "no group record"

    @property
    def state(self) -> GroupState | None:
        """None: the group does not exist (nothing in etcd, nobody joined)."""
        return None if self.group is None else self.group.state

    # --- membership ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        """A runtime dropped after it was handed out must not take new work."""
        if self.closed:
            raise NotCoordinator(f"this broker no longer coordinates group {self.group_id!r}")

    def _consumer_config(self) -> ConsumerConfig:
        broker = ConsumerConfig(
            session_timeout_ms=self._config.consumer_session_timeout_ms,
            heartbeat_interval_ms=self._config.consumer_heartbeat_interval_ms,
            max_size=self._config.consumer_max_size,
        )
        return group_configs.consumer_config(broker, self._own_configs())

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

    # --- the consumer protocol (KIP-848) -------------------------------------------------------

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

    def describe(self) -> GroupDescription:
        self._check_open()
        if self.share is not None:
            return GroupDescription(GroupState.DEAD, "share", "", ())
        if self.consumer is not None:
            return GroupDescription(GroupState.DEAD, "consumer", "", ())
        if self.group is None:
            return GroupDescription(GroupState.DEAD, "", "", ())
        return self.group.describe()

    # --- offsets ------------------------------------------------------------------------------

    async def commit(
        self,
        member_id: str,
        group_instance_id: str | None,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
        version: int = 8,
    ) -> ErrorCode:
        if self.closed:
            return ErrorCode.NOT_COORDINATOR
        if self.share is not None:
            return ErrorCode.GROUP_ID_NOT_FOUND  # a share group has no committed offsets
        if self.consumer is not None:
            error = self.consumer.validate_commit(member_id, generation, version)
            if error is not ErrorCode.NONE or not offsets:
                return error
            return await self._offsets.save(offsets)
        group = self.group
        if group is None:
            if generation >= 0:
                return ErrorCode.ILLEGAL_GENERATION  # not a group we know: an old generation
            group = self.group = Group(self.group_id, self._config, self._clock())
        error = group.validate_commit(self._clock(), member_id, group_instance_id, generation)
        self._apply(group.take_effects())
        if error is not ErrorCode.NONE or not offsets:
            return error
        return await self._offsets.save(offsets)

    async def delete_offsets(
        self, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition answers), decided (``offset_delete``) on
        the group as it is once no commit is in flight (``GroupOffsets.delete``)."""
        return await self._offsets.delete(
            partitions,
            lambda: offset_delete.decide(self.group, self.consumer, {t for t, _ in partitions}),
        )

    def validate_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: a consumer-protocol member must name its current epoch."""
        if self.consumer is None:
            return ErrorCode.NONE
        return self.consumer.validate_fetch(member_id, member_epoch)

    def validate_txn_commit(
        self, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        """TxnOffsetCommit's member check (KIP-447): only when it names a generation (for a
        consumer-protocol group, the member's epoch; a stale one is ILLEGAL_GENERATION, the code
        TxnOffsetCommit clients know)."""
        if self.closed:
            return ErrorCode.NOT_COORDINATOR
        if self.consumer is not None:
            error = self.consumer.validate_fetch(member_id or None, generation)
            return ErrorCode.ILLEGAL_GENERATION if error is ErrorCode.STALE_MEMBER_EPOCH else error
        if self.group is None and self.share is None:
            # Kafka's ``validateTransactionalOffsetCommit``: a group nobody joined takes
            # offsets from a producer outside group management (generation -1) only; a
            # generation names a group that is not there.
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if generation < 0 or self.group is None:
            return ErrorCode.NONE
        error = self.group.validate_commit(self._clock(), member_id, group_instance_id, generation)
        self._apply(self.group.take_effects())
        return error

    async def add_pending(
        self,
        offsets: Mapping[TopicPartition, CommittedOffset],
        write: Callable[[], Awaitable[ErrorCode]],
    ) -> ErrorCode:
        """TxnOffsetCommit's write (``GroupOffsets.add_pending``). A group nobody joined
        becomes an empty classic group once its pending offsets are written, as Kafka's
        ``validateTransactionalOffsetCommit`` creates one: OffsetDelete, DescribeGroups and
        ListGroups find it before the transaction ends."""
        error = await self._offsets.add_pending(offsets, write)
        if error is ErrorCode.NONE and offsets and self._groupless():
            self.group = Group(self.group_id, self._config, self._clock())
        return error

    def _groupless(self) -> bool:
        return self.group is None and self.consumer is None and self.share is None

    def is_unused(self) -> bool:
        """No group of any type has this id yet (nothing but, perhaps, offsets)."""
        return self._groupless()

    def _memberless(self) -> bool:
        if self.share is not None:
            return False  # share groups keep their own record locks: not let go here
        if self.consumer is not None:
            return self.consumer.is_empty()
        group = self.group
        return group is None or (
            group.state is GroupState.EMPTY and not group.members and not group.pending_members
        )

    def vacant(self) -> bool:
        """Nothing here that etcd does not hold: no member (none waiting for its id either),
        nothing committed or pending, no request waiting, no write queued or on its way. A
        coordinator lets such a runtime go (``GroupCoordinator``): a group nobody created, or an
        empty one without offsets (Kafka deletes those), is reloaded from etcd if asked for
        again. Letting go cancels the writer: a write still on its way (the Empty generation
        after the last member's session ran out, say) might then never be stored."""
        return self._memberless() and self._offsets.holds_nothing() and not self._busy()

    def _busy(self) -> bool:
        """A request waits on the group, or a metadata write is queued or on its way."""
        return bool(
            self._waiters or self._consumer_waiters or not self._stores.empty() or self._storing
        )

    async def settle_pending(self, partitions: list[TopicPartition] | None) -> set[TopicPartition]:
        """The requested partitions whose offsets are still pending in a transaction, after a
        re-read (``GroupOffsets.settle_pending``). Offsets found for a group nobody joined make
        it a group (one that only ever committed offsets)."""
        still_pending, loaded = await self._offsets.settle_pending(partitions)
        if loaded is not None and loaded.offsets and self.group is None and self.consumer is None:
            self.group = Group(self.group_id, self._config, self._clock())
        return still_pending

    def committed(
        self, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of ``partitions`` (None when nothing is committed), or all."""
        self._check_open()
        return self._offsets.committed(partitions)

    async def delete(self) -> ErrorCode:
        """DeleteGroups: an Empty group's metadata, offsets and lease go."""
        self._check_open()
        if self.share is not None:
            if not self.share.is_empty():
                return ErrorCode.NON_EMPTY_GROUP
        elif self.consumer is not None:
            if not self.consumer.is_empty():
                return ErrorCode.NON_EMPTY_GROUP
        elif self.group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        else:
            error = self.group.delete()
            if error is not ErrorCode.NONE:
                return error
        error = await self._offsets.delete_group()
        self._lose("group deleted" if error is ErrorCode.NONE else "group deletion failed")
        return error

    # --- lifecycle ----------------------------------------------------------------------------

    def unload(self) -> list[asyncio.Task[None]]:
        """Stop coordinating: waiters get NOT_COORDINATOR; returns the tasks to await."""
        if self.closed:
            return []
        self.closed = True
        if self.group is not None:
            self.group.unload()
            self._apply(self.group.take_effects())
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(NotCoordinator(f"group {self.group_id} moved"))
        for stored in self._consumer_waiters.values():
            if not stored.done():
                stored.set_result(ErrorCode.NOT_COORDINATOR)
        self._consumer_waiters.clear()
        tasks = self._tasks
        current = asyncio.current_task()
        for task in tasks:
            if task is not current:
                task.cancel()
        return [t for t in tasks if t is not current]

    def _lose(self, reason: str) -> None:
        if not self.closed:
            self._on_lost(self, reason)

    # --- plumbing -----------------------------------------------------------------------------

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
                # Woken from a freeze past the session's TTL: the lease is gone, so no member
                # expires and no rebalance completes here; the coordinator drops the group.
                await asyncio.sleep(_LEASE_GONE_POLL_S)
                continue
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

    async def _run_stores(self) -> None:
        while True:
            store = await self._stores.get()
            self._storing = True  # off the queue, not in etcd yet: ``vacant`` counts it
            try:
                error = await self._write(store)
            finally:
                self._storing = False
            if error is None:
                return  # fenced: the group is being let go, its waiters told NOT_COORDINATOR
            if isinstance(store.token, EmptyTimeStore):
                continue
            if isinstance(store.token, ConsumerStore):
                if store.record.group_type == "share":
                    document = dict(store.record.consumer or {})
                    self._share_store_done(store.token.version, document, error)
                self._consumer_stored(store.token.version, error)
                continue
            if self.group is not None and not self.closed:
                self.group.stored(self._clock(), store.token, error)
                self._apply(self.group.take_effects())
                self._log_stored(store, error)

    async def _write(self, store: Store) -> ErrorCode | None:
        """Write one group record to etcd: the outcome the waiting members are told (None: the
        lease is no longer ours, and the group is let go). Every failure is an answer and the
        writer goes on: one that ended it (etcd refusing a record over its request size limit
        with "request is too large") left the SyncGroup waiting on the write, and every later
        rebalance's, unanswered for good while the group stayed coordinated here. A refused
        record gets UNKNOWN_SERVER_ERROR, as Kafka answers a group record too large for its
        log; etcd out of reach, COORDINATOR_NOT_AVAILABLE (clients retry)."""
        try:
            record = self._stamped(store.record)
            stored = await self._store.save_group(self.group_id, record, self.fence)
        except MetadataUnavailable as exc:
            log.warning("storing group %s: %s", self.group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        except Exception as exc:  # etcd refused the write, or a bug: answered either way
            client_log(
                log, logging.ERROR, ClientEvent.INTERNAL_ERROR, named("group", self.group_id),
                "storing group %s failed: %s", self.group_id, exc,
                exc_info=not isinstance(exc, MetadataError),
            )  # fmt: skip
            return ErrorCode.UNKNOWN_SERVER_ERROR
        if not stored:
            self._lose("group metadata write fenced: the group lease is no longer ours")
            return None
        self._stored_record = record
        return ErrorCode.NONE

    def _log_stored(self, store: Store, error: ErrorCode) -> None:
        record = store.record
        if error is not ErrorCode.NONE:
            log.warning("group %s: generation %d not stored", self.group_id, record.generation)
        elif isinstance(store.token, AssignmentStore):
            log_group_change(
                log,
                self.group_id,
                "group %s: generation %d stable, %d members, protocol %s, leader %s",
                self.group_id,
                record.generation,
                len(record.members),
                record.protocol_name,
                record.leader,
            )
        elif isinstance(store.token, EmptyStore):
            log_group_change(
                log,
                self.group_id,
                "group %s: generation %d empty",
                self.group_id,
                record.generation,
            )
        else:
            log_group_change(
                log, self.group_id, "group %s: static member rejoined, no rebalance", self.group_id
            )
