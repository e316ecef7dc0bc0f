"""The proxy's routing tables: which broker owns a partition, which coordinates a group.

Kept current by the same etcd watches the brokers use (``ClusterView`` for the broker registry,
partition leases, the assignment, draining marks and partition states; ``GroupLeases`` for group
and transaction coordinators), so routing a request never costs an etcd round trip. The choices
themselves are the brokers' own pure functions (``leader_for``, ``choose_coordinator``): a
client of the proxy is sent where a client of any broker would be.
"""

from __future__ import annotations

import asyncio
import contextlib

from kafscale.broker.groups.leases import GroupLeases, choose_coordinator
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.leaders import leader_for

TopicPartition = tuple[str, int]


class RoutingTable:
    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self.view = ClusterView(etcd, cluster)
        self.groups = GroupLeases(etcd, cluster, self._on_group_change)
        self.transactions = GroupLeases(
            etcd,
            cluster,
            self._on_group_change,
            prefix=keys.transaction_leases_prefix(cluster),
            key_of=keys.transaction_lease_key,
        )
        self._changed = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        self.loaded = False

    async def start(self) -> None:
        await self.view.start()
        await self.groups.start()
        await self.transactions.start()
        self._follower = asyncio.create_task(self._follow_view(), name="proxy-routes")
        self.loaded = True

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
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
        chosen = choose_coordinator(
            group_id, self.groups.holder(group_id), view.brokers.keys(), view.draining
        )
        return -1 if chosen is None else chosen

    def transaction_coordinator(self, transactional_id: str) -> int:
        view = self.view
        chosen = choose_coordinator(
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
