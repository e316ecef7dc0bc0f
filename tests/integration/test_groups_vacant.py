"""Letting go of vacant groups (``GroupCoordinator.vacant_due``), with the coordinator in this
process against a real etcd reached through a relay that can hold etcd's answers back.

A coordinator lets go of a group nobody is in and that holds nothing etcd does not have. A
group whose metadata write is still on its way to etcd holds exactly that: letting go of it
then cancels the write, and the group's last change (its last member gone) may never be stored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from harness.coordinator_host import CoordinatorHost, join_request, running_coordinator
from harness.tcp_relay import TcpRelay

from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.model import GroupConfig, GroupState, SyncRequest
from kafscale.broker.groups.store import decode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

CONFIG = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1000)


@dataclass
class _Relayed:
    relay: TcpRelay
    host: CoordinatorHost
    coordinator: GroupCoordinator


@pytest.fixture
async def relayed(etcd_server: EmbeddedEtcd, cluster_name: str) -> AsyncIterator[_Relayed]:
    relay = TcpRelay("127.0.0.1", int(etcd_server.client_url.rsplit(":", 1)[1]))
    async with running_coordinator(relay.url, cluster_name, CONFIG) as (host, coordinator):
        try:
            yield _Relayed(relay, host, coordinator)
        finally:
            relay.close()  # held answers flow again (before the coordinator closes)


async def _eventually(check: object, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _stored(host: CoordinatorHost, group_id: str, generation: int) -> None:
    """Wait until etcd has the group at ``generation``."""
    deadline = time.monotonic() + 60
    while True:
        kv = await host.etcd.get(keys.group_metadata_key(host.cluster, group_id))
        if kv is not None and decode_group(kv.value).generation == generation:
            return
        assert time.monotonic() < deadline, f"generation {generation} not stored"
        await asyncio.sleep(0.05)


async def test_a_group_is_not_let_go_while_its_last_change_is_being_written(
    relayed: _Relayed,
) -> None:
    """The only member of a classic group stops heartbeating; its session expires, the group
    becomes Empty (generation 2) and the coordinator writes that. While the write is on its
    way (etcd's answer held back), the group is not vacant: letting go then would cancel the
    write. Once etcd answers, the Empty group is vacant and is let go as before."""
    host, coordinator = relayed.host, relayed.coordinator
    runtime = await coordinator.runtime("expiring")
    joined = await runtime.join(join_request(timeout_ms=1000))
    assert joined.error is ErrorCode.NONE and joined.generation_id == 1
    sync = SyncRequest(joined.member_id, 1, None, None, None, {joined.member_id: b"a"})
    assert (await runtime.sync(sync)).error is ErrorCode.NONE
    await _stored(host, "expiring", 1)

    with relayed.relay.holding_replies():
        # No heartbeat: the member's 1-s session runs out and the Empty group is written.
        await _eventually(
            lambda: runtime.group is not None and runtime.group.state is GroupState.EMPTY
        )
        await _eventually(runtime._stores.empty)  # the writer took it; etcd's answer waits
        await asyncio.sleep(0.2)
        assert not runtime.vacant()
        later = time.monotonic() + CONFIG.vacant_release_ms / 1000 * 10
        assert runtime not in coordinator.vacant_due(later)
        assert coordinator.local("expiring") is runtime
    await _stored(host, "expiring", 2)
    # The answer came: nothing left that etcd lacks, and the group goes with its lease.
    await _eventually(lambda: coordinator.local("expiring") is None)
    lease_key = keys.group_lease_key(host.cluster, "expiring")
    deadline = time.monotonic() + 60
    while await host.etcd.get(lease_key) is not None:
        assert time.monotonic() < deadline, "the lease was not given back"
        await asyncio.sleep(0.05)
    await _stored(host, "expiring", 2)  # and the Empty generation stays
