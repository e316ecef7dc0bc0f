"""Group leases and fencing against a real etcd, with the coordinator in this process.

One coordinator per group: the lease is taken create-if-absent; a second broker cannot take it;
every write compares the lease (owner and create revision) so a coordinator whose lease moved
cannot write; a lease appearing for another broker, or a lost session, drops the local group
and tells waiting members NOT_COORDINATOR; etcd unreachable is never "proceed anyway".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from harness.coordinator_host import CoordinatorHost, HostView, join_request
from harness.subscribed_groups import member_heartbeat

from kafscale.broker.groups.consumer import HeartbeatResult as Answer
from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.leases import GroupLeases, choose_coordinator
from kafscale.broker.groups.model import (
    GroupConfig,
    GroupRecord,
    GroupState,
    SyncRequest,
)
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.store import (
    CommittedOffset,
    Fence,
    GroupStore,
    LoadedGroup,
    TopicPartition,
    decode_group,
    decode_offset,
)
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.protocol.errors import ErrorCode, NotCoordinator

pytestmark = pytest.mark.integration

CONFIG = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1000)


@pytest.fixture
async def hosts(
    etcd: Etcd, cluster_name: str
) -> AsyncIterator[list[tuple[CoordinatorHost, GroupCoordinator]]]:
    view = HostView({n: BrokerInfo(n, "127.0.0.1", 9000 + n) for n in (1, 2)})
    made = []
    for node_id in (1, 2):
        session = await SessionLease.start(etcd, 10)
        host = CoordinatorHost(etcd, session, node_id, cluster_name, view)
        coordinator = GroupCoordinator(host, CONFIG)  # type: ignore[arg-type]
        await coordinator.start()
        made.append((host, coordinator))
    try:
        yield made
    finally:
        for host, coordinator in made:
            await coordinator.close()
            await host.session.revoke()


async def eventually(check: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_one_coordinator_per_group(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    (host1, c1), (_, c2) = hosts
    runtime = await c1.runtime("orders")
    assert await c1.runtime("orders") is runtime
    with pytest.raises(NotCoordinator):
        await c2.runtime("orders")
    lease = await host1.etcd.get(keys.group_lease_key(host1.cluster, "orders"))
    assert lease is not None and lease.value == b"1" and lease.lease == host1.session.id
    await eventually(lambda: c2.coordinator_for("orders") == host1.view.brokers[1])
    # Concurrent first requests share one acquisition.
    many = await asyncio.gather(*(c2.runtime("payments") for _ in range(10)))
    assert len({id(r) for r in many}) == 1


async def test_offsets_survive_the_coordinator(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    (host1, c1), (_, c2) = hosts
    runtime = await c1.runtime("g")
    offsets = {("t", p): CommittedOffset(p * 10, 3, "m", 1) for p in range(250)}
    assert await runtime.commit("", None, -1, offsets) is ErrorCode.NONE  # several txns
    joined = await runtime.join(join_request())
    assert joined.error is ErrorCode.NONE and joined.generation_id == 1
    sync = SyncRequest(joined.member_id, 1, None, None, None, {joined.member_id: b"t-0..249"})
    assert (await runtime.sync(sync)).assignment == b"t-0..249"
    await host1.session.revoke()  # the coordinator goes away: its group lease with it
    host1.session.lost.set()
    await eventually(lambda: c1.local("g") is None)
    moved = await c2.runtime("g")
    assert moved.committed([("t", 7), ("t", 999)]) == {
        ("t", 7): offsets[("t", 7)],
        ("t", 999): None,
    }
    assert len(moved.committed(None)) == 250
    assert moved.group is not None and moved.group.state is GroupState.STABLE
    assert moved.group.generation == 1
    # The member carries on at the new coordinator without rejoining.
    assert moved.heartbeat(joined.member_id, None, 1) is ErrorCode.NONE
    again = await moved.sync(SyncRequest(joined.member_id, 1, None, None, None, {}))
    assert again.assignment == b"t-0..249"


async def test_write_fenced_after_the_lease_moved(etcd: Etcd, cluster_name: str) -> None:
    session = await SessionLease.start(etcd, 10)
    leases = GroupLeases(etcd, cluster_name, lambda *_: None)
    fence = await leases.acquire("g", 1, session.id)
    assert fence is not None
    assert await leases.acquire("g", 2, session.id + 1) is None
    store = GroupStore(etcd, cluster_name)
    lost: list[str] = []
    runtime = GroupRuntime(
        "g", fence, store, CONFIG, LoadedGroup(None, {}), lambda _, why: lost.append(why)
    )
    try:
        assert await runtime.commit("", None, -1, {("t", 0): CommittedOffset(5)}) is ErrorCode.NONE
        # The lease expired and broker 2 took it before this broker heard of it.
        await etcd.delete(fence.key)
        await etcd.put(fence.key, b"2")
        error = await runtime.commit("", None, -1, {("t", 0): CommittedOffset(99)})
        assert error is ErrorCode.NOT_COORDINATOR
        assert lost, "the runtime reports the lost lease"
        stored = await etcd.get(keys.group_offset_key(cluster_name, "g", "t", 0))
        assert stored is not None and decode_offset(stored.value).offset == 5
        # Same owner value, but a newer lease (create revision): still not ours.
        await etcd.delete(fence.key)
        await etcd.put(fence.key, b"1")
        assert not await store.save_offsets("g", {("t", 0): CommittedOffset(7)}, fence)
    finally:
        for task in runtime.unload():
            await asyncio.gather(task, return_exceptions=True)
        await session.revoke()


async def test_lease_taken_elsewhere_drops_the_group_and_its_waiters(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    (host1, c1), _ = hosts
    runtime = await c1.runtime("g")
    first = await runtime.join(join_request())
    waiting = asyncio.create_task(runtime.join(join_request()))  # a rebalance, waits
    await asyncio.sleep(0.05)
    assert not waiting.done()
    lease_key = keys.group_lease_key(host1.cluster, "g")
    await host1.etcd.delete(lease_key)
    await host1.etcd.put(lease_key, b"2")
    result = await asyncio.wait_for(waiting, 5)
    assert result.error is ErrorCode.NOT_COORDINATOR
    assert c1.local("g") is None
    with pytest.raises(NotCoordinator):  # a dropped runtime takes no more work
        runtime.heartbeat(first.member_id, None, first.generation_id)


async def test_own_lease_from_a_lost_session_is_retaken(etcd: Etcd, cluster_name: str) -> None:
    old_session = await SessionLease.start(etcd, 30)
    new_session = await SessionLease.start(etcd, 30)
    leases = GroupLeases(etcd, cluster_name, lambda *_: None)
    try:
        old = await leases.acquire("g", 1, old_session.id)
        assert old is not None
        assert await leases.acquire("g", 2, new_session.id) is None  # someone else: no
        new = await leases.acquire("g", 1, new_session.id)  # this broker, new session: yes
        assert new is not None and new.create_revision > old.create_revision
        current = await etcd.get(old.key)
        assert current is not None and current.lease == new_session.id
    finally:
        await old_session.revoke()
        await new_session.revoke()


async def test_session_lost_drops_every_group(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    (host1, c1), _ = hosts
    for name in ("a", "b"):
        await c1.runtime(name)
    host1.session.lost.set()
    await eventually(lambda: c1.local("a") is None and c1.local("b") is None)
    with pytest.raises(NotCoordinator):
        await c1.runtime("a")
    host1.session = await SessionLease.start(host1.etcd, 10)  # the broker's new session
    await eventually(lambda: True)
    await c1.runtime("c")


async def test_etcd_unreachable_never_proceeds(
    etcd_server_private: EmbeddedEtcd, cluster_name: str
) -> None:
    etcd = await Etcd.connect([etcd_server_private.client_url], timeout_s=0.5)
    session = await SessionLease.start(etcd, 30)
    host = CoordinatorHost(etcd, session, 1, cluster_name, HostView({1: BrokerInfo(1, "h", 1)}))
    coordinator = GroupCoordinator(host, CONFIG)  # type: ignore[arg-type]
    await coordinator.start()
    try:
        runtime = await coordinator.runtime("held")
        await etcd_server_private.stop_async()
        with pytest.raises(MetadataUnavailable):
            await coordinator.runtime("new")
        error = await runtime.commit("", None, -1, {("t", 0): CommittedOffset(1)})
        assert error is ErrorCode.REQUEST_TIMED_OUT
        assert runtime.committed([("t", 0)]) == {("t", 0): None}
    finally:
        await coordinator.close()
        await session.close()
        await etcd.close()


async def test_store_writes_nothing_without_the_lease(etcd: Etcd, cluster_name: str) -> None:
    store = GroupStore(etcd, cluster_name)
    fence = Fence(keys.group_lease_key(cluster_name, "g"), b"1", 12345)
    assert not await store.save_group("g", GroupRecord("consumer", 1, "range", None), fence)
    assert not await store.save_offsets("g", {("t", 0): CommittedOffset(1)}, fence)
    assert (await store.load("g")).exists is False


BOTH = frozenset({("t", 0), ("t", 1)})


@dataclass
class HandedOver:
    """A consumer group of two members on a real coordinator runtime: "a" took both partitions,
    "b" joined, and "a" gave ``freed`` up for b and said so; b has not been told yet."""

    etcd: Etcd
    store: GroupStore
    heartbeat: Callable[[str, int, frozenset[TopicPartition] | None], Coroutine[Any, Any, Answer]]
    b_epoch: int
    freed: frozenset[TopicPartition]


class HeldStore(GroupStore):
    """A ``GroupStore`` whose next group write, once armed, waits until let go and then fails
    as a timed-out etcd call does: a write on its way for as long as a test needs."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        super().__init__(etcd, cluster)
        self.reached, self.let_go = asyncio.Event(), asyncio.Event()
        self.armed = False

    async def save_group(self, group_id: str, record: GroupRecord, fence: Fence) -> bool:
        if not self.armed:
            return await super().save_group(group_id, record, fence)
        self.armed = False
        self.reached.set()
        await self.let_go.wait()
        raise MetadataUnavailable("etcd txn timed out (held by the test)")


