"""Group leases: which broker coordinates which group.

``leases/groups/<group>`` holds the coordinator's broker id and is bound to that broker's
session lease, so it vanishes when the broker stops or its session expires. A broker takes it
with a create-if-absent transaction on the first group request it gets; only the holder
coordinates (DESIGN §3.7). Every broker follows all group leases through one prefix watch: that
answers FindCoordinator without an etcd round trip and tells a broker at once when a group it
coordinated is held by someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Awaitable, Callable, Collection, Iterable

from kafscale.broker.groups.store import Fence
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd, WatchEventKind, read_prefix_until_answered
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.etcd_txn import (
    KeyValue,
    create_revision_is,
    delete_op,
    get_op,
    put_op,
    value_is,
)
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)

LeaseChange = Callable[[str, int | None, int], None]
"""(group, new owner or None when released, etcd revision of the change)."""

BeforeRelease = Callable[[int, int], Awaitable[None]]
"""(the holder that let a lease go, the release's etcd revision): awaited before the release is
applied (``ClusterView.know_draining_at``)."""

RELEASE_RECHECK_S = 0.2
"""While waiting for a draining holder's release (``GroupLeases.acquire``): ask etcd again at
least this often."""

AFTER_EVERY_REVISION = 2**63 - 1
"""The revision reported for the reload after etcd's history went back (a restore, lost
writes): every revision held from before (a lease's create revision) is void, so the change is
newer than all of them, and a coordinator whose lease etcd no longer lists lets its group go."""


def choose_coordinator(
    group_id: str,
    holder: int | None,
    live: Iterable[int],
    draining: Iterable[int] = (),
    leaving: Iterable[int] = (),
) -> int | None:
    """The broker FindCoordinator names: the live lease holder, else a stable pick.

    Without a live holder every broker computes the same candidate (crc32 of the group id over
    the sorted live, non-draining brokers), so clients of one group converge on one broker,
    which takes the lease on their first request. ``leaving``: brokers handing their groups
    over (a stopping broker, about itself): never named, not even as the holder (None while
    such a holder still has the lease: the group has no coordinator for that moment).
    """
    return coordinator_chooser(live, draining, leaving)(group_id, holder)


def name_coordinator(
    group_id: str,
    holder: int | None,
    live: Iterable[int],
    draining: Iterable[int] = (),
    leaving: Iterable[int] = (),
) -> int | None:
    """FindCoordinator's answer: ``choose_coordinator`` where a draining or leaving holder
    counts as none, so the next coordinator is named at once.

    A draining broker hands its groups over (``POST /drain``, a stop): it refuses them from the
    moment it wrote its mark, so naming it as a group's holder sent the client to a refusal
    (and its back-off) until its release reached the others. The next coordinator (the stable
    pick among the live, non-draining brokers) is named instead; its first request for the
    group waits there for the release (``GroupLeases.acquire``). Never a draining broker, not
    even when all are (None: COORDINATOR_NOT_AVAILABLE; they take no group on). (The lag a
    broker reports still follows ``choose_coordinator``: a draining holder reports its groups'
    lag until it lets them go.)
    """
    away = set(draining).union(leaving)
    named = choose_coordinator(
        group_id, None if holder in away else holder, live, draining, leaving
    )
    return None if named in away else named


def coordinator_chooser(
    live: Iterable[int], draining: Iterable[int] = (), leaving: Iterable[int] = ()
) -> Callable[[str, int | None], int | None]:
    """``choose_coordinator`` for many groups over one set of brokers: (group id, lease holder)
    to the broker FindCoordinator names, the brokers sorted once (``/metrics`` asks it of every
    group whose lag may be reported)."""
    gone = set(leaving)
    alive = sorted(set(live) - gone)
    alive_set = set(alive)
    skip = set(draining)
    candidates = [b for b in alive if b not in skip] or alive

    def choose(group_id: str, holder: int | None) -> int | None:
        if holder is not None and holder in gone:
            return None
        if holder is not None and holder in alive_set:
            return holder
        if not candidates:
            return None
        return candidates[zlib.crc32(group_id.encode()) % len(candidates)]

    return choose


def owner_value(node_id: int) -> bytes:
    return str(node_id).encode()


def _parse_owner(value: bytes) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


class GroupLeases:
    """The cluster's group lease holders, followed by a watch; takes leases for this broker.

    The transaction coordinator's leases (``leases/transactions/<id>``) work the same way: it
    passes their prefix and key builder.

    ``before_release``: awaited with the holder and the revision of each release before it is
    applied, so that whoever reads ``holder`` next knows as much of the cluster as the release
    implies: a drained broker's draining mark comes before its releases, in another watch
    (``ClusterView.know_draining_at``). Until then the holder stays the one named.
    """

    def __init__(
        self,
        etcd: Etcd,
        cluster: str,
        on_change: LeaseChange,
        prefix: str | None = None,
        key_of: Callable[[str, str], str] = keys.group_lease_key,
        before_release: BeforeRelease | None = None,
    ) -> None:
        self._etcd = etcd
        self._cluster = cluster
        self._prefix = prefix or keys.group_leases_prefix(cluster)
        self._key_of = key_of
        self._on_change = on_change
        self._before_release = before_release
        self._changed = asyncio.Event()  # set (and replaced) at each lease event applied
        self.owners: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        entries, revision = await self._etcd.get_prefix_with_revision(self._prefix)
        self._reset(entries)
        name = f"leases-watch-{self._prefix}"
        self._task = start_task(self._follow(revision + 1), name=name)

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def holder(self, group_id: str) -> int | None:
        return self.owners.get(group_id)

    async def acquire(
        self,
        group_id: str,
        node_id: int,
        session_id: int,
        handing_over: Collection[int] = (),
        wait_s: float = 0.0,
    ) -> Fence | None:
        """Take (or confirm) the lease; None if another broker holds it.

        A holder in ``handing_over`` (draining: it lets its groups go at once) is waited for,
        ``wait_s`` at most: FindCoordinator names the next coordinator from the drained
        broker's mark on (``name_coordinator``), and its first request waits here for the
        release instead of sending the client back with NOT_COORDINATOR and its back-off.
        The lease is asked again at each change the watch brings, and every
        ``RELEASE_RECHECK_S`` (an answer read before a release the watch applied first would
        otherwise hold the old holder here until the wait ran out).

        Raises ``MetadataUnavailable`` when etcd cannot answer: never coordinate without it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            changed = self._changed
            fence = await self._take(group_id, node_id, session_id)
            left_s = deadline - loop.time()
            if fence is not None or self.owners.get(group_id) not in handing_over or left_s <= 0:
                return fence
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left_s, RELEASE_RECHECK_S)):
                    await changed.wait()

    async def _take(self, group_id: str, node_id: int, session_id: int) -> Fence | None:
        """One try at ``acquire``: None if another broker holds the lease."""
        key = self._key_of(self._cluster, group_id)
        owner = owner_value(node_id)
        for _ in range(3):
            result = await self._etcd.txn(
                [create_revision_is(key, 0)], [put_op(key, owner, lease=session_id)], [get_op(key)]
            )
            if result.succeeded:
                self.owners[group_id] = node_id
                return Fence(key, owner, result.revision)
            current = result.kv(0)
            if current is None:
                continue  # released between compare and read: try again
            if current.value == owner and current.lease == session_id:
                return Fence(key, owner, current.create_revision)
            if current.value == owner:
                # Ours, from a session this broker already gave up: clear it, then take it anew
                # (a fresh create revision, so nothing fenced by the old one can write).
                stale = [value_is(key, owner), create_revision_is(key, current.create_revision)]
                await self._etcd.txn(stale, [delete_op(key)])
                continue
            holder = _parse_owner(current.value)
            if holder is not None:
                self.owners[group_id] = holder
            return None
        return None

    async def release(self, fence: Fence) -> None:
        """Give the lease up (only if it is still the one ``fence`` proves). Once etcd deleted
        it, this broker no longer names itself the holder, even before (or without: a watch
        closed at shutdown) the deletion's watch event."""
        result = await self._etcd.txn(fence.compares(), [delete_op(fence.key)])
        group_id = self._group_of(fence.key)
        if result.succeeded and self.owners.get(group_id) == _parse_owner(fence.owner):
            del self.owners[group_id]

    def _group_of(self, key: str) -> str:
        return keys.group_from_key_part(key[len(self._prefix) :])

    def _reset(self, entries: list[KeyValue]) -> None:
        self.owners = {}
        for entry in entries:
            owner = _parse_owner(entry.value)
            if owner is not None:
                self.owners[self._group_of(entry.key)] = owner

    async def _follow(self, start_revision: int) -> None:
        watch = self._etcd.watch_prefix(self._prefix, start_revision)
        async with contextlib.aclosing(watch) as events:
            async for event in events:
                try:
                    if event.kind is WatchEventKind.RESYNC:
                        await self._resync(
                            AFTER_EVERY_REVISION if event.rewound else event.mod_revision
                        )
                        continue
                    group_id = self._group_of(event.key)
                    if event.kind is WatchEventKind.PUT:
                        owner = _parse_owner(event.value)
                        if owner is None:
                            continue
                        self.owners[group_id] = owner
                    else:
                        owner = None
                        await self._settle_release(group_id, event.mod_revision)
                        self.owners.pop(group_id, None)
                    self._on_change(group_id, owner, event.mod_revision)
                    self._changed.set()
                    self._changed = asyncio.Event()
                except Exception:
                    log.exception("cannot apply group lease event for %s", event.key)

    async def _settle_release(self, group_id: str, revision: int) -> None:
        """``before_release`` for the group's holder, if this watch knew one. etcd away: the
        release is applied anyway (a stale holder named for longer would be worse), after one
        call's timeout at most."""
        holder = self.owners.get(group_id)
        if holder is None or self._before_release is None:
            return
        try:
            await self._before_release(holder, revision)
        except MetadataError as exc:
            log.warning("applying the release of %s without the marks before it: %r", group_id, exc)

    async def _resync(self, revision: int) -> None:
        """History was compacted or went back (``Etcd.watch_range``): reload (retried until
        etcd answers: the watch goes on after the lost stretch, whose changes a skipped reload
        would lose for good), and report every holder as changed."""
        before = dict(self.owners)
        self._reset(await read_prefix_until_answered(self._etcd, self._prefix, "group leases"))
        for group_id in set(before) | set(self.owners):
            self._on_change(group_id, self.owners.get(group_id), revision)
