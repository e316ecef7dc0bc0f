"""Watches after etcd's history went back: etcd restored from a copy of its data directory (an
operator's recovery from a backup; etcd 3.5.1 losing writes on a crash looks the same). etcd
then answers at a lower revision and gives the revisions after it to new writes; a watch that
resumed at its last revision + 1 never saw those writes, and a view kept stale keys (a broker
that had deregistered, a high watermark etcd no longer has). Real etcd, stopped with SIGTERM
for each copy."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import TypeVar

import pytest
from harness.etcd import harness_etcd

from kafscale.broker.groups.leases import AFTER_EVERY_REVISION, GroupLeases
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd, WatchEvent, WatchEventKind
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.proxy.routes import RoutingTable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DEADLINE_S = 60.0  # generous: several engineers and a CI run share two cores
T = TypeVar("T")


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[Etcd]:
    client = await Etcd.connect([url], timeout_s=5.0)
    try:
        yield client
    finally:
        await client.close()


async def until_answered(call: Callable[[], Awaitable[T]]) -> T:
    """An etcd call right after a restart: retried while the channel reconnects."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return await call()
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def wait_until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:g} s: {what}")
        await asyncio.sleep(0.1)


async def back_up(server: EmbeddedEtcd, backup: Path) -> None:
    """Stop etcd (SIGTERM), copy its data directory to ``backup``, start it again."""
    await server.stop_async()
    await asyncio.to_thread(shutil.copytree, server.etcd_dir, backup)
    await server.start_async()


async def restore(server: EmbeddedEtcd, backup: Path) -> None:
    """Stop etcd, put the copy ``backup`` in place of its data directory, start it again."""
    await server.stop_async()
    await asyncio.to_thread(shutil.rmtree, server.etcd_dir)
    await asyncio.to_thread(shutil.copytree, backup, server.etcd_dir)
    await server.start_async()


class Follower:
    """What a watch's consumer holds: events applied, a RESYNC answered by a fresh read."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.prefix = prefix
        self.held: dict[str, bytes] = {}
        self.resyncs: list[WatchEvent] = []

    async def apply(self, event: WatchEvent) -> None:
        if event.kind is WatchEventKind.RESYNC:
            self.resyncs.append(event)
            entries = await until_answered(lambda: self.etcd.get_prefix(self.prefix))
            self.held = {entry.key: entry.value for entry in entries}
        elif event.kind is WatchEventKind.PUT:
            self.held[event.key] = event.value
        else:
            self.held.pop(event.key, None)


async def register(writer: Etcd, cluster: str, node_id: int) -> None:
    """Broker ``node_id``'s registration, as a broker writes it (retried through the restore)."""
    info = BrokerInfo(node_id, "127.0.0.1", 9000 + node_id)
    key = keys.broker_key(cluster, node_id)
    await until_answered(lambda: writer.put(key, info.to_json()))


async def fresh_read(etcd: Etcd, prefix: str) -> dict[str, bytes]:
    entries = await until_answered(lambda: etcd.get_prefix(prefix))
    return {entry.key: entry.value for entry in entries}


async def test_a_watch_follows_etcd_restored_to_an_older_copy(
    etcd_server_private: EmbeddedEtcd, tmp_path: Path
) -> None:
    """After the restore etcd's revision is below the watch's last one, and the few changes
    made then stay below it: the watch must resync and see them (it waited for revisions
    etcd's new writes would not reach for a long time)."""
    server, prefix = etcd_server_private, "/kafscale/restore/keys/"
    writer = await harness_etcd(server.client_url)
    try:
        async with connected(server.client_url) as client:
            follower = Follower(client, prefix)
            start = await writer.revision() + 1
            watch = client.watch_prefix(prefix, start)

            async def follow() -> None:
                async for event in watch:
                    await follower.apply(event)

            task = asyncio.create_task(follow())
            try:
                for i in range(3):
                    await writer.put(f"{prefix}{i}", b"before the backup")
                await back_up(server, tmp_path / "backup")
                for i in range(3, 13):  # the history the restore undoes
                    await until_answered(lambda i=i: writer.put(f"{prefix}{i}", b"undone"))
                await until_answered(lambda: writer.delete(f"{prefix}0"))
                await wait_until(
                    lambda: _equal(follower, writer, prefix), "the watch saw the later writes"
                )
                await restore(server, tmp_path / "backup")
                await until_answered(lambda: writer.put(f"{prefix}new", b"after the restore"))
                await until_answered(lambda: writer.delete(f"{prefix}1"))
                await wait_until(
                    lambda: _equal(follower, writer, prefix),
                    "the watch's consumer holds what etcd holds after the restore",
                )
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await watch.aclose()
        assert sorted(follower.held) == [f"{prefix}0", f"{prefix}2", f"{prefix}new"]
        assert [r.rewound for r in follower.resyncs] == [True]
    finally:
        await writer.close()