@contextlib.asynccontextmanager
async def handed_over(
    server: EmbeddedEtcd, cluster: str, store: type[GroupStore] = GroupStore
) -> AsyncIterator[HandedOver]:
    etcd = await Etcd.connect([server.client_url], timeout_s=1.0)
    session = await SessionLease.start(etcd, 60)
    fence = await GroupLeases(etcd, cluster, lambda *_: None).acquire("g", 1, session.id)
    assert fence is not None
    group_store = store(etcd, cluster)
    runtime = GroupRuntime("g", fence, group_store, CONFIG, LoadedGroup(None, {}), lambda *_: None)

    async def heartbeat(member: str, epoch: int, owned: frozenset[TopicPartition] | None) -> Answer:
        names = ("t",) if epoch == 0 else None
        request = member_heartbeat(member, epoch, names, owned)
        return await runtime.consumer_heartbeat(request, {"t": 2})

    try:
        a = await heartbeat("a", 0, frozenset())
        assert a.assignment == BOTH
        b = await heartbeat("b", 0, frozenset())
        assert b.error is ErrorCode.NONE and b.assignment == frozenset()  # a holds both
        a = await heartbeat("a", a.member_epoch, BOTH)  # a is told to give one up ...
        assert a.assignment is not None and len(a.assignment) == 1
        await heartbeat("a", a.member_epoch, a.assignment)  # ... and has
        yield HandedOver(etcd, group_store, heartbeat, b.member_epoch, BOTH - a.assignment)
    finally:
        for task in runtime.unload():
            await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):
            await session.revoke()
        await etcd.close()


