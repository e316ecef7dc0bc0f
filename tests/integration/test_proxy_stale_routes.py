"""A proxy whose routing table missed a lease move corrects it from etcd, so clients do not loop
on NOT_LEADER_OR_FOLLOWER (``broker/proxy/staleness.py``).

The proxy runs in the test's process over real broker processes and a real etcd, so its
watches can be stopped: a stopped watch is exactly a table that misses every later event (what
aetcd's crossed watch creations did for over 30 s in CI). Then a partition really moves: its
owner is drained (it stays up, gives the partition up and answers NOT_LEADER_OR_FOLLOWER), and
another broker takes its lease. Without the safety net the proxy retries into the drained
broker until ``routing.retry_timeout_s`` and the client's produce fails; with it, the proxy
re-reads that lease once the broker has refused past the grace, and the produce succeeds.
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from collections.abc import Coroutine
from typing import Any

import pytest
from harness.brokers import BrokerCluster
from harness.etcd import harness_etcd
from harness.topics import create_topics
from kafka import KafkaProducer

from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.groups.leases import owner_value
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.proxy.app import Proxy
from kafscale.broker.proxy.config import (
    ProxyEtcdSettings,
    ProxyListenerSettings,
    ProxySettings,
    RoutingSettings,
)
from kafscale.broker.proxy.staleness import RouteKey

pytestmark = pytest.mark.integration

TOPIC = "stale-routes"
TP = (TOPIC, 0)
SETTLE_S = 60.0  # a bound on waits, not a speed
SCENARIO_S = 180.0  # a bound on a whole scenario: a hang fails with every task's stack


def run_bounded(scenario: Coroutine[Any, Any, None]) -> None:
    """``asyncio.run`` with a bound; a scenario that hangs (once in CI, before the proxy's
    closes cancelled until done) fails with the stack of every task, to say where."""

    async def bounded() -> None:
        task = asyncio.ensure_future(scenario)
        done, _ = await asyncio.wait({task}, timeout=SCENARIO_S)
        if not done:  # the stacks before cancelling: where every task waits
            stacks = io.StringIO()
            for each in asyncio.all_tasks():
                each.print_stack(file=stacks)
            print(stacks.getvalue(), file=sys.stderr)  # shown even if the clean-up hangs too
            task.cancel()
            raise AssertionError(f"hung for {SCENARIO_S:g} s; tasks:\n{stacks.getvalue()}")
        task.result()

    asyncio.run(bounded())


def proxy_settings(cluster: BrokerCluster) -> ProxySettings:
    return ProxySettings(
        cluster=cluster.cluster,
        etcd=ProxyEtcdSettings(endpoints=[cluster.etcd_url]),
        listener=ProxyListenerSettings(host="127.0.0.1", port=0, admin_port=free_port_run()),
        # Short, so that the old behaviour fails fast; the correction comes after the grace.
        routing=RoutingSettings(retry_timeout_s=6.0, stale_route_grace_s=0.3),
    )


def produce_one(bootstrap: str, value: bytes) -> None:
    """One record to partition 0, no client retries: a NOT_LEADER_OR_FOLLOWER the proxy passes
    on fails the send."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, retries=0, request_timeout_ms=30_000)
    try:
        producer.send(TOPIC, value, partition=0).get(timeout=60)
    finally:
        producer.close(timeout=5)


async def lease_holder(etcd: Etcd, cluster: str) -> int | None:
    entry = await etcd.get(keys.partition_lease_key(cluster, *TP))
    return None if entry is None else int(entry.value)


def broker_with_id(cluster: BrokerCluster, node_id: int) -> BrokerProcess:
    for broker in cluster.brokers:
        if broker.status().get("node_id") == node_id:
            return broker
    raise AssertionError(f"no broker {node_id}")


def test_a_proxy_that_missed_a_lease_move_corrects_the_route_from_etcd(
    broker_cluster: BrokerCluster,
) -> None:
    broker_cluster.start()
    broker_cluster.start()
    create_topics(broker_cluster.bootstrap, [TOPIC], 2)
    run_bounded(_missed_move(broker_cluster))


async def _missed_move(cluster: BrokerCluster) -> None:
    etcd = await harness_etcd(cluster.etcd_url)
    proxy = await Proxy.start(proxy_settings(cluster))
    bootstrap = f"127.0.0.1:{proxy.port}"
    try:
        await asyncio.to_thread(produce_one, bootstrap, b"before")
        old = await lease_holder(etcd, cluster.cluster)
        assert old is not None
        assert proxy.routes.partition_owner(TP) == old

        await proxy.routes.view.close()  # the proxy's watch misses everything from here on
        drained = broker_with_id(cluster, old)
        status, _ = await asyncio.to_thread(drained.http, "POST", "/drain")
        assert status == 200
        deadline = time.monotonic() + SETTLE_S
        new = old
        while new in (old, None):
            assert time.monotonic() < deadline, "no broker took the drained partition"
            await asyncio.sleep(0.1)
            new = await lease_holder(etcd, cluster.cluster)
        assert proxy.routes.partition_owner(TP) == old  # stale, as a missed event leaves it

        await asyncio.to_thread(produce_one, bootstrap, b"after")

        assert proxy.routes.partition_owner(TP) == new
        stale = proxy.status()["stale_routes"]
        assert isinstance(stale, dict)
        assert stale["corrections"] == 1
    finally:
        await proxy.shutdown()
        await etcd.close()


def test_a_coordinator_lease_the_table_missed_is_read_back_from_etcd(
    broker_cluster: BrokerCluster,
) -> None:
    """The coordinator side of the same net, through the routing table's etcd read: a group
    lease written while the proxy's group watch is stopped is what ``recheck`` finds."""
    first = broker_cluster.start()
    second = broker_cluster.start()
    run_bounded(_missed_group_lease(broker_cluster, first, second))


async def _missed_group_lease(
    cluster: BrokerCluster, first: BrokerProcess, second: BrokerProcess
) -> None:
    ids = [int(b.status()["node_id"]) for b in (first, second)]  # blocking: before the proxy
    etcd = await harness_etcd(cluster.etcd_url)
    proxy = await Proxy.start(proxy_settings(cluster))
    group = RouteKey("group", "stale-group")
    try:
        routes = proxy.routes
        assert routes.holder(group) is None
        await routes.groups.close()  # its watch misses the lease below
        await etcd.put(keys.group_lease_key(cluster.cluster, group.name), owner_value(ids[1]))
        assert routes.holder(group) is None
        assert await routes.recheck(group)
        assert routes.holder(group) == ids[1]
        assert routes.group_coordinator(group.name) == ids[1]
        assert not await routes.recheck(group)  # now the table agrees with etcd
        await etcd.delete(keys.group_lease_key(cluster.cluster, group.name))
        assert await routes.recheck(group)
        assert routes.holder(group) is None
        assert proxy.status()["stale_routes"] == {"checks": 3, "corrections": 2}
    finally:
        await proxy.shutdown()
        await etcd.close()
