"""The forwarder's side of the stale-route net: a coordinator that keeps answering
NOT_COORDINATOR for a group the table still gives it gets its lease re-read (``recheck``) after
the grace; a corrected route is retried at once, to the right broker. The brokers here are
scripted answers (the end-to-end run with real brokers is
tests/integration/test_proxy_stale_routes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.config import RoutingSettings
from kafscale.broker.proxy.forward import Call, Forwarder
from kafscale.broker.proxy.staleness import RouteKey
from kafscale.broker.proxy.upstream import UpstreamStats

pytestmark = pytest.mark.unit

HEARTBEAT = Call(12, 4, "recheck-test")
GROUP = RouteKey("group", "g")


class Routes:
    """A table that routes the group to ``owner``; ``recheck`` plays etcd, which says
    ``etcd_owner``."""

    def __init__(self, owner: int, etcd_owner: int) -> None:
        self.owner = owner
        self.etcd_owner = etcd_owner
        self.rechecked: list[RouteKey] = []

    def route_of(self, key: RouteKey) -> int:
        return self.owner

    async def recheck(self, key: RouteKey) -> bool:
        self.rechecked.append(key)
        if self.owner == self.etcd_owner:
            return False
        self.owner = self.etcd_owner
        return True

    async def wait_changed(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)


class ScriptedForwarder(Forwarder):
    """Broker 2 coordinates the group; any other broker answers NOT_COORDINATOR."""

    def __init__(self, routes: Routes, settings: RoutingSettings) -> None:
        super().__init__(routes, settings, UpstreamStats())  # type: ignore[arg-type]
        self.asked: list[int] = []

    async def call_raw(self, pool: Any, broker_id: int, frame: bytes | memoryview) -> bytes:
        self.asked.append(broker_id)
        code = ErrorCode.NONE if broker_id == 2 else ErrorCode.NOT_COORDINATOR
        body = {"throttle_time": 0, "error_code": code}
        return codec.encode_response(HEARTBEAT.api_key, HEARTBEAT.api_version, 1, body)[4:]


def settings(grace_s: float) -> RoutingSettings:
    return RoutingSettings(
        retry_timeout_s=3.0, stale_route_grace_s=grace_s, stale_route_check_interval_s=0.2
    )


async def heartbeat(forwarder: ScriptedForwarder, routes: Routes) -> Any:
    _, response = await forwarder.routed(
        None,  # type: ignore[arg-type]
        HEARTBEAT,
        b"",
        lambda _refused: routes.owner,
        forwarder.deadline(),
        lease=GROUP,
    )
    return response


async def test_a_stale_coordinator_route_is_corrected_and_retried_to_the_holder() -> None:
    routes = Routes(owner=1, etcd_owner=2)
    forwarder = ScriptedForwarder(routes, settings(grace_s=0.05))
    response = await heartbeat(forwarder, routes)
    assert response.error_code == ErrorCode.NONE
    assert routes.rechecked == [GROUP]
    assert forwarder.asked[0] == 1 and forwarder.asked[-1] == 2
    assert set(forwarder.asked[:-1]) == {1}


async def test_a_route_etcd_agrees_with_is_read_at_most_once_per_interval() -> None:
    """The holder refuses and etcd says it holds the lease (its own view lags): nothing to
    correct; the request ends with the refusal at its deadline, as before, and etcd was read
    only a few times, not once per attempt."""
    routes = Routes(owner=1, etcd_owner=1)
    forwarder = ScriptedForwarder(routes, settings(grace_s=0.05))
    response = await heartbeat(forwarder, routes)
    assert response.error_code == ErrorCode.NOT_COORDINATOR
    assert routes.rechecked  # the grace passed within the deadline: it looked
    assert len(routes.rechecked) < len(forwarder.asked)


async def test_no_lease_no_recheck() -> None:
    """Requests that name no coordinator lease (any broker's) are retried as before."""
    routes = Routes(owner=1, etcd_owner=2)
    forwarder = ScriptedForwarder(routes, settings(grace_s=0.0))
    await forwarder.routed(
        None,  # type: ignore[arg-type]
        HEARTBEAT,
        b"",
        lambda _refused: routes.owner,
        forwarder.deadline(request_timeout_ms=200),
    )
    assert routes.rechecked == []