async def test_a_member_is_never_told_what_a_failed_write_left_out_of_etcd(
    etcd_server_private: EmbeddedEtcd, cluster_name: str
) -> None:
    """A consumer-group change whose write failed (etcd down) is not in etcd. The member's
    retry changes nothing more in memory, yet it must write the group before it is answered:
    otherwise the member consumes a partition that etcd, and so the next coordinator, says
    nobody holds (a coordinator move then gives it to a second member)."""
    async with handed_over(etcd_server_private, cluster_name) as group:
        await etcd_server_private.stop_async()
        failed = await group.heartbeat("b", group.b_epoch, frozenset())  # b's share: not stored
        assert failed.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        await etcd_server_private.start_async()
        # The retry is not a full request (no owned partitions): the answer it never got must
        # still come with it.
        deadline = asyncio.get_running_loop().time() + 30
        retried = await group.heartbeat("b", group.b_epoch, None)
        while retried.error is ErrorCode.COORDINATOR_NOT_AVAILABLE:  # etcd reconnecting
            assert asyncio.get_running_loop().time() < deadline, "etcd never came back"
            await asyncio.sleep(0.2)
            retried = await group.heartbeat("b", group.b_epoch, None)
        assert retried.error is ErrorCode.NONE and retried.assignment == group.freed
        stored = await group.etcd.get(keys.group_metadata_key(cluster_name, "g"))
        assert stored is not None
        document = decode_group(stored.value).consumer
        assert document is not None
        held = {m["member_id"]: m["assigned"] for m in document["members"]}
        assert held["b"] == [list(tp) for tp in sorted(group.freed)]


