"""Every proxy routes to the owners etcd holds, after churn: brokers killed, frozen and drained,
and etcd itself restarted and frozen while the proxies re-create their watches.

Two ``kafscale proxy`` processes over three broker processes. A proxy that missed an ownership
change sends clients' requests to a broker that answers NOT_LEADER_OR_FOLLOWER, refreshes
nothing (its table is what is stale) and retries into the same broker, so a stale table is a
client-visible outage: every proxy must agree with etcd once ownership settles. The proxies use
a short etcd call timeout so that watch creations time out while etcd is frozen (what CPU load
did in CI, where two proxies disagreed for over 30 s: tests/unit/test_etcd_watcher.py has the
exact crossing of watches that caused it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import STEADY_SESSION_TTL_S, BrokerCluster, new_cluster
from harness.etcd import harness_etcd, running_etcd
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.leaders import leader_for

pytestmark = pytest.mark.integration

TOPICS = ["routes-a", "routes-b"]
PARTITIONS = 6
SETTLE_S = 90.0  # a bound on the wait, not a speed: ownership settles in seconds


@pytest.fixture
def etcd_of_its_own() -> Iterator[EmbeddedEtcd]:
    """An etcd this test restarts and freezes (no other test's processes use it)."""
    with running_etcd() as server:
        yield server


def etcd_owners(etcd_url: str, cluster: str) -> tuple[dict[str, int], set[str], str]:
    """What a proxy should route each partition to, computed from one read of etcd with the
    proxy's own rule, the partitions whose lease is held by a registered broker, and what was
    read (for a failure's message)."""

    async def read() -> tuple[dict[str, int], set[str], str]:
        etcd = await harness_etcd(etcd_url)
        try:
            entries = await etcd.get_prefix(keys.cluster_prefix(cluster))
        finally:
            await etcd.close()
        view = ClusterView(etcd, cluster)
        for entry in entries:
            view.apply_put(entry.key, entry.value)
        owners = {
            f"{tp[0]}/{tp[1]}": leader_for(
                tp, view.owners, view.assignment.owners, view.brokers.keys(), view.draining
            )
            for tp in view.partitions()
        }
        leased = {f"{t}/{p}" for (t, p), b in view.owners.items() if b in view.brokers}
        seen = (
            f"brokers {sorted(view.brokers)}, draining {sorted(view.draining)}, lease holders "
            f"{ {f'{t}/{p}': b for (t, p), b in sorted(view.owners.items())} }"
        )
        return owners, leased, seen

    return asyncio.run(read())


def routes_of(proxy: BrokerProcess) -> dict[str, int]:
    routes = proxy.status()["routes"]["partitions"]
    return {name: owner for name, owner in routes.items() if name.rsplit("/", 1)[0] in TOPICS}


def settled(etcd_url: str, cluster: str, deadline: float) -> dict[str, int]:
    """etcd's owners once every partition is leased and they stay the same for a second
    (until ``deadline``, a ``time.monotonic()`` value)."""
    previous: dict[str, int] | None = None
    seen = "nothing (etcd did not answer)"
    while time.monotonic() < deadline:
        try:
            owners, leased, seen = etcd_owners(etcd_url, cluster)
        except MetadataUnavailable:  # etcd just thawed: every client reconnects at once
            time.sleep(0.5)
            continue
        if len(leased) == len(TOPICS) * PARTITIONS and owners == previous:
            return owners
        previous = owners if len(leased) == len(owners) else None
        time.sleep(1.0)
    raise AssertionError(f"ownership did not settle in etcd: {previous}; last read: {seen}")


def converged(proxies: list[BrokerProcess], etcd_url: str, cluster: str) -> None:
    """Until every proxy routes as etcd says (bounded); fails with each view if not."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        # One bound for both waits (each had its own: up to twice SETTLE_S), with a few
        # seconds past it for etcd's owners to be read twice, a second apart.
        truth = settled(etcd_url, cluster, max(deadline, time.monotonic() + 5.0))
        views = [routes_of(proxy) for proxy in proxies]
        if all(view == truth for view in views):
            return
        if time.monotonic() > deadline:
            stale = [
                {k: (v.get(k), owner) for k, owner in truth.items() if v.get(k) != owner}
                for v in views
            ]
            known = [
                {k: status[k] for k in ("brokers", "draining", "cluster_view_stopped")}
                for status in (proxy.status() for proxy in proxies)
            ]
            raise AssertionError(
                f"proxies' routes (theirs, etcd's) that differ: {stale}; the proxies know: {known}"
            )
        time.sleep(0.2)


def produce_everywhere(bootstrap: str) -> None:
    """One record per partition through a proxy: claims what no live broker holds yet."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 30000})
    for topic in TOPICS:
        for partition in range(PARTITIONS):
            producer.produce(topic, b"x", partition=partition)
    assert producer.flush(60) == 0


def freeze_etcd_through_a_restart(etcd: EmbeddedEtcd, freeze_s: float) -> None:
    """Kill etcd, start it again, and freeze it as soon as it answers: the proxies' watch
    streams broke, and the creations they retry now time out and are retried again."""
    etcd.kill()
    etcd.start()
    pid = etcd.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(freeze_s)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_proxies_route_to_etcds_owners_after_churn(
    etcd_of_its_own: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    url = etcd_of_its_own.client_url
    # Sessions load does not end: with the harness's 4 s, keepalives starved at load 30-60
    # moved leases on their own, and ownership took longer to settle than the waits allow. The
    # churn here needs no expiry: a restart on the crashed broker's port ends its session.
    steady = {"KAFSCALE_ETCD__SESSION_TTL_S": STEADY_SESSION_TTL_S}
    cluster: BrokerCluster = new_cluster(url, s3_server, tmp_path, "routes", extra_env=steady)
    try:
        brokers = [cluster.start() for _ in range(3)]
        proxies = [start_proxy(cluster, KAFSCALE_ETCD__TIMEOUT_S="0.5") for _ in range(2)]
        create_topics(brokers[0].bootstrap, TOPICS, PARTITIONS)
        produce_everywhere(proxies[0].bootstrap)
        converged(proxies, url, cluster.cluster)

        brokers[0].kill()  # a crash: its restart on its port ends the session, and its leases
        brokers[0] = cluster.start(port=brokers[0].port)
        brokers[1].signal(signal.SIGSTOP)  # well within the session TTL: it keeps its leases
        time.sleep(2)
        brokers[1].signal(signal.SIGCONT)
        converged(proxies, url, cluster.cluster)

        for freeze_s in (1.0, 1.8):
            freeze_etcd_through_a_restart(etcd_of_its_own, freeze_s)
            brokers[2].stop()  # a handoff while the proxies' watches come back
            brokers[2] = cluster.start(port=brokers[2].port)
            produce_everywhere(proxies[1].bootstrap)
            converged(proxies, url, cluster.cluster)
    finally:
        cluster.stop_all()
