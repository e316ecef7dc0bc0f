"""Letting go of idle groups (``groups.release``), with the coordinator in this process against a
real etcd: a group nobody is in and nobody asked for lately is let go (no runtime, no lease in
etcd) even though it keeps committed offsets; it answers as before when asked for again, is
still listed, and its offsets still expire at the right time after it was let go and taken on
again by a retention check. Retention checks are run by hand
(``GroupCoordinator.expire_offsets``); the letting go runs on the coordinator's own timer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from harness.coordinator_host import (
    Coordinated,
    CoordinatorHost,
    hand_checked_retention,
    join_request,
    running_coordinator,
)

from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.model import GroupRecord, GroupState, SyncRequest
from kafscale.broker.groups.retention_runtime import wall_clock_ms
from kafscale.broker.groups.store import CommittedOffset, decode_group, encode_group, encode_offset
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

RETENTION_MS = 4_000
IDLE_RELEASE_MS = 300
CONFIG = hand_checked_retention(RETENTION_MS, idle_release_ms=IDLE_RELEASE_MS)
DEADLINE_S = 60.0
TP = ("t", 0)


@pytest.fixture
async def coordinated(etcd_server: EmbeddedEtcd, cluster_name: str) -> AsyncIterator[Coordinated]:
    async with running_coordinator(etcd_server.client_url, cluster_name, CONFIG) as running:
        yield Coordinated(*running)


async def _eventually(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _record(host: CoordinatorHost, group_id: str) -> GroupRecord | None:
    kv = await host.etcd.get(keys.group_metadata_key(host.cluster, group_id))
    return None if kv is None else decode_group(kv.value)


async def _let_go(host: CoordinatorHost, coordinator: GroupCoordinator, group_id: str) -> None:
    """Wait until the coordinator let go of the group: no runtime, and no lease in etcd."""
    await _eventually(lambda: coordinator.local(group_id) is None, f"{group_id} let go")
    lease_key = keys.group_lease_key(host.cluster, group_id)
    deadline = time.monotonic() + DEADLINE_S
    while await host.etcd.get(lease_key) is not None:
        assert time.monotonic() < deadline, "the group lease was not given back"
        await asyncio.sleep(0.05)


async def _committed_and_left(coordinator: GroupCoordinator, group_id: str) -> None:
    """A classic consumer joins, commits offset 7 of ``TP`` and leaves (the group is Empty)."""
    runtime = await coordinator.runtime(group_id)
    joined = await runtime.join(join_request())
    assert joined.error is ErrorCode.NONE
    member = joined.member_id
    synced = await runtime.sync(SyncRequest(member, 1, None, None, None, {member: b"a"}))
    assert synced.error is ErrorCode.NONE
    offsets = {TP: CommittedOffset(7, commit_timestamp_ms=wall_clock_ms())}
    assert await runtime.commit(member, None, 1, offsets) is ErrorCode.NONE
    assert runtime.leave([(member, None)])[0] is ErrorCode.NONE


async def _empty_time_stored(host: CoordinatorHost, group_id: str) -> int:
    """The Empty time of the group's stored record, once etcd has one without members."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        record = await _record(host, group_id)
        if record is not None and not record.has_members() and record.empty_since_ms is not None:
            return record.empty_since_ms
        assert time.monotonic() < deadline, "the Empty record was not stored"
        await asyncio.sleep(0.05)


async def test_a_group_whose_consumer_committed_and_left_is_let_go_and_answers_as_before(
    coordinated: Coordinated,
) -> None:
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"idle-{uuid.uuid4().hex[:6]}"
    await _committed_and_left(coordinator, group_id)
    await _empty_time_stored(host, group_id)
    before = coordinator.local(group_id)
    assert before is not None
    described = before.describe()
    committed = before.committed([TP])
    assert described.state is GroupState.EMPTY
    listed_before = [g for g in await coordinator.list_groups() if g.group_id == group_id]

    await _let_go(host, coordinator, group_id)
    assert coordinator.held()["groups"] == 0

    # ListGroups lists it from etcd, as it listed the coordinated group.
    listed = [g for g in await coordinator.list_groups() if g.group_id == group_id]
    assert listed == listed_before
    assert listed[0].state == "Empty" and listed[0].protocol_type == "consumer"
    # Asked for again (OffsetFetch, DescribeGroups): reloaded, the same answers.
    again = await coordinator.runtime(group_id)
    assert again is not before
    assert again.committed([TP]) == committed
    assert committed[TP] is not None and committed[TP].offset == 7
    assert again.describe() == described
    # A consumer joining again finds the group as it left it.
    joined = await again.join(join_request())
    assert joined.error is ErrorCode.NONE