async def _equal(follower: Follower, etcd: Etcd, prefix: str) -> bool:
    return follower.held == await fresh_read(etcd, prefix)


async def test_a_watch_resyncs_when_new_writes_passed_its_revision_before_it_returned(
    etcd_server_private: EmbeddedEtcd, tmp_path: Path
) -> None:
    """Writers outpaced the watch's return: etcd's revision is past the watch's last one again,
    but holds other writes there. The revision number alone cannot tell; the write the watch
    last delivered, read at its revision, can."""
    server, prefix = etcd_server_private, "/kafscale/restore-passed/keys/"
    writer = await harness_etcd(server.client_url)
    try:
        async with connected(server.client_url) as client:
            follower = Follower(client, prefix)
            start = await writer.revision() + 1
            async with aclosing(client.watch_prefix(prefix, start)) as events:
                await writer.put(f"{prefix}a", b"before the backup")
                await follower.apply(await asyncio.wait_for(anext(events), DEADLINE_S))
                await back_up(server, tmp_path / "backup")
                for i in range(5):
                    await until_answered(lambda i=i: writer.put(f"{prefix}undone{i}", b"x"))
                for _ in range(5):
                    await follower.apply(await asyncio.wait_for(anext(events), DEADLINE_S))
                last_seen = max(await until_answered(writer.revision), start)
                # The consumer does not iterate now: the watch comes back only after this.
                await restore(server, tmp_path / "backup")
                revision = 0
                for i in range(8):  # past the watch's last revision, in the new history
                    revision = await until_answered(
                        lambda i=i: writer.put(f"{prefix}redone{i}", b"y")
                    )
                await until_answered(lambda: writer.delete(f"{prefix}a"))
                assert revision > last_seen
                first = await asyncio.wait_for(anext(events), DEADLINE_S)
                assert first.kind is WatchEventKind.RESYNC, first  # not a write of the new history
                assert first.rewound
                await follower.apply(first)
                await wait_until(
                    lambda: _equal(follower, writer, prefix), "the consumer holds etcd's keys"
                )
                assert sorted(follower.held) == [f"{prefix}redone{i}" for i in range(8)]
    finally:
        await writer.close()


async def test_a_cluster_view_drops_a_broker_deregistered_after_a_restore(
    etcd_server_private: EmbeddedEtcd, tmp_path: Path
) -> None:
    """The proxy's and every broker's view: a broker that deregistered after the restore is
    gone from it (the proxy routed to it before), one registered only in the undone history is
    gone, and partition states are etcd's again (high watermarks go back with the restore)."""
    server, cluster = etcd_server_private, "restored"
    tp = ("t", 0)
    writer = await harness_etcd(server.client_url)
    try:
        async with connected(server.client_url) as client:

            async def commit(high_watermark: int) -> None:
                key = keys.partition_state_key(cluster, *tp)
                document = PartitionState(high_watermark=high_watermark).to_json()
                await until_answered(lambda: writer.put(key, document))

            await register(writer, cluster, 1)
            await register(writer, cluster, 2)
            await commit(10)
            view = ClusterView(client, cluster)
            await view.start()
            try:
                await back_up(server, tmp_path / "backup")
                await register(writer, cluster, 3)
                await commit(20)
                for i in range(10):  # other writes of the undone history
                    await until_answered(lambda i=i: writer.put(f"/elsewhere/{i}", b"x"))

                async def later_history_seen() -> bool:
                    state = view.states.get(tp)
                    return (
                        set(view.brokers) == {1, 2, 3}
                        and state is not None
                        and (state.high_watermark == 20)
                    )

                await wait_until(later_history_seen, "the view saw broker 3 and the commit")
                await restore(server, tmp_path / "backup")
                await until_answered(lambda: writer.delete(keys.broker_key(cluster, 2)))

                async def as_etcd_has_it() -> bool:
                    state = view.states.get(tp)
                    return (
                        set(view.brokers) == {1}
                        and state is not None
                        and state.high_watermark == 10
                        and view.following
                    )

                await wait_until(as_etcd_has_it, "the view holds etcd's brokers and states")
                fresh = ClusterView(writer, cluster)
                await fresh.start()
                try:
                    assert view.brokers == fresh.brokers
                    assert view.states == fresh.states
                finally:
                    await fresh.close()
            finally:
                await view.close()
    finally:
        await writer.close()