async def test_a_retry_while_the_write_is_on_its_way_waits_for_that_write(
    etcd_server_private: EmbeddedEtcd, cluster_name: str
) -> None:
    """etcd is slow: a member's heartbeat changed the group and waits for the write. The member
    retries (its request timed out, its connection dropped): the retry changes nothing more in
    memory, yet it must not be answered before that write is in etcd. Answered from memory at
    once, it is told a partition that, once the write fails, etcd (and so the next
    coordinator) gives nobody: a coordinator move hands it to a second consumer."""
    async with handed_over(etcd_server_private, cluster_name, HeldStore) as group:
        store = group.store
        assert isinstance(store, HeldStore)
        store.armed = True
        first = asyncio.create_task(group.heartbeat("b", group.b_epoch, frozenset()))
        await asyncio.wait_for(store.reached.wait(), 30)  # b's share is on its way to etcd
        retried = asyncio.create_task(group.heartbeat("b", group.b_epoch, None))
        await asyncio.sleep(0.5)  # long enough to be answered if it did not wait
        assert not retried.done() and not first.done()
        store.let_go.set()  # the write fails
        assert (await first).error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        # The retry waited for the write and shares its outcome: nothing etcd lacks was told.
        assert (await retried).error is ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_a_coordinator_stopping_with_its_cluster_takes_on_no_group(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    """``stop_claiming`` (a whole-cluster stop, ``kafscale local``): a group nobody holds (one a
    stopping sibling let go) is not claimed here: NOT_COORDINATOR, and no lease written. The
    groups held here are still served until ``close``."""
    (host1, c1), _ = hosts
    held = await c1.runtime("held")
    c1.stop_claiming()
    with pytest.raises(NotCoordinator):
        await c1.runtime("orders")
    assert await host1.etcd.get(keys.group_lease_key(host1.cluster, "orders")) is None
    assert await c1.runtime("held") is held


async def test_a_drained_coordinator_hands_a_rebalancing_group_over_and_takes_none_on(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    """``hand_over`` (``POST /drain``): a JoinGroup waiting in a rebalance at the drained
    coordinator is answered NOT_COORDINATOR (the member rejoins at the next coordinator), the
    group's lease is gone from etcd, the other broker takes the group on, FindCoordinator at the
    drained one names the other, and it takes no group on until its draining mark is removed."""
    (host1, c1), (_, c2) = hosts
    runtime = await c1.runtime("g")
    await runtime.join(join_request())
    waiting = asyncio.create_task(runtime.join(join_request()))  # a rebalance, waits
    await asyncio.sleep(0.05)
    assert not waiting.done()
    host1.draining = True  # as Broker._mark_draining does, before the hand-off
    host1.view.draining.add(1)
    await c1.hand_over()
    assert (await asyncio.wait_for(waiting, 5)).error is ErrorCode.NOT_COORDINATOR
    assert await host1.etcd.get(keys.group_lease_key(host1.cluster, "g")) is None
    assert c1.handing_over and c1.local("g") is None
    taken = c1.coordinator_for("g")
    assert taken is not None and taken.node_id == 2
    assert await c2.runtime("g") is not None
    with pytest.raises(NotCoordinator):
        await c1.runtime("other")
    assert await host1.etcd.get(keys.group_lease_key(host1.cluster, "other")) is None
    host1.draining = False  # the mark removed (Broker._reconcile)
    host1.view.draining.discard(1)
    assert not c1.handing_over
    await c1.runtime("other")


def named(coordinator: GroupCoordinator, group_id: str) -> int | None:
    """The node FindCoordinator names for ``group_id`` at ``coordinator``'s broker."""
    broker = coordinator.coordinator_for(group_id)
    return None if broker is None else broker.node_id


async def test_a_release_seen_before_the_draining_mark_never_names_the_drained_broker(
    etcd: Etcd, cluster_name: str
) -> None:
    """A drained broker writes its draining mark, then releases its groups; another broker
    follows the two in different watches (its cluster view, its group leases), which keep no
    order between them. Here its view has not brought the mark (it stopped following: the lag
    made to last) when its lease watch brings the release: FindCoordinator there names the
    drained broker while it holds the lease (nothing told it of the drain yet), then the
    other broker; never the drained one as the group's pick among the live brokers, where it
    would refuse the group. The group is one whose pick among both brokers is the drained one."""
    sessions = {node: await SessionLease.start(etcd, 10) for node in (1, 2)}
    for node, session in sessions.items():
        info = BrokerInfo(node, "127.0.0.1", 9000 + node)
        await etcd.put(keys.broker_key(cluster_name, node), info.to_json(), lease=session.id)
    view = ClusterView(etcd, cluster_name)
    await view.start()
    await view.close()  # from here on it brings nothing: the draining mark's event is late
    group = next(
        g for g in (f"g{n}" for n in range(1000)) if choose_coordinator(g, None, [1, 2]) == 1
    )
    observer = GroupCoordinator(CoordinatorHost(etcd, sessions[2], 2, cluster_name, view), CONFIG)  # type: ignore[arg-type]
    await observer.start()
    drained = GroupLeases(etcd, cluster_name, lambda *_: None)
    await drained.start()
    try:
        fence = await drained.acquire(group, 1, sessions[1].id)
        assert fence is not None
        await eventually(lambda: named(observer, group) == 1)  # the holder
        mark = keys.draining_key(cluster_name, 1)
        await etcd.put(mark, b'{"reason":"drain"}', lease=sessions[1].id)  # Broker.drain's order
        await drained.release(fence)
        answers = []
        deadline = asyncio.get_running_loop().time() + 5.0
        while asyncio.get_running_loop().time() < deadline and named(observer, group) != 2:
            answers.append(named(observer, group))
            await asyncio.sleep(0.01)
        assert named(observer, group) == 2, (
            f"FindCoordinator named {named(observer, group)} for {group} after its release by "
            f"the drained broker 1 (answers meanwhile: {sorted(set(answers), key=str)})"
        )
        assert 1 in view.draining  # read up to the release, before it was applied
    finally:
        await drained.close()
        await observer.close()
        for session in sessions.values():
            await session.revoke()


async def test_the_next_coordinator_waits_for_a_draining_holder_to_let_the_group_go(
    hosts: list[tuple[CoordinatorHost, GroupCoordinator]],
) -> None:
    """From a broker's draining mark on, FindCoordinator names the next coordinator while the
    drained broker still holds the group's lease; the first request there waits for the
    release (the drained broker lets its groups go at once) and is served, where it was told
    NOT_COORDINATOR and sent to FindCoordinator again after its back-off."""
    (host1, c1), (host2, c2) = hosts
    # picked at 2 while nobody holds it: broker 2 names 1 only once its watch shows the lease
    group = next(
        g for g in (f"g{n}" for n in range(1000)) if choose_coordinator(g, None, [1, 2]) == 2
    )
    await c1.runtime(group)
    await eventually(lambda: c2.coordinator_for(group) == host2.view.brokers[1])
    host1.draining = True  # as Broker._mark_draining does, before the hand-off
    host1.view.draining.add(1)  # the mark, as every broker's view brings it
    taken = c2.coordinator_for(group)
    assert taken is not None and taken.node_id == 2, "the next coordinator, at once"
    waiting = asyncio.create_task(c2.runtime(group))
    await asyncio.sleep(0.3)  # more than one recheck of the lease (RELEASE_RECHECK_S)
    assert not waiting.done(), "answered before the drained broker let the group go"
    await c1.hand_over()
    runtime = await asyncio.wait_for(waiting, 10)
    assert runtime.fence.owner == b"2"
