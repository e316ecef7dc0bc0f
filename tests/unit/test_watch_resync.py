"""A view whose watch lost history reloads it even when etcd does not answer the first reads.

The watch goes on after the compacted stretch (``Etcd.watch_prefix`` says RESYNC, then
continues), so a reload given up loses that stretch's changes for good: the view (the proxy's
routes, a broker's Metadata) kept a lease that had moved. Driven with an in-memory etcd whose
``get_prefix`` fails twice, as etcd does while it comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kafscale.broker.groups.leases import GroupLeases
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView, TopicInfo
from kafscale.broker.metadata.etcd import Etcd, WatchEvent, WatchEventKind
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import KeyValue

CLUSTER = "resync"


def kv(key: str, value: bytes) -> KeyValue:
    return KeyValue(key, value, 1, 1, 1, 0)


class CompactedEtcd:
    """Lists ``before`` at start, then the watch says RESYNC; ``get_prefix`` fails
    ``failures`` times before it lists ``after``."""

    def __init__(
        self,
        before: list[KeyValue],
        after: list[KeyValue],
        failures: int,
        error: type[MetadataError] = MetadataUnavailable,
    ) -> None:
        self.error = error
        self.before = before
        self.after = after
        self.failures = failures
        self.closed = False
        self.reads = 0
        self.started = False
        self.answered = asyncio.Event()  # set by the read that answers (the reload's)

    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]:
        return [e for e in self.before if e.key.startswith(prefix)], 10

    async def get_ranges_with_revision(
        self, ranges: list[tuple[str, str]]
    ) -> tuple[list[KeyValue], int]:
        """The first read lists ``before``; later ones are the reload's (see ``get_prefix``)."""
        if not self.started:
            self.started = True
            return [e for e in self.before if _within(e.key, ranges)], 10
        self.reads += 1
        if self.reads <= self.failures:
            raise self.error("etcd range failed: permission denied")
        self.answered.set()
        return [e for e in self.after if _within(e.key, ranges)], 30

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        self.reads += 1
        if self.reads <= self.failures:
            raise MetadataUnavailable("etcd get_prefix timed out after 5 s")
        self.answered.set()  # the caller applies the answer before it next yields
        return [e for e in self.after if e.key.startswith(prefix)]

    async def watch_prefix(self, prefix: str, start: int) -> AsyncIterator[WatchEvent]:
        yield WatchEvent(WatchEventKind.RESYNC, prefix, b"", 20)
        await asyncio.Event().wait()  # nothing more happens

    async def watch_range(
        self, first: str, end: str, start: int, on_state: object = None
    ) -> AsyncIterator[WatchEvent]:
        yield WatchEvent(WatchEventKind.RESYNC, first, b"", 20)
        await asyncio.Event().wait()  # nothing more happens

    async def pause(self, delay_s: float) -> None:
        await asyncio.sleep(0)


def _within(key: str, ranges: list[tuple[str, str]]) -> bool:
    return any(start <= key < end for start, end in ranges)


def cluster_keys(lease_owner: int) -> list[KeyValue]:
    return [
        kv(keys.topic_key(CLUSTER, "t"), TopicInfo("t", "id", 1).to_json()),
        kv(keys.broker_key(CLUSTER, 1), BrokerInfo(1, "h", 1).to_json()),
        kv(keys.broker_key(CLUSTER, 2), BrokerInfo(2, "h", 2).to_json()),
        kv(keys.partition_lease_key(CLUSTER, "t", 0), str(lease_owner).encode()),
        kv(keys.group_lease_key(CLUSTER, "g"), str(lease_owner).encode()),
    ]


async def test_cluster_view_retries_the_reload_after_lost_history() -> None:
    etcd = CompactedEtcd(cluster_keys(1), cluster_keys(2), failures=2)
    view = ClusterView(etcd, CLUSTER)  # type: ignore[arg-type]
    await view.start()
    try:
        assert view.owners == {("t", 0): 1}
        await asyncio.wait_for(etcd.answered.wait(), 5)
        assert view.owners == {("t", 0): 2}
        assert etcd.reads == 3
    finally:
        await view.close()


async def test_a_reload_etcd_refuses_is_retried_and_the_view_says_it_is_not_following() -> None:
    # Before, a refusal (not an outage) ended the view's follow task for good, without a word:
    # the view stayed as it was, and the broker ready.
    etcd = CompactedEtcd(cluster_keys(1), cluster_keys(2), failures=3, error=MetadataError)
    view = ClusterView(etcd, CLUSTER)  # type: ignore[arg-type]
    between_attempts: list[bool] = []

    async def pause(delay_s: float) -> None:
        between_attempts.append(view.following)
        await asyncio.sleep(0)

    etcd.pause = pause  # type: ignore[method-assign]
    await view.start()
    reloaded = view.changed  # set when the reload is applied
    try:
        await asyncio.wait_for(reloaded.wait(), 30)
        assert between_attempts == [False, False, False]  # refused: not following meanwhile
        assert view.following
        assert view.owners == {("t", 0): 2}
        assert etcd.reads == 4
    finally:
        await view.close()


async def test_group_leases_retry_the_reload_after_lost_history() -> None:
    etcd = CompactedEtcd(cluster_keys(1), cluster_keys(2), failures=2)
    changes: list[tuple[str, int | None]] = []
    leases = GroupLeases(etcd, CLUSTER, lambda g, o, _r: changes.append((g, o)))  # type: ignore[arg-type]
    await leases.start()
    try:
        await asyncio.wait_for(etcd.answered.wait(), 5)
        assert leases.owners == {"g": 2}
        assert changes == [("g", 2)]
    finally:
        await leases.close()


async def test_a_closed_client_ends_the_reload() -> None:
    etcd = CompactedEtcd(cluster_keys(1), cluster_keys(2), failures=10**9)
    etcd.closed = True
    view = ClusterView(etcd, CLUSTER)  # type: ignore[arg-type]
    await view.start()
    assert view._watch_task is not None
    await asyncio.wait_for(view._watch_task, 5)  # ends quietly instead of retrying forever
    assert view.owners == {("t", 0): 1}


def test_the_fake_has_the_adapter_calls_the_views_use() -> None:
    names = ("get_prefix_with_revision", "get_prefix", "watch_prefix", "pause", "closed")
    for name in (*names, "get_ranges_with_revision", "watch_range"):
        assert hasattr(Etcd, name)


async def test_a_registration_gone_in_the_lost_history_is_remembered_as_departed() -> None:
    """Metadata lists a departed broker for a grace period (``listed_brokers.with_departed``):
    one whose deletion fell in a compacted stretch departed too, seen by the reload."""
    without_2 = [e for e in cluster_keys(1) if e.key != keys.broker_key(CLUSTER, 2)]
    etcd = CompactedEtcd(cluster_keys(1), without_2, failures=0)
    view = ClusterView(etcd, CLUSTER, departed_grace_s=30.0)  # type: ignore[arg-type]
    await view.start()
    reloaded = view.changed
    try:
        await asyncio.wait_for(reloaded.wait(), 30)
        assert sorted(view.brokers) == [1]
        assert list(view.departed) == [2]
        assert view.departed[2].info == BrokerInfo(2, "h", 2)
    finally:
        await view.close()