async def test_group_lease_holders_are_etcds_after_a_restore(
    etcd_server_private: EmbeddedEtcd, tmp_path: Path
) -> None:
    """The proxy's and each coordinator's record of group lease holders: a group whose lease
    moved after the backup is held by its old holder again in etcd, and the follower says so
    (as a change newer than any lease's create revision: a coordinator lets the group go)."""
    server, cluster = etcd_server_private, "restored-groups"
    writer = await harness_etcd(server.client_url)
    changes: list[tuple[str, int | None, int]] = []
    try:
        async with connected(server.client_url) as client:
            key = keys.group_lease_key(cluster, "g")
            await writer.put(key, b"1")
            leases = GroupLeases(client, cluster, lambda *change: changes.append(change))
            await leases.start()
            try:
                await back_up(server, tmp_path / "backup")
                await until_answered(lambda: writer.put(key, b"2"))
                for i in range(10):  # other writes of the undone history
                    await until_answered(lambda i=i: writer.put(f"/elsewhere/{i}", b"x"))

                async def moved() -> bool:
                    return leases.owners == {"g": 2}

                await wait_until(moved, "the follower saw the lease move to broker 2")
                await restore(server, tmp_path / "backup")

                async def as_etcd_has_it() -> bool:
                    return leases.owners == {"g": 1}

                await wait_until(as_etcd_has_it, "the follower holds etcd's holder again")
            finally:
                await leases.close()
        assert changes[-1] == ("g", 1, AFTER_EVERY_REVISION)
    finally:
        await writer.close()


async def test_the_proxy_stops_routing_to_a_broker_that_deregistered_after_a_restore(
    etcd_server_private: EmbeddedEtcd, tmp_path: Path
) -> None:
    """The proxy's routing table: broker 2 owned the partition at the backup; after the restore
    it deregisters (its registration and lease key deleted). The proxy must route the partition
    to broker 1, the one etcd lists, not keep sending it to broker 2."""
    server, cluster = etcd_server_private, "restored-proxy"
    tp = ("t", 0)
    writer = await harness_etcd(server.client_url)
    try:
        async with connected(server.client_url) as client:
            await register(writer, cluster, 1)
            await register(writer, cluster, 2)
            await writer.put(keys.partition_lease_key(cluster, *tp), b"2")
            routes = RoutingTable(client, cluster)
            await routes.start()
            try:
                await back_up(server, tmp_path / "backup")
                await register(writer, cluster, 3)
                for i in range(10):  # other writes of the undone history
                    await until_answered(lambda i=i: writer.put(f"/elsewhere/{i}", b"x"))

                async def sees_broker_3() -> bool:
                    return set(routes.view.brokers) == {1, 2, 3}

                await wait_until(sees_broker_3, "the proxy saw broker 3 register")
                assert routes.partition_owner(tp) == 2
                await restore(server, tmp_path / "backup")
                await until_answered(lambda: writer.delete(keys.partition_lease_key(cluster, *tp)))
                await until_answered(lambda: writer.delete(keys.broker_key(cluster, 2)))

                async def routes_to_broker_1() -> bool:
                    return set(routes.view.brokers) == {1} and routes.partition_owner(tp) == 1

                await wait_until(routes_to_broker_1, "the proxy routes to the broker etcd lists")
            finally:
                await routes.close()
    finally:
        await writer.close()
