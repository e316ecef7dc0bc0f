"""A ``GroupCoordinator`` run in the test's own process on a real etcd, without a broker: what a
broker gives its coordinator (``CoordinatorHost``), and a classic JoinGroup as a consumer
member sends it. For tests that drive the coordinator's calls directly (leases, fencing, vacant
groups, offset retention) rather than through a client."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kafscale.broker.groups.model import JoinRequest
from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.session_lease import SessionLease


@dataclass
class HostView:
    """The part of a broker's cluster view a coordinator reads."""

    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    draining: set[int] = field(default_factory=set)
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)


@dataclass
class CoordinatorHost:
    """What a broker gives its coordinator."""

    etcd: Etcd
    session: SessionLease
    node_id: int
    cluster: str
    view: HostView
    draining: bool = False


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
