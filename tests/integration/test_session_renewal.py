"""A broker whose etcd session ends comes back on a new one even when etcd refuses its first
attempts to register again, and keeps doing so at every later loss.

The fault campaign (``bench/chaos.py``, a 3-member etcd whose leader is killed) found brokers
whose session watch had ended on one etcd error while registering again (``session-watch
ended: MetadataUnavailable('etcd put timed out ...')``): they stayed unregistered, and after
their next lost session they had none at all, answering every JoinGroup with
UNKNOWN_SERVER_ERROR until restarted. Here etcd refuses the registration on purpose (the
brokers' role is made read-only, then its write permission comes back), rather than by the
luck of a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerCluster
from harness.s3 import S3Endpoint, unique_bucket
from harness.tls_etcd import AUTH_PASSWORD, AUTH_USER, AuthEtcd, restartable_auth_etcd
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

_DEADLINE_S = 120.0  # generous: several engineers and a CI run share two cores
TOPIC = "renewal"


@pytest.fixture
def auth_etcd(tmp_path: Path) -> Iterator[AuthEtcd]:
    with restartable_auth_etcd(tmp_path / "etcd-auth") as etcd:
        yield etcd


@pytest.fixture
def auth_cluster(
    auth_etcd: AuthEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    bucket = unique_bucket("b")
    s3_server.client().create_bucket(Bucket=bucket)
    env = {
        "KAFSCALE_ETCD__USERNAME": AUTH_USER,
        "KAFSCALE_ETCD__PASSWORD": AUTH_PASSWORD,
        "KAFSCALE_ETCD__SESSION_TTL_S": "6",
    }
    brokers = BrokerCluster(auth_etcd.url, s3_server, bucket, cluster_name, tmp_path, extra_env=env)
    try:
        yield brokers
    finally:
        brokers.stop_all()


def read_only(etcd: AuthEtcd) -> None:
    etcd.as_root("role", "revoke-permission", "kafscale", "--prefix=true", "/kafscale")
    etcd.as_root("role", "grant-permission", "kafscale", "--prefix=true", "read", "/kafscale")


def read_write(etcd: AuthEtcd) -> None:
    etcd.as_root("role", "revoke-permission", "kafscale", "--prefix=true", "/kafscale")
    etcd.as_root("role", "grant-permission", "kafscale", "--prefix=true", "readwrite", "/kafscale")


def as_root(etcd: AuthEtcd, work: Callable[[Etcd], object]) -> object:
    async def run() -> object:
        client = await Etcd.connect([etcd.url], 10.0, username="root", password="root-pw")
        try:
            return await work(client)  # type: ignore[misc]
        finally:
            await client.close()

    return asyncio.run(run())


def registration_lease(etcd: AuthEtcd, cluster: str, node_id: int) -> int | None:
    """The lease the broker's registration is bound to (its session); None: not registered."""

    async def read(client: Etcd) -> int | None:
        kv = await client.get(keys.broker_key(cluster, node_id))
        return None if kv is None else kv.lease

    return as_root(etcd, read)  # type: ignore[return-value]


def end_session(etcd: AuthEtcd, lease: int) -> None:
    """Revoke the broker's session lease, as an expiry would end it."""
    as_root(etcd, lambda client: client.revoke_lease(lease))


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {_DEADLINE_S:g} s: {what}")
        time.sleep(0.2)


def produce(bootstrap: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 120_000})
    errors: list[object] = []
    producer.produce(TOPIC, value, partition=0, on_delivery=lambda e, m: errors.append(e))
    assert producer.flush(150) == 0
    assert errors == [None], errors


def read_all(bootstrap: str, count: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "renewal"})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + _DEADLINE_S
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def refused_registration(broker: BrokerProcess) -> bool:
    """The broker's log shows etcd refusing the put of its registration."""
    return any(
        "etcd put" in line and "permission denied" in line
        for line in broker.log_path.read_text(errors="replace").splitlines()
    )


def test_a_broker_registers_again_after_etcd_refused_it_and_at_every_later_loss(
    auth_etcd: AuthEtcd, auth_cluster: BrokerCluster, cluster_name: str
) -> None:
    broker = auth_cluster.start()
    create_topics(broker.bootstrap, [TOPIC], partitions=1)
    produce(broker.bootstrap, b"before")
    first = registration_lease(auth_etcd, cluster_name, broker.node_id)
    assert first

    read_only(auth_etcd)
    end_session(auth_etcd, first)
    wait_for(lambda: refused_registration(broker), "etcd refuses the broker's registration")
    read_write(auth_etcd)
    wait_for(
        lambda: registration_lease(auth_etcd, cluster_name, broker.node_id) not in (None, first),
        "the broker registers again on a new session",
    )
    produce(broker.bootstrap, b"after")

    # The session watch lives on: a later loss is recovered from too.
    second = registration_lease(auth_etcd, cluster_name, broker.node_id)
    assert second is not None
    end_session(auth_etcd, second)
    wait_for(
        lambda: registration_lease(auth_etcd, cluster_name, broker.node_id) not in (None, second),
        "the broker registers again after its next lost session",
    )
    produce(broker.bootstrap, b"again")
    assert read_all(broker.bootstrap, 3) == [b"before", b"after", b"again"]
    assert broker.alive
    # No background task (session watch, ownership follower, rebalancer) ended on the way.
    lines = broker.log_path.read_text(errors="replace").splitlines()
    assert not [line for line in lines if "background task" in line and "ended" in line]
