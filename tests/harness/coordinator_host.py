"""A ``GroupCoordinator`` run in the test's own process on a real etcd, without a broker: what a
broker gives its coordinator (``CoordinatorHost``), and a classic JoinGroup as a consumer
member sends it. For tests that drive the coordinator's calls directly (leases, fencing, vacant
groups, offset retention) rather than through a client."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.model import GroupConfig, JoinRequest
from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.metadata.share_members import ShareMembers


@dataclass
class HostView:
    """The part of a broker's cluster view a coordinator reads."""

    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    draining: set[int] = field(default_factory=set)
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    share_members: ShareMembers = field(default_factory=ShareMembers)

    async def know_draining_at(self, broker: int, revision: int) -> None:
        """Nothing to catch up: ``draining`` is the test's to set (``ClusterView``'s reads the
        marks up to a release's revision)."""


@dataclass
class CoordinatorHost:
    """What a broker gives its coordinator."""

    etcd: Etcd
    session: SessionLease
    node_id: int
    cluster: str
    view: HostView
    draining: bool = False


@dataclass
class Coordinated:
    """A running coordinator and what its broker gives it (``running_coordinator``'s pair)."""

    host: CoordinatorHost
    coordinator: GroupCoordinator


HAND_RUN_CHECK_MS = 3_600_000
"""A periodic offset-retention check an hour away: the test runs its checks by hand."""


def hand_checked_retention(retention_ms: int, **more: Any) -> GroupConfig:
    """A coordinator's group config for a test that runs the offset-retention checks itself:
    committed offsets kept ``retention_ms``, the periodic check ``HAND_RUN_CHECK_MS`` away, no
    initial rebalance delay and 1-s minimum sessions (``more`` adds or replaces fields)."""
    fields: dict[str, Any] = {
        "initial_rebalance_delay_ms": 0,
        "min_session_timeout_ms": 1000,
        "offsets_retention_ms": retention_ms,
        "offsets_retention_check_interval_ms": HAND_RUN_CHECK_MS,
    }
    return GroupConfig(**(fields | more))


def join_request(member_id: str = "", timeout_ms: int = 10_000) -> JoinRequest:
    """A classic consumer member's JoinGroup (``range``, no subscription bytes);
    ``timeout_ms`` is its session and rebalance timeout."""
    return JoinRequest(
        member_id=member_id,
        group_instance_id=None,
        client_id="c",
        client_host="/h",
        session_timeout_ms=timeout_ms,
        rebalance_timeout_ms=timeout_ms,
        protocol_type="consumer",
        protocols=(("range", b""),),
        require_known_member_id=False,
        supports_skip_assignment=False,
        fresh_id=uuid.uuid4().hex,
    )


@contextlib.asynccontextmanager
async def running_coordinator(
    etcd_url: str, cluster: str, config: GroupConfig, etcd_timeout_s: float = 60
) -> AsyncIterator[tuple[CoordinatorHost, GroupCoordinator]]:
    """Broker 1's coordinator, alone in ``cluster``, on its own etcd client and session."""
    etcd = await Etcd.connect([etcd_url], timeout_s=etcd_timeout_s)
    session = await SessionLease.start(etcd, 30)
    host = CoordinatorHost(
        etcd, session, 1, cluster, HostView({1: BrokerInfo(1, "127.0.0.1", 9001)})
    )
    coordinator = GroupCoordinator(host, config)  # type: ignore[arg-type]
    await coordinator.start()
    try:
        yield host, coordinator
    finally:
        await coordinator.close()
        await session.revoke()
        await etcd.close()
