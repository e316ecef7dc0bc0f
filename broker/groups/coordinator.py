"""The group coordinator of one broker: which groups it coordinates, and taking them on.

A group is coordinated here only while this broker holds the group's lease in etcd. The first
request for a group takes the lease (create-if-absent, bound to the broker's session) and loads
the group's metadata and offsets; concurrent requests for the same group share that one load.
A broker that cannot take the lease answers NOT_COORDINATOR; one that cannot reach etcd never
guesses (the caller maps ``MetadataUnavailable`` to REQUEST_TIMED_OUT or
COORDINATOR_NOT_AVAILABLE).

A group is dropped, its waiting members told NOT_COORDINATOR, when a fenced write fails, when the
lease watch shows another holder (or the lease gone), when the broker's session is lost, and at
shutdown, before the session is revoked so that the leases pass on at once. A group nobody is in
and nobody asked for lately is let go, its lease released (``release`` decides when): it is
reloaded from etcd when asked for again, so a broker holds the groups in use, not every group
it ever coordinated.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kafscale.broker.config import GroupSettings, IsolationLevel
from kafscale.broker.groups import adoption, release, retention_outage
from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.leases import (
    GroupLeases,
    choose_coordinator,
    coordinator_chooser,
    name_coordinator,
)
from kafscale.broker.groups.model import GroupConfig, GroupState
from kafscale.broker.groups.retention_runtime import wall_clock_ms
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.share import ShareConfig, new_group_refusal
from kafscale.broker.groups.store import (
    DECODE_ERRORS,
    CommittedOffset,
    Fence,
    GroupStore,
    LoadedGroup,
    TopicPartition,
    unreadable,
)
from kafscale.broker.groups.stored_lag import StoredLag
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError, MetadataUnavailable
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.observability.lag import reported_groups
from kafscale.broker.observability.log_limit import ClientEvent, client_log, named
from kafscale.broker.observability.logs import about, bind
from kafscale.broker.observability.metrics import METRICS, Metrics
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.protocol.errors import (
    CoordinatorBetweenSessions,
    ErrorCode,
    NotCoordinator,
    UnreadableRecord,
)
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)

_SESSION_POLL_S = 0.1
_LEASE_GONE_KEPT = 10_000
"""Groups whose lease-gone time is kept before the stale ones are pruned."""
_LOOK_MIN_S = 0.05
"""The shortest pause between two looks for groups to let go (a tiny idle time is no spin)."""
UNREADABLE_RECHECK_S = 5.0
"""How long a group found unreadable is refused from memory before it is read again."""
UNREADABLE_REMEMBERED = 1024
"""At most this many such groups are remembered (their names are a client's choice)."""

# Why groups that hold nothing are let go at all (``GroupConfig.vacant_release_ms``): every
# group request takes the group's lease (an etcd key every broker's watch then holds) and loads
# it, so that the answer is the coordinator's. A DescribeGroups, OffsetFetch or Heartbeat naming
# a group nobody created (Kafka answers Dead, nothing or UNKNOWN_MEMBER_ID and keeps nothing)
# used to leave a runtime, two tasks and a lease behind for good: one per name asked, without
# bound. Such a group is let go once it has not been asked for that long. (A group without
# members that keeps committed offsets goes after ``GroupConfig.idle_release_ms``.)


class CoordinatorHost(Protocol):
    """What the coordinator needs from its broker (``kafscale.broker.app.Broker``)."""

    @property
    def etcd(self) -> Etcd: ...

    @property
    def session(self) -> SessionLease: ...

    @property
    def view(self) -> ClusterView: ...

    @property
    def node_id(self) -> int: ...

    @property
    def cluster(self) -> str: ...

    @property
    def draining(self) -> bool: ...


def group_config(settings: GroupSettings) -> GroupConfig:
    return GroupConfig(
        initial_rebalance_delay_ms=settings.initial_rebalance_delay_ms,
        min_session_timeout_ms=settings.min_session_timeout_ms,
        max_session_timeout_ms=settings.max_session_timeout_ms,
        max_size=settings.max_size,
        consumer_max_size=settings.consumer_max_size,
        consumer_session_timeout_ms=settings.consumer_session_timeout_ms,
        consumer_heartbeat_interval_ms=settings.consumer_heartbeat_interval_ms,
        share=share_config(settings),
        share_max_groups=settings.share_max_groups,
        offsets_retention_ms=round(settings.offsets_retention_minutes * 60_000),
        offsets_retention_check_interval_ms=settings.offsets_retention_check_interval_ms,
        idle_release_ms=settings.idle_release_ms,
        lag_refresh_interval_ms=settings.lag_refresh_interval_ms,
        lag_refresh_max_groups=settings.lag_refresh_max_groups,
        vacant_release_ms=settings.vacant_release_ms,
    )


def share_config(settings: GroupSettings) -> ShareConfig:
    """The broker's ``group.share.*`` settings: what a share group without its own uses."""
    return ShareConfig(
        session_timeout_ms=settings.share_session_timeout_ms,
        heartbeat_interval_ms=settings.share_heartbeat_interval_ms,
        record_lock_duration_ms=settings.share_record_lock_duration_ms,
        delivery_count_limit=settings.share_delivery_count_limit,
        max_record_locks=settings.share_partition_max_record_locks,
        read_committed=settings.share_isolation_level is IsolationLevel.READ_COMMITTED,
    )


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


class GroupCoordinator:
    def __init__(
        self, host: CoordinatorHost, config: GroupConfig, metrics: Metrics = METRICS
    ) -> None:
        self._host = host
        self._metrics = metrics
        self.config = config
        self._store = GroupStore(host.etcd, host.cluster)
        self._leases = GroupLeases(
            host.etcd,
            host.cluster,
            self._on_lease_change,
            before_release=lambda holder, revision: host.view.know_draining_at(holder, revision),
        )
        self._runtimes: dict[str, GroupRuntime] = {}
        self._loading: dict[str, asyncio.Task[GroupRuntime]] = {}
        self._retired: list[asyncio.Task[None]] = []
        self._used_at: dict[str, float] = {}  # when each runtime was last handed out
        self._releasing: dict[str, asyncio.Task[None]] = {}
        self._lease_gone_at: dict[str, int] = {}
        """When (loop clock, ms) each group's lease was seen to go and nobody took it since:
        a group taken on here runs its members' sessions from then (``Group.from_record``)."""
        # groups found unreadable, answered from memory for a while (``_recently_unreadable``)
        self._unreadable: OrderedDict[str, tuple[float, UnreadableRecord]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._claiming = True  # False: serve the groups held here, take on no other
        self._sweep_after: str | None = None
        """The stored group the last retention check's adoption sweep stopped at."""
        self.stored_lag = StoredLag(
            self._store,
            self._picked_here,
            config.lag_refresh_interval_ms / 1000,
            config.lag_refresh_max_groups,
        )

    async def start(self) -> None:
        await self._leases.start()
        self._tasks.append(start_task(self._follow_session(), name="group-coordinator-session"))
        self._tasks.append(start_task(self._let_go_of_unused(), name="groups-release"))
        self._tasks.append(start_task(self._expire_offsets(), name="groups-retention"))
        self.stored_lag.start()

    def stop_claiming(self) -> None:
        """Take on no group from now on (NOT_COORDINATOR), keep serving those held here until
        ``close``: the whole cluster is stopping, and a group its stopping coordinator let go
        must not be claimed here only to be let go again a moment later."""
        self._claiming = False

    @property
    def handing_over(self) -> bool:
        """Whether this broker gives its groups up: it drains (``POST /drain``, the draining
        mark; until the mark is removed) or stops (``close`` began). Meanwhile it refuses
        every group, takes on none, and FindCoordinator here never names it."""
        return self._closed or self._host.draining

    async def hand_over(self) -> None:
        """Give every group up while the broker keeps running (it drains): as at ``close``,
        each group is refused at once (its waiting members get NOT_COORDINATOR) and its lease
        released as soon as its runtime stopped, so the next coordinator takes it and every
        FindCoordinator names that one. A group being loaded meanwhile gives its lease back
        once loaded (``_acquire``); none is taken on while the broker drains (``_take_lease``)."""
        loading = list(self._loading.values())
        await self._give_up_all("the broker is draining")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._host.etcd.timeout_s):
                await asyncio.gather(*loading, return_exceptions=True)

    async def close(self) -> None:
        """Stop coordinating and release every group lease (waiters get NOT_COORDINATOR),
        as ``hand_over`` does, then stop the coordinator's own tasks."""
        self._closed = True
        loading = list(self._loading.values())
        for loader in loading:
            loader.cancel()
        given_up = self._give_up_all("the broker is shutting down")
        for task in self._tasks:
            task.cancel()
        await given_up
        await self.stored_lag.close()
        releasing = list(self._releasing.values())
        await asyncio.gather(
            *self._tasks, *self._retired, *loading, *releasing, return_exceptions=True
        )
        self._retired.clear()
        await self._leases.close()

    def _give_up_all(self, reason: str) -> Awaitable[None]:
        """Unload every group now (each refused from here on) and return what releases their
        leases, each once its group stopped: the one hand-off of a drain and of a stop. Bounded
        by the etcd timeout; a lease etcd did not release then goes with the broker's session
        (revoked at its stop, which follows the preStop drain)."""
        handovers = [
            self._hand_over(runtime.fence, self._unload(runtime, reason))
            for runtime in list(self._runtimes.values())
        ]

        async def released() -> None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._host.etcd.timeout_s):
                    await asyncio.gather(*handovers, return_exceptions=True)

        return released()

    async def _hand_over(self, fence: Fence, stopped: list[asyncio.Task[None]]) -> None:
        """Give a group's lease back once its runtime's tasks ended (a write they had in
        flight is fenced by the lease either way)."""
        await asyncio.gather(*stopped, return_exceptions=True)
        await self._leases.release(fence)

    # --- finding and taking groups ------------------------------------------------------------

    def coordinator_for(self, group_id: str) -> BrokerInfo | None:
        """FindCoordinator's answer: the live lease holder, else the broker that will take it;
        never a broker that hands its groups over (draining, or this one stopping), not even
        while it still holds the group's lease: the next coordinator, whose first request for
        the group waits for that release (``name_coordinator``, ``GroupLeases.acquire``)."""
        view = self._host.view
        leaving = (self._host.node_id,) if self.handing_over else ()
        chosen = name_coordinator(
            group_id, self._leases.holder(group_id), view.brokers.keys(), view.draining, leaving
        )
        return None if chosen is None else view.brokers.get(chosen)

    def local(self, group_id: str) -> GroupRuntime | None:
        """The group if coordinated here now: not once the session ran out, even before the
        keepalive noticed (a broker woken from a freeze; ``SessionLease.still_valid``)."""
        runtime = self._runtimes.get(group_id)
        if runtime is None or runtime.closed or not self._host.session.still_valid():
            return None
        return runtime

    def share_group_refusal(self, group_id: str) -> str | None:
        """Why a share group join may not create ``group_id`` (None: it may, or the group
        exists). Counted cluster-wide: every share group the cluster watch shows
        (``groups/<g>/metadata`` of type share, empty groups included) and those coordinated
        here not yet in it. Checked before the group's lease is taken, so a refused id costs
        no lease and no runtime; joins racing on different coordinators may pass the bound
        by the number in flight at once."""
        runtime = self.local(group_id)
        if runtime is not None and not runtime.is_unused():
            return None  # an existing group: its own answer (a share group's, or not one)
        known = self._host.view.share_members.members
        if group_id in known:
            return None
        here = {g for g, r in self._runtimes.items() if r.share is not None and not r.closed}
        return new_group_refusal(len(known.keys() | here), self.config.share_max_groups)

    def coordinated(self) -> list[GroupRuntime]:
        """The groups coordinated here now (for metrics)."""
        return [runtime for runtime in self._runtimes.values() if not runtime.closed]

    def lag_offsets(self) -> list[tuple[str, Mapping[TopicPartition, CommittedOffset]]]:
        """The groups whose lag this broker reports, with their committed offsets: those it
        coordinates, and those nobody coordinates whose stable pick it is (``stored_lag``).
        No etcd I/O: ``/metrics`` calls it."""
        view = self._host.view
        choose = coordinator_chooser(view.brokers, view.draining)

        def reporter(group_id: str) -> int | None:
            return choose(group_id, self._leases.holder(group_id))

        coordinated = {g: r.offsets for g, r in self._runtimes.items() if not r.closed}
        return reported_groups(self._host.node_id, coordinated, self.stored_lag.offsets, reporter)

    def _picked_here(self, group_id: str) -> bool:
        """Whether this broker is the group's stable pick: the one FindCoordinator names while
        nobody holds the group's lease."""
        view = self._host.view
        chosen = choose_coordinator(group_id, None, view.brokers, view.draining)
        return chosen == self._host.node_id

    async def runtime(self, group_id: str) -> GroupRuntime:
        """The group, coordinated here; raises NotCoordinator or MetadataUnavailable."""
        runtime = self.local(group_id)
        if runtime is not None:
            self._used_at[group_id] = time.monotonic()
            return runtime
        if self._closed:
            raise NotCoordinator("this broker is shutting down")
        releasing = self._releasing.get(group_id)
        if releasing is not None and not releasing.done():
            # its lease is on its way out: take it anew afterwards
            await asyncio.shield(releasing)
            return await self.runtime(group_id)
        known = self._recently_unreadable(group_id)
        if known is not None:
            self.report_unreadable(group_id, known)
            raise known
        task = self._loading.get(group_id)
        if task is None:
            task = asyncio.create_task(self._acquire(group_id), name=f"group-acquire-{group_id}")
            self._loading[group_id] = task
            task.add_done_callback(functools.partial(self._acquired, group_id))
        return await asyncio.shield(task)

    async def stored(self, group_id: str) -> LoadedGroup:
        """The group as etcd holds it (committed offsets, partitions pending in open
        transactions), read without taking it on: what OffsetFetch answers at a broker that
        does not coordinate the group (``api/group_offsets``). A coordinator acks a commit
        only once etcd holds it. Raises MetadataUnavailable or UnreadableRecord; an unreadable
        group is logged and counted as when a coordinator loads it (``report_unreadable``)."""
        try:
            return await self._store.load(group_id)
        except UnreadableRecord as exc:
            self.report_unreadable(group_id, exc)
            raise

    def _acquired(self, group_id: str, task: asyncio.Task[GroupRuntime]) -> None:
        if self._loading.get(group_id) is task:
            del self._loading[group_id]
        if not task.cancelled():
            task.exception()  # retrieved here: every caller may have gone away

    async def _acquire(self, group_id: str) -> GroupRuntime:
        bind(group=group_id)  # this task's and the group's own tasks' log lines name the group
        host = self._host
        session = host.session
        fence = await self._take_lease(group_id, session)
        try:
            loaded = await self._store.load(group_id)
            if self._closed or host.session is not session or not session.still_valid():
                raise CoordinatorBetweenSessions("this broker lost its etcd session")
            if host.draining:  # began while loading: the lease goes back, as at the drain
                await self._give_back(fence)
                raise NotCoordinator("this broker is draining")
            gone_at_ms = self._lease_gone_at.pop(group_id, None)
            runtime = self._new_runtime(group_id, fence, loaded, session, gone_at_ms)
        except UnreadableRecord as exc:
            self.report_unreadable(group_id, exc)
            self._remember_unreadable(group_id, exc)
            await self._give_back(fence)
            raise
        self._runtimes[group_id] = runtime
        self._used_at[group_id] = time.monotonic()
        log_group_change(  # a client can have a group loaded again and again
            log,
            group_id,
            "coordinating group %s (%s, %d committed partitions)",
            group_id,
            runtime.generation_text(),
            len(runtime.offsets),
            level=logging.DEBUG if runtime.vacant() else logging.INFO,  # one per name asked
        )
        return runtime

    async def _take_lease(self, group_id: str, session: SessionLease) -> Fence:
        """The group's lease, taken (or confirmed) for this broker's ``session``; raises
        NotCoordinator (another holder, a lost session, draining) or MetadataUnavailable."""
        if not session.still_valid():  # lost, or suspended (``session_lease``)
            raise CoordinatorBetweenSessions("this broker's etcd session expired")
        if self._host.draining:
            raise NotCoordinator("this broker is draining")
        if not self._claiming:
            raise NotCoordinator("this broker is stopping with its cluster")
        try:
            fence = await self._leases.acquire(
                group_id,
                self._host.node_id,
                session.id,
                handing_over=self._host.view.draining,
                wait_s=self._host.etcd.timeout_s,
            )
        except LeaseLost as exc:  # the session ended before its keepalive told us
            raise CoordinatorBetweenSessions("this broker's etcd session expired") from exc
        if fence is None:
            holder = self._leases.holder(group_id)
            raise NotCoordinator(f"group {group_id!r} is coordinated by broker {holder}")
        return fence

    def _new_runtime(
        self,
        group_id: str,
        fence: Fence,
        loaded: LoadedGroup,
        session: SessionLease,
        sessions_since_ms: int | None = None,
    ) -> GroupRuntime:
        """The runtime of a loaded group. A record that decodes but whose content does not
        restore (a member list of the wrong shape) is as unreadable as one that does not."""
        try:
            return GroupRuntime(
                group_id,
                fence,
                self._store,
                self.config,
                loaded,
                self._drop,
                own_configs=functools.partial(self._own_configs, group_id),
                session_valid=session.still_valid,
                sessions_since_ms=sessions_since_ms,
                session_resumed_ms=session.resumed_at_ms,
            )
        except DECODE_ERRORS as exc:
            key = keys.group_metadata_key(self._host.cluster, group_id)
            raise unreadable(key, exc) from exc

    def _remember_unreadable(self, group_id: str, exc: UnreadableRecord) -> None:
        """Each load of an unreadable group takes its lease, reads it and gives the lease back:
        two etcd writes and a read, and a lease event on every broker's watch. A client retrying
        in a loop would cause that at its request rate; remembered, it costs nothing for
        ``UNREADABLE_RECHECK_S`` (a repaired record is served after that)."""
        self._unreadable.pop(group_id, None)
        self._unreadable[group_id] = (time.monotonic() + UNREADABLE_RECHECK_S, exc)
        while len(self._unreadable) > UNREADABLE_REMEMBERED:
            self._unreadable.popitem(last=False)

    def _recently_unreadable(self, group_id: str) -> UnreadableRecord | None:
        known = self._unreadable.get(group_id)
        if known is None:
            return None
        until, exc = known
        if time.monotonic() >= until:
            del self._unreadable[group_id]
            return None
        return exc

    def report_unreadable(self, group_id: str, exc: UnreadableRecord) -> None:
        """Count a group whose stored record does not decode, and say so (limited: a client
        asking for the group again and again causes one each time)."""
        self._metrics.unreadable_group_records += 1
        client_log(
            log, logging.WARNING, ClientEvent.UNREADABLE_GROUP, named("group", group_id),
            "group %s is not served: %s; delete the group (DeleteGroups) or repair its keys",
            group_id, exc,
        )  # fmt: skip

    async def _give_back(self, fence: Fence) -> None:
        """Release a lease taken for a group that will not be coordinated (it would otherwise
        stay held, with no runtime to let it go, for the session's life)."""
        with contextlib.suppress(MetadataUnavailable, TimeoutError):
            async with asyncio.timeout(self._host.etcd.timeout_s):
                await self._leases.release(fence)

    async def delete_unreadable(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a group ``runtime`` refused as unreadable (a value under its keys
        does not decode): every key under its prefix goes, with its lease, in the one fenced
        transaction a normal deletion makes (``GroupStore.delete_group``). Nobody can be a
        member of such a group (every request naming it fails), so Kafka's rule for a group
        with members has nothing to check, and this is how an operator removes it with Kafka's
        own tools (``kafka-consumer-groups.sh --delete``) rather than ``etcdctl``.

        A group loaded here meanwhile (its keys repaired by hand) is not deleted behind its
        runtime: NOT_COORDINATOR, which clients retry, and the retry meets the normal rules.
        Raises NotCoordinator or MetadataUnavailable as ``runtime`` does."""
        if self._closed:
            raise NotCoordinator("this broker is shutting down")
        if self.local(group_id) is not None or group_id in self._loading:
            raise NotCoordinator(f"group {group_id!r} is being loaded again")
        session = self._host.session
        fence = await self._take_lease(group_id, session)
        deleted = False
        try:
            deleted = await self._store.delete_group(group_id, fence)
        finally:
            if not deleted:
                await self._give_back(fence)
        if not deleted:
            return ErrorCode.NOT_COORDINATOR
        self._unreadable.pop(group_id, None)  # the id starts afresh at once
        log.info(
            "deleted group %s, whose stored record did not decode (DeleteGroups)", group_id,
            extra=about(group=group_id),
        )  # fmt: skip
        return ErrorCode.NONE

    # --- listing ------------------------------------------------------------------------------

    async def list_groups(self) -> list[ListedGroup]:
        """Groups this broker coordinates, or would (no live holder, and it is the pick).

        Raises MetadataUnavailable when etcd cannot be read.
        """
        listed: dict[str, ListedGroup] = {}
        for group_id, runtime in self._runtimes.items():
            share = runtime.share
            if share is not None and not runtime.closed:
                listed[group_id] = ListedGroup(group_id, "share", share.state, "share")
                continue
            consumer = runtime.consumer
            if consumer is not None and not runtime.closed:
                listed[group_id] = ListedGroup(group_id, "consumer", consumer.state, "consumer")
                continue
            group = runtime.group
            if group is None or group.state is GroupState.DEAD or runtime.closed:
                continue
            listed[group_id] = ListedGroup(group_id, group.protocol_type or "", group.state.value)
        node_id = self._host.node_id
        for persisted in await self._store.list_persisted():
            if persisted.group_id in listed:
                continue
            if persisted.unreadable is not None:
                self.report_unreadable(persisted.group_id, persisted.unreadable)
                continue
            chosen = self.coordinator_for(persisted.group_id)
            if chosen is None or chosen.node_id != node_id:
                continue
            state = GroupState.STABLE if persisted.has_members else GroupState.EMPTY
            listed[persisted.group_id] = ListedGroup(
                persisted.group_id, persisted.protocol_type, state.value, persisted.group_type
            )
        return sorted(listed.values(), key=lambda g: g.group_id)

    # --- losing groups ------------------------------------------------------------------------

    def _on_lease_change(self, group_id: str, owner: int | None, revision: int) -> None:
        self._note_lease_gone(group_id, owner)
        runtime = self._runtimes.get(group_id)
        if runtime is None or owner == self._host.node_id:
            return
        if revision < runtime.fence.create_revision:
            return  # an event from before we took the lease
        if owner is None:
            self._drop(runtime, "its lease was released")
        else:
            self._drop(runtime, f"broker {owner} holds its lease now")

    def _note_lease_gone(self, group_id: str, owner: int | None) -> None:
        """Remember when a group's lease went (None: nobody holds it now), until another
        broker takes it (this one's own take reads it: ``_acquire``). Entries older than the
        longest session allowed are pruned once many pile up (groups let go unused): one of
        those would give no member any session either."""
        if owner is not None:
            if owner != self._host.node_id:
                self._lease_gone_at.pop(group_id, None)
            return
        now_ms = int(asyncio.get_running_loop().time() * 1000)
        self._lease_gone_at[group_id] = now_ms
        if len(self._lease_gone_at) > _LEASE_GONE_KEPT:
            oldest_ms = now_ms - self.config.max_session_timeout_ms
            self._lease_gone_at = {g: t for g, t in self._lease_gone_at.items() if t >= oldest_ms}

    def _own_configs(self, group_id: str) -> dict[str, str]:
        """The group's own configs (KIP-848), as this broker's view has them now."""
        return self._host.view.group_configs.get(group_id, {})

    def _drop(self, runtime: GroupRuntime, reason: str) -> None:
        self._unload(runtime, reason)

    def _unload(self, runtime: GroupRuntime, reason: str) -> list[asyncio.Task[None]]:
        """Stop coordinating a group; returns its runtime's tasks, which also join
        ``_retired`` (awaited at ``close``)."""
        if self._runtimes.get(runtime.group_id) is runtime:
            del self._runtimes[runtime.group_id]
            self._used_at.pop(runtime.group_id, None)
        if runtime.closed:
            return []
        self.stored_lag.hand_over(runtime.group_id, runtime.offsets)
        log.info(
            "no longer coordinating group %s: %s", runtime.group_id, reason,
            extra=about(group=runtime.group_id),
        )  # fmt: skip
        self._retired = [t for t in self._retired if not t.done()]
        stopped = runtime.unload()
        self._retired.extend(stopped)
        return stopped

    def _drop_all(self, reason: str) -> None:
        for runtime in list(self._runtimes.values()):
            self._drop(runtime, reason)

    def release_due(self, now_s: float) -> list[tuple[GroupRuntime, release.Release]]:
        """The runtimes to let go, or to store the Empty time of first (``release.decide``),
        at monotonic ``now_s``. Groups asked for lately are passed over unread: a look runs
        every few seconds, and reading every group's use would cost a pass over every committed
        offset this broker coordinates each time."""
        vacant_after_s = self.config.vacant_release_ms / 1000
        idle_after_s = self.config.idle_release_ms / 1000
        due: list[tuple[GroupRuntime, release.Release]] = []
        for group_id, runtime in self._runtimes.items():
            unused_s = now_s - self._used_at.get(group_id, now_s)
            if runtime.closed or not release.may_be_due(unused_s, vacant_after_s, idle_after_s):
                continue
            use = runtime.release_use(unused_s)
            decision = release.decide(use, vacant_after_s, idle_after_s)
            if decision is not release.Release.KEEP:
                due.append((runtime, decision))
        return due

    def vacant_due(self, now_s: float) -> list[GroupRuntime]:
        """The runtimes to let go now: vacant ones, and idle ones whose Empty time etcd has."""
        return [r for r, decision in self.release_due(now_s) if decision is release.Release.LET_GO]

    async def _let_go_of_unused(self) -> None:
        """Runs for the broker's life: one group's unexpected error is logged and the loop
        goes on, or no group would ever be let go again until a restart. A group whose Empty
        time etcd lacks has it written first (by its own writer, behind any other write) and
        goes at a later look, once it is stored; if the write fails it stays."""
        shortest_ms = min(self.config.vacant_release_ms, self.config.idle_release_ms)
        look_s = max(_LOOK_MIN_S, shortest_ms / 1000 / 2)
        while True:
            await asyncio.sleep(look_s)
            for runtime, decision in self.release_due(time.monotonic()):
                try:
                    if decision is release.Release.LET_GO:
                        self._let_go(runtime)
                    else:
                        runtime.store_empty_time()
                except Exception:
                    log.exception("letting go of group %s failed", runtime.group_id)

    def _let_go(self, runtime: GroupRuntime) -> None:
        """Stop coordinating a group etcd holds whole (or that does not exist), and give its
        lease back. A request for it meanwhile waits for the release, then takes it anew."""
        group_id = runtime.group_id
        del self._runtimes[group_id]
        self._used_at.pop(group_id, None)
        self.stored_lag.hand_over(group_id, runtime.offsets)
        self._retired = [t for t in self._retired if not t.done()]
        self._retired.extend(runtime.unload())
        task = start_task(self._release(runtime), name=f"group-release-{group_id}")
        self._releasing[group_id] = task
        task.add_done_callback(functools.partial(self._released, group_id))

    async def _release(self, runtime: GroupRuntime) -> None:
        with contextlib.suppress(MetadataUnavailable, TimeoutError):
            async with asyncio.timeout(self._host.etcd.timeout_s):
                await self._leases.release(runtime.fence)
        log.debug("let go of group %s: unused, and etcd holds all of it", runtime.group_id)

    def _released(self, group_id: str, task: asyncio.Task[None]) -> None:
        if self._releasing.get(group_id) is task:
            del self._releasing[group_id]
        if not task.cancelled():
            task.exception()

    # --- offset retention (KIP-211) -----------------------------------------------------------

    async def _expire_offsets(self) -> None:
        """Runs for the broker's life, one retention check per
        ``offsets_retention_check_interval_ms`` (Kafka's first check, too, comes one interval
        after start-up); a failed check is logged and the next one goes on. A run of checks
        etcd refuses (permission denied after a change of roles) is logged once, then
        summarised (``retry_log``), without a traceback; an unexpected error keeps its."""
        retries = RetryLog(log, "offset retention check")
        while True:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets()
            except MetadataError as exc:
                retries.failed(exc)
            except Exception:
                log.exception("offset retention check failed")
            else:
                retries.succeeded()

    async def expire_offsets(self) -> None:
        """One retention check of every group this broker coordinates, after taking on some of
        the groups stored in etcd that nobody coordinates and that would be this broker's (a
        group nobody asked for since a restart must expire too: its etcd keys are what fills
        the quota); all of them over successive checks. Each group's expiry is its own
        runtime's, fenced by its lease. What etcd left unanswered is raised after every group
        had its turn, as one ``RetentionNotChecked`` (``retention_outage``)."""
        unlisted = await self._adopt_unowned()
        coordinated = self.coordinated()
        unchecked: list[tuple[str, MetadataUnavailable]] = []
        for runtime in coordinated:
            try:
                expired = await runtime.expire_offsets(wall_clock_ms())
            except NotCoordinator as exc:
                log.debug("offset retention of group %s: %s", runtime.group_id, exc)
                continue
            except MetadataUnavailable as exc:
                unchecked.append((runtime.group_id, exc))
                continue
            self._metrics.offsets_expired += len(expired.offsets)
            self._metrics.groups_expired += int(expired.group_deleted)
        error = retention_outage.unanswered_part(unlisted, unchecked, len(coordinated))
        if error is not None:
            raise error

    async def _adopt_unowned(self) -> MetadataUnavailable | None:
        """Take on at most ``offsets_retention_adopt_per_check`` stored groups that nobody
        coordinates and that would be this broker's, going on after the group the last check
        stopped at (``adoption``): bounded etcd reads and loads per check, even in the first
        check after a restart, when nobody coordinates anything. Returns etcd's error if it
        did not list the stored groups (the check goes on with the groups coordinated here)."""
        sweep = adoption.start_check(
            self._sweep_after, self.config.offsets_retention_adopt_per_check
        )
        try:
            async with contextlib.aclosing(self._store.group_id_pages(sweep.after)) as pages:
                async for listed, last_page in pages:
                    sweep, taken = adoption.take_from_page(
                        sweep, listed, self._adoptable, last_page
                    )
                    for group_id in taken:
                        # an unreadable group is reported and its lease given back: the
                        # check goes on with the others
                        with contextlib.suppress(
                            NotCoordinator, UnreadableRecord, MetadataUnavailable
                        ):
                            await self.runtime(group_id)
                    self._sweep_after = sweep.after
                    if sweep.done or self._closed:
                        break
        except MetadataUnavailable as exc:
            return exc
        return None

    def _adoptable(self, group_id: str) -> bool:
        """Whether a retention check may take on a stored group: nobody coordinates it, this
        broker is its pick, and it is no share group (they keep no committed offsets)."""
        if self._closed or not self._claiming:
            return False
        if group_id in self._runtimes or group_id in self._loading:
            return False
        if group_id in self._host.view.share_members.members:
            return False
        if self._leases.holder(group_id) is not None:
            return False
        chosen = self.coordinator_for(group_id)
        return chosen is not None and chosen.node_id == self._host.node_id

    def held(self) -> dict[str, int]:
        """How much this coordinator holds (for ``/status``): group runtimes here, group
        leases of the whole cluster known to this broker's watch."""
        return {"groups": len(self._runtimes), "group_leases": len(self._leases.owners)}

    async def _follow_session(self) -> None:
        """When the session is lost every group lease went with it: drop every group."""
        while True:
            session = self._host.session
            await session.lost.wait()
            self._drop_all("this broker's etcd session was lost")
            # The broker starts a new session without an event to wait on: poll for it.
            while self._host.session is session:  # noqa: ASYNC110
                await asyncio.sleep(_SESSION_POLL_S)
