"""The async shell around one coordinated group: what it is, and its life on this broker.

The state machines decide (``group.Group`` for the classic protocol, ``consumer.ConsumerGroup``
for KIP-848, ``share.ShareGroup`` for KIP-932); ``GroupRuntime`` holds the one the group is
now (at most one of ``group``, ``consumer``, ``share``), turns requests into their calls and
their answers into awaited responses, and runs two tasks: a timer and a single etcd writer.
Each concern is a part of its own, mixed into ``GroupRuntime``:

* ``classic_runtime``: JoinGroup, SyncGroup, Heartbeat, LeaveGroup; parked joins and syncs
  answered by the machine's effects.
* ``consumer_runtime``: ConsumerGroupHeartbeat, moves between the protocols (``migration``),
  the consumer group's snapshots queued for etcd and their waiters.
* ``share_runtime``: ShareGroupHeartbeat and the share offset admin's empty-group check.
* ``offsets_runtime``: whether a request may commit, fetch or delete offsets (the offsets
  themselves are ``offsets.GroupOffsets``, cached after each fenced commit, so OffsetFetch at
  the coordinator never reads etcd).
* ``retention_runtime``: offset retention (KIP-211) and what letting an idle group go needs.
* ``timer_runtime``: the timer task (session expiry, rebalance and initial-delay timeouts).
* ``runtime_state``: the attributes and methods every part reads, declared once.
* ``writer_runtime``: the writer task, which performs every ``Store`` effect in order.

This module builds the runtime from what was loaded, answers what the group is (describe,
vacant, unused), deletes it, and stops it. A failed fence (the lease is no longer ours) calls
``on_lost``: the coordinator then unloads the group and every waiting member is told
NOT_COORDINATOR.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from kafscale.broker.groups.classic_runtime import ClassicRuntime
from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.consumer_codec import Document, restore, snapshot
from kafscale.broker.groups.consumer_runtime import ConsumerRuntime
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import (
    GroupConfig,
    GroupDescription,
    GroupState,
    JoinResult,
    Store,
    SyncResult,
)
from kafscale.broker.groups.offsets import GroupOffsets
from kafscale.broker.groups.offsets_runtime import OffsetsRuntime
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
from kafscale.broker.groups.timer_runtime import TimerRuntime
from kafscale.broker.groups.writer_runtime import WriterRuntime
from kafscale.broker.protocol.errors import ErrorCode, NotCoordinator
from kafscale.broker.task_stop import start_task

Clock = Callable[[], int]


def loop_clock_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


def sessions_start_ms(now_ms: int, sessions_since_ms: int | None) -> int:
    """Where a loaded group's member sessions (and a consumer group's pending revocations)
    run from: when the last coordinator's lease went, if this broker saw it go, else now.

    Kafka's new coordinator loads its groups at the failover and starts their members'
    session (and revocation) timers then (``GroupMetadataManager.onLoaded``). A group here is
    taken on at its first request, which may come long after the lease went (a member
    rediscovering the coordinator, one that gave up and rejoins): a session from the load gave
    a member that died with the old coordinator, and the partitions it holds, that much
    longer. A live member heard of no coordinator since the lease went either, so a session
    from then is what it would have had at Kafka's new coordinator."""
    return now_ms if sessions_since_ms is None else min(now_ms, sessions_since_ms)


class GroupRuntime(
    ClassicRuntime,
    ConsumerRuntime,
    ShareRuntime,
    OffsetsRuntime,
    RetentionRuntime,
    TimerRuntime,
    WriterRuntime,
):
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
        session_resumed_ms: Callable[[], int | None] = lambda: None,
    ) -> None:
        """``own_configs``: the group's own configs now (KIP-848 group configs, kept current
        by the cluster view's watch); they override the broker's consumer-protocol settings.
        ``wall_clock``: the clock of commit timestamps, which offset retention compares.
        ``session_valid``: whether the etcd session holding the group's lease is still valid
        (``SessionLease.still_valid``), asked before the timers act. ``sessions_since_ms``:
        when the last coordinator's lease went (``clock`` time), where the loaded members'
        sessions run from, whatever the group's protocol (``sessions_start_ms``).
        ``session_resumed_ms``: when that session last resumed after a suspension
        (``SessionLease.resumed_at_ms``, ``clock`` time): the members' timers are moved for
        each later one (``session_resume``)."""
        self.group_id = group_id
        self._own_configs = own_configs
        self.fence = fence
        self._store = store
        self._config = config
        self._on_lost = on_lost
        self._clock = clock
        self._session_valid = session_valid
        self._session_resumed_ms = session_resumed_ms
        self._resumption_applied_ms = session_resumed_ms()  # the members loaded after it
        now = clock()
        sessions_from = sessions_start_ms(now, sessions_since_ms)
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
            self.consumer = restore(group_id, document, self._consumer_config(), sessions_from)
            self._consumer_doc = snapshot(self.consumer)
        elif loaded.record is not None and loaded.record.group_type == "share":
            document = dict(loaded.record.consumer or {})
            self.share = restore_share(group_id, document, self._share_config(), sessions_from)
            self._share_doc = snapshot_share(self.share)
        elif loaded.record is not None:
            self.group = Group.from_record(group_id, config, loaded.record, now, sessions_from)
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

    def _check_open(self) -> None:
        """A runtime dropped after it was handed out must not take new work. Every request
        passes here first, so it also meets the members' timers moved for a session resumption
        the timer task has not acted on yet (``_catch_up_resumption``)."""
        if self.closed:
            raise NotCoordinator(f"this broker no longer coordinates group {self.group_id!r}")
        self._catch_up_resumption()

    # --- what the group is --------------------------------------------------------------------

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

    def describe(self) -> GroupDescription:
        self._check_open()
        if self.share is not None:
            return GroupDescription(GroupState.DEAD, "share", "", ())
        if self.consumer is not None:
            return GroupDescription(GroupState.DEAD, "consumer", "", ())
        if self.group is None:
            return GroupDescription(GroupState.DEAD, "", "", ())
        return self.group.describe()

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