async def test_an_empty_record_without_empty_time_gets_it_stored_before_the_group_goes(
    coordinated: Coordinated,
) -> None:
    """A record from before the Empty time was stored: a reload counts from its own load, so
    a group let go and taken on again at every check would never expire. It is let go only once
    etcd has the Empty time this coordinator counts from (its first load), and a later check
    that takes the group on again expires its offsets one retention after that first load."""
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"untimed-{uuid.uuid4().hex[:6]}"
    record = GroupRecord("consumer", 3, None, None, empty_since_ms=None)
    await host.etcd.put(keys.group_metadata_key(host.cluster, group_id), encode_group(record))
    long_ago = CommittedOffset(7, commit_timestamp_ms=wall_clock_ms() - 10 * RETENTION_MS)
    await host.etcd.put(keys.group_offset_key(host.cluster, group_id, *TP), encode_offset(long_ago))

    before_load = wall_clock_ms()
    runtime = await coordinator.runtime(group_id)
    after_load = wall_clock_ms()
    assert runtime.committed([TP])[TP] is not None  # counted from the load: kept
    await _let_go(host, coordinator, group_id)
    stored = await _record(host, group_id)
    assert stored is not None and stored.generation == 3 and not stored.has_members()
    assert stored.empty_since_ms is not None
    assert before_load <= stored.empty_since_ms <= after_load

    # One retention after the first load, a check takes the group on again (a new load): its
    # offset expires by the stored time, and the Empty group without offsets is deleted.
    await asyncio.sleep(max(0, stored.empty_since_ms + RETENTION_MS - wall_clock_ms()) / 1000 + 0.1)
    await coordinator.expire_offsets()
    entries = await host.etcd.get_prefix(keys.group_prefix(host.cluster, group_id))
    assert entries == []


async def test_offsets_still_expire_at_the_right_time_after_the_group_was_let_go(
    coordinated: Coordinated,
) -> None:
    """Let go, then taken on again by retention checks: kept before one retention from the
    Empty time, expired (and the group deleted) after it."""
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"expiring-{uuid.uuid4().hex[:6]}"
    await _committed_and_left(coordinator, group_id)
    empty_since = await _empty_time_stored(host, group_id)
    await _let_go(host, coordinator, group_id)

    await coordinator.expire_offsets()  # takes the group on again
    checked_by = wall_clock_ms()
    runtime = coordinator.local(group_id)
    assert runtime is not None, "the retention check did not take the let-go group on"
    if checked_by < empty_since + RETENTION_MS:  # (else the machine was too slow to tell)
        assert runtime.committed([TP])[TP] is not None
        await _let_go(host, coordinator, group_id)  # idle again: let go again

    await asyncio.sleep(max(0, empty_since + RETENTION_MS - wall_clock_ms()) / 1000 + 0.1)
    await coordinator.expire_offsets()
    entries = await host.etcd.get_prefix(keys.group_prefix(host.cluster, group_id))
    assert entries == []
    assert coordinator.local(group_id) is None


async def test_a_group_with_a_member_is_not_let_go(
    coordinated: Coordinated,
) -> None:
    """A member in the group (it stops heartbeating for less than its session) keeps it,
    however long nobody else asks for it."""
    coordinator = coordinated.coordinator
    group_id = f"busy-{uuid.uuid4().hex[:6]}"
    runtime = await coordinator.runtime(group_id)
    joined = await runtime.join(join_request(timeout_ms=30_000))
    member = joined.member_id
    synced = await runtime.sync(SyncRequest(member, 1, None, None, None, {member: b"a"}))
    assert synced.error is ErrorCode.NONE
    offsets = {TP: CommittedOffset(7, commit_timestamp_ms=wall_clock_ms())}
    assert await runtime.commit(member, None, 1, offsets) is ErrorCode.NONE
    later = time.monotonic() + 100 * IDLE_RELEASE_MS / 1000
    assert coordinator.release_due(later) == []
    await asyncio.sleep(5 * IDLE_RELEASE_MS / 1000)
    assert coordinator.local(group_id) is runtime
