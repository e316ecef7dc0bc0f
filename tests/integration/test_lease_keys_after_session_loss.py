"""A broker that gave its etcd session up while etcd was away holds its partitions' leases on
its new session, so etcd keeps naming it their holder after the old session's lease expires.

etcd extends every lease by its TTL when it starts, so the lease of a session the broker gave up
(no keepalive answered for a TTL while etcd was down) comes back to life for one more TTL. The
broker, on its new session, took its partitions back by confirming the lease keys it found with
its own id on them: they stayed bound to the old lease, and a TTL later etcd deleted them while
the broker went on serving the partitions. etcd then named no holder for good (no other broker
claims a partition its live, assigned owner serves): proxies and other brokers routed by an
ownership etcd no longer had, and ``test_proxy_routes``' churn test waited 90 s for every
partition to be leased ("ownership did not settle in etcd").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import new_cluster
from harness.etcd import harness_etcd, running_etcd
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd_txn import KeyValue

pytestmark = pytest.mark.integration

TOPIC = "rebound"
PARTITIONS = 2
WAIT_S = 60.0  # a bound on each wait, not a speed: each takes a few seconds


@pytest.fixture
def etcd_of_its_own() -> Iterator[EmbeddedEtcd]:
    """An etcd this test kills and starts again (no other test's processes use it)."""
    with running_etcd() as server:
        yield server


def read_keys(url: str, names: list[str]) -> dict[str, KeyValue | None]:
    async def read() -> dict[str, KeyValue | None]:
        etcd = await harness_etcd(url)
        try:
            return {name: await etcd.get(name) for name in names}
        finally:
            await etcd.close()

    return asyncio.run(read())


def put_on_lease(url: str, key: str, lease: int) -> None:
    async def put() -> None:
        etcd = await harness_etcd(url)
        try:
            await etcd.put(key, b"probe", lease=lease)
        finally:
            await etcd.close()

    asyncio.run(put())


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT_S} s waiting for {what}")
        time.sleep(0.2)


def test_partitions_taken_back_after_etcd_restarts_stay_leased_past_the_old_session(
    etcd_of_its_own: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    url = etcd_of_its_own.client_url
    cluster = new_cluster(url, s3_server, tmp_path, "rebound")
    lease_keys = [keys.partition_lease_key(cluster.cluster, TOPIC, p) for p in range(PARTITIONS)]
    probe = keys.cluster_prefix(cluster.cluster) + "test-probe"  # outside every watched range
    try:
        broker = cluster.start()
        create_topics(broker.bootstrap, [TOPIC], PARTITIONS)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 30000})
        for partition in range(PARTITIONS):
            producer.produce(TOPIC, b"x", partition=partition)
        assert producer.flush(60) == 0
        me = str(broker.node_id).encode()
        before = read_keys(url, lease_keys)
        assert all(kv is not None and kv.value == me for kv in before.values()), before
        old_lease = next(kv.lease for kv in before.values() if kv is not None)
        # Deleted when the old session's lease expires: tells the test when that has happened.
        put_on_lease(url, probe, old_lease)

        etcd_of_its_own.kill()
        wait_until(
            lambda: "etcd session lost" in broker.log_path.read_text(errors="replace"),
            "the broker to give its session up",
        )
        etcd_of_its_own.start()  # the old lease lives one more TTL from here
        wait_until(lambda: read_keys(url, [probe])[probe] is None, "the old lease to expire")

        def leased_by_the_broker() -> bool:
            now = read_keys(url, lease_keys)
            return all(kv is not None and kv.value == me for kv in now.values())

        wait_until(leased_by_the_broker, f"etcd to name broker {broker.node_id} again")
        after = read_keys(url, lease_keys)
        assert all(kv is not None and kv.lease != old_lease for kv in after.values()), after
        assert broker.process is not None and broker.process.poll() is None, broker.tail()
    finally:
        cluster.stop_all()
