"""Offset retention across coordinator moves, with the coordinator in this process against a
real etcd: the group's empty time is stored with it, a new coordinator counts from that time,
and never from earlier than it can know (a record from before the time was stored counts from
the load). Each check is run by hand (``GroupCoordinator.expire_offsets``), not on a timer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from harness.coordinator_host import (
    Coordinated,
    CoordinatorHost,
    hand_checked_retention,
    join_request,
    running_coordinator,
)

from kafscale.broker.groups.model import GroupRecord, SyncRequest
from kafscale.broker.groups.retention_runtime import wall_clock_ms
from kafscale.broker.groups.store import (
    CommittedOffset,
    decode_group,
    encode_group,
    encode_offset,
    parse_group_key,
)
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

RETENTION_MS = 60_000
CONFIG = hand_checked_retention(RETENTION_MS)


@pytest.fixture
async def coordinated(etcd_server: EmbeddedEtcd, cluster_name: str) -> AsyncIterator[Coordinated]:
    async with running_coordinator(etcd_server.client_url, cluster_name, CONFIG) as running:
        yield Coordinated(*running)


async def _store_old_group(
    host: CoordinatorHost, group_id: str, empty_since_ms: int | None
) -> None:
    """What an earlier coordinator left: an Empty classic consumer group and one offset
    committed two retentions ago."""
    long_ago = wall_clock_ms() - 2 * RETENTION_MS
    record = GroupRecord("consumer", 3, None, None, empty_since_ms=empty_since_ms)
    await host.etcd.put(keys.group_metadata_key(host.cluster, group_id), encode_group(record))
    offset = CommittedOffset(7, commit_timestamp_ms=long_ago)
    await host.etcd.put(
        keys.group_offset_key(host.cluster, group_id, "t", 0), encode_offset(offset)
    )


async def _stored_keys(host: CoordinatorHost, group_id: str) -> list[str]:
    entries = await host.etcd.get_prefix(keys.group_prefix(host.cluster, group_id))
    return [entry.key for entry in entries]


async def test_a_new_coordinator_counts_from_the_stored_empty_time(
    coordinated: Coordinated,
) -> None:
    """Nobody asked for the group since it moved: the check takes it on, and its offsets,
    Empty for longer than the retention by the stored time, expire; the group goes."""
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"moved-{uuid.uuid4().hex[:6]}"
    await _store_old_group(host, group_id, empty_since_ms=wall_clock_ms() - 2 * RETENTION_MS)
    await coordinator.expire_offsets()
    assert await _stored_keys(host, group_id) == []
    assert coordinator.local(group_id) is None


async def test_without_a_stored_empty_time_the_retention_counts_from_the_load(
    coordinated: Coordinated,
) -> None:
    """A record from before the empty time was stored: the group may have been Empty for a
    moment only, so the offset is kept for a retention from the load, never expired at once."""
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"old-{uuid.uuid4().hex[:6]}"
    await _store_old_group(host, group_id, empty_since_ms=None)
    await coordinator.expire_offsets()
    runtime = coordinator.local(group_id)
    assert runtime is not None
    assert runtime.committed([("t", 0)])[("t", 0)] is not None
    assert len(await _stored_keys(host, group_id)) == 2


async def test_the_time_the_last_member_left_is_stored_with_the_group(
    coordinated: Coordinated,
) -> None:
    host, coordinator = coordinated.host, coordinated.coordinator
    group_id = f"left-{uuid.uuid4().hex[:6]}"
    runtime = await coordinator.runtime(group_id)
    join = join_request()
    joined = await runtime.join(join)
    assert joined.error is ErrorCode.NONE
    member = joined.member_id
    synced = await runtime.sync(SyncRequest(member, 1, None, None, None, {member: b"a"}))
    assert synced.error is ErrorCode.NONE
    before_leaving = wall_clock_ms()
    assert runtime.leave([(member, None)])[0] is ErrorCode.NONE
    deadline = time.monotonic() + 60
    while True:
        kv = await host.etcd.get(keys.group_metadata_key(host.cluster, group_id))
        record = decode_group(kv.value) if kv is not None else None
        if record is not None and record.generation == 2:
            break
        assert time.monotonic() < deadline, "the Empty generation was not stored"
        await asyncio.sleep(0.05)
    assert not record.has_members()
    assert record.empty_since_ms is not None
    assert before_leaving <= record.empty_since_ms <= wall_clock_ms()


async def _stored_groups(host: CoordinatorHost) -> set[str]:
    entries = await host.etcd.get_prefix(keys.groups_prefix(host.cluster))
    parsed = (parse_group_key(host.cluster, entry.key) for entry in entries)
    return {found[0] for found in parsed if found is not None}


async def test_each_check_takes_on_at_most_n_unowned_groups_and_successive_checks_all(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    """After a restart nobody coordinates any stored group. A cluster of many throwaway
    groups must not have its first check take them all on at once (a lease and a load each):
    a check takes on at most N of them (here 3), the next goes on where it stopped, and
    successive checks expire every one."""
    config = dataclasses.replace(CONFIG, offsets_retention_adopt_per_check=3)
    async with running_coordinator(etcd_server.client_url, cluster_name, config) as running:
        host, coordinator = running
        stored = {f"throwaway-{i:02d}" for i in range(8)}
        for group_id in stored:
            await _store_old_group(
                host, group_id, empty_since_ms=wall_clock_ms() - 2 * RETENTION_MS
            )
        assert await _stored_groups(host) == stored
        left, checks = stored, 0
        while left:
            assert checks < 8, f"groups never expired: {sorted(left)}"
            await coordinator.expire_offsets()
            checks += 1
            now_left = await _stored_groups(host)
            assert now_left <= left
            assert 1 <= len(left - now_left) <= 3, f"check {checks} expired {left - now_left}"
            left = now_left
        assert checks == 3
