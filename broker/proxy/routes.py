"""The proxy's routing tables: which broker owns a partition, which coordinates a group.

Kept current by the same etcd watches the brokers use (``ClusterView`` for the broker registry,
partition leases, the assignment, draining marks and partition states; ``GroupLeases`` for group
and transaction coordinators), so routing a request never costs an etcd round trip. The choices
themselves are the brokers' own pure functions (``leader_for``, ``name_coordinator``): a
client of the proxy is sent where a client of any broker would be. One etcd read does happen
off the watches: ``recheck``, when the forwarder finds a route's broker refusing it for longer
than a watch takes to catch up (``staleness``): a missed event must not mean clients refused
until some later event happens to touch the same key. And one small read a second tells
whether etcd still answers (``etcd_probe``): a silent etcd leaves the watches quiet, not broken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from kafscale.broker.groups.leases import GroupLeases, name_coordinator
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.leaders import leader_for
from kafscale.broker.proxy.etcd_probe import probe_etcd
from kafscale.broker.proxy.staleness import RouteKey, corrected_holder
from kafscale.broker.task_stop import cancel_and_wait, start_task

TopicPartition = tuple[str, int]

log = logging.getLogger(__name__)

RECHECKS_IN_FLIGHT = 16


class RoutingTable:
    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self._etcd = etcd
        self._cluster = cluster
        self.stale_checks = 0  # lease keys read from etcd because their owner kept refusing
        self.stale_corrections = 0  # of those, entries etcd disagreed with (a missed event)
        # Lease reads in flight at once: a broker refusing thousands of partitions at once costs
        # etcd a bounded stream of small reads, not a burst.
        self._recheck_slots = asyncio.Semaphore(RECHECKS_IN_FLIGHT)
        self.view = ClusterView(etcd, cluster)
        # a release is applied once the draining marks before it are known (``GroupLeases``)
        settle = self.view.know_draining_at
        self.groups = GroupLeases(etcd, cluster, self._on_group_change, before_release=settle)
        self.transactions = GroupLeases(
            etcd,
            cluster,
            self._on_group_change,
            prefix=keys.transaction_leases_prefix(cluster),
            key_of=keys.transaction_lease_key,
            before_release=settle,
        )
        self._changed = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None  # whether etcd answers (``etcd_probe``)
        self.loaded = False

    async def start(self) -> None:
        await self.view.start()
        await self.groups.start()
        await self.transactions.start()
        self._follower = start_task(self._follow_view(), name="proxy-routes")
        self._probe = start_task(probe_etcd(self._etcd, self.view.health), name="etcd-probe")
        self.loaded = True

    async def close(self) -> None:
        await cancel_and_wait(self._probe)
        await cancel_and_wait(self._follower)
        await self.groups.close()
        await self.transactions.close()
        await self.view.close()

    @property
    def ready(self) -> bool:
        """Tables loaded and some broker to route to."""
        return self.loaded and bool(self.view.brokers)

    def partition_owner(self, tp: TopicPartition) -> int:
        """The broker a partition's requests go to, or -1 when no broker is alive."""
        view = self.view
        return leader_for(
            tp, view.owners, view.assignment.owners, view.brokers.keys(), view.draining
        )

    def group_coordinator(self, group_id: str) -> int:
        view = self.view
        chosen = name_coordinator(
            group_id, self.groups.holder(group_id), view.brokers.keys(), view.draining
        )
        return -1 if chosen is None else chosen

    def transaction_coordinator(self, transactional_id: str) -> int:
        view = self.view
        chosen = name_coordinator(
            transactional_id,
            self.transactions.holder(transactional_id),
            view.brokers.keys(),
            view.draining,
        )
        return -1 if chosen is None else chosen

    def any_broker(self, avoid: frozenset[int] = frozenset()) -> int:
        """A broker for requests any broker can answer: the lowest live, non-draining one not in
        ``avoid`` (so a refused broker is skipped on the retry), else -1."""
        live = sorted(self.view.brokers)
        for pool in (
            [b for b in live if b not in self.view.draining and b not in avoid],
            [b for b in live if b not in avoid],
            live,
        ):
            if pool:
                return pool[0]
        return -1

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self.view.brokers.get(node_id)

    def leader_epoch(self, tp: TopicPartition) -> int:
        state = self.view.states.get(tp)
        return max(state.leader_epoch, 0) if state is not None else 0

    def route_of(self, key: RouteKey) -> int:
        """Where the table sends ``key``'s requests now."""
        if key.kind == "partition":
            return self.partition_owner((key.name, key.partition))
        if key.kind == "group":
            return self.group_coordinator(key.name)
        return self.transaction_coordinator(key.name)

    def holder(self, key: RouteKey) -> int | None:
        """The lease holder the table knows for ``key`` (None: no lease)."""
        if key.kind == "partition":
            return self.view.owners.get((key.name, key.partition))
        return self._leases_of(key).holder(key.name)

    async def recheck(self, key: RouteKey) -> bool:
        """Read ``key``'s lease from etcd and correct the table if etcd disagrees (its watch
        missed an event); whether it was corrected. An etcd that cannot answer changes
        nothing: the retry goes on as before."""
        before = self.holder(key)
        self.stale_checks += 1
        try:
            async with self._recheck_slots:
                entry = await self._etcd.get(self._lease_key(key))
        except MetadataUnavailable as exc:
            log.info("cannot re-read the lease of %s: %s", key, exc)
            return False
        actual = _parse_holder(entry.value) if entry is not None else None
        if self.holder(key) != before or not corrected_holder(before, actual):
            return False  # the watch moved it meanwhile (so it is alive), or the table is right
        log.warning(
            "route of %s was stale: the table said lease holder %s, etcd says %s; corrected "
            "(a watch missed an event)",
            key,
            before,
            actual,
        )
        self._set_holder(key, actual)
        self.stale_corrections += 1
        self._signal()
        return True

    def _lease_key(self, key: RouteKey) -> str:
        if key.kind == "partition":
            return keys.partition_lease_key(self._cluster, key.name, key.partition)
        if key.kind == "group":
            return keys.group_lease_key(self._cluster, key.name)
        return keys.transaction_lease_key(self._cluster, key.name)

    def _leases_of(self, key: RouteKey) -> GroupLeases:
        return self.groups if key.kind == "group" else self.transactions

    def _set_holder(self, key: RouteKey, holder: int | None) -> None:
        if key.kind == "partition":
            tp = (key.name, key.partition)
            if holder is None:
                self.view.owners.pop(tp, None)
            else:
                self.view.owners[tp] = holder
            return
        owners = self._leases_of(key).owners
        if holder is None:
            owners.pop(key.name, None)
        else:
            owners[key.name] = holder

    async def wait_changed(self, timeout_s: float) -> None:
        """Until a route may have moved (a lease, the registry, the assignment, a draining mark
        or a group lease changed), or ``timeout_s``."""
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await changed.wait()

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _on_group_change(self, _group: str, _owner: int | None, _revision: int) -> None:
        self._signal()

    async def _follow_view(self) -> None:
        while True:
            changed = self.view.changed
            await changed.wait()
            self._signal()


def _parse_holder(value: bytes) -> int | None:
    """A lease key's value: the holder's node id (None if unreadable, as the watches take it)."""
    try:
        return int(value)
    except ValueError:
        return None
