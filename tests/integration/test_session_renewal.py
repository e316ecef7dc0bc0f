"""A broker whose etcd session ends comes back on a new one even when etcd refuses its first
attempts to register again, and keeps doing so at every later loss; and until it knows its
session ended, it answers retriable errors (NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR), not
UNKNOWN_SERVER_ERROR, which librdkafka's producer takes as a permanent failure.

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
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.etcd import lease_remaining_s
from harness.etcd import registration_lease as read_registration_lease
from harness.kafka_wire import PRODUCE, KafkaWire, produce_body, produce_partition
from harness.s3 import S3Endpoint
from harness.tls_etcd import AuthEtcd, brokers_on_auth_etcd
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

_DEADLINE_S = 120.0  # generous: several engineers and a CI run share two cores
TOPIC = "renewal"


@pytest.fixture
def auth_cluster(
    auth_etcd: AuthEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    ttl = {"KAFSCALE_ETCD__SESSION_TTL_S": "6"}
    with brokers_on_auth_etcd(auth_etcd, s3_server, cluster_name, tmp_path, **ttl) as brokers:
        yield brokers


def as_root(etcd: AuthEtcd | str, work: Callable[[Etcd], object]) -> object:
    """``work`` done by a client of its own (as root on an etcd with authentication)."""

    async def run() -> object:
        if isinstance(etcd, str):
            client = await Etcd.connect([etcd], 10.0)
        else:
            client = await Etcd.connect([etcd.url], 10.0, username="root", password="root-pw")
        try:
            return await work(client)  # type: ignore[misc]
        finally:
            await client.close()

    return asyncio.run(run())


def registration_lease(etcd: AuthEtcd | str, cluster: str, node_id: int) -> int | None:
    """The lease the broker's registration is bound to (its session); None: not registered."""
    lease = as_root(etcd, lambda client: read_registration_lease(client, cluster, node_id))
    return lease  # type: ignore[return-value]


def end_session(etcd: AuthEtcd | str, lease: int) -> None:
    """Revoke the broker's session lease, as an expiry would end it."""
    as_root(etcd, lambda client: client.revoke_lease(lease))


def detach_registration(etcd: AuthEtcd | str, cluster: str, node_id: int) -> None:
    """Put the broker's registration again bound to no lease: revoking the session then leaves
    it, so the broker hears of the end from its keepalive alone, not at once from its watch
    deleting the registration (``registration_loss``), as when its view does not follow etcd."""

    async def put(client: Etcd) -> None:
        key = keys.broker_key(cluster, node_id)
        kv = await client.get(key)
        assert kv is not None
        await client.put(key, kv.value)

    as_root(etcd, put)


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

    auth_etcd.allow_brokers("read")
    end_session(auth_etcd, first)
    wait_for(lambda: refused_registration(broker), "etcd refuses the broker's registration")
    auth_etcd.allow_brokers()
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


JOIN_GROUP = 11


def test_until_it_knows_its_session_ended_a_broker_answers_retriable_errors(
    broker_cluster: BrokerCluster, cluster_name: str
) -> None:
    # A keepalive every 15 s: the broker learns of the revoke up to 15 s late, and the test has
    # at least 12 s for its two requests before it does (90 s made every run wait ~30 s).
    ttl_s = 45
    # No assignment written (nor followed): the topic's partition stays unowned until a
    # produce claims it on demand.
    broker = broker_cluster.start(
        KAFSCALE_ETCD__SESSION_TTL_S=str(ttl_s), KAFSCALE_ASSIGNMENT__SELF_ASSIGN="false"
    )
    create_topics(broker.bootstrap, ["orphan"], partitions=1)
    url = broker_cluster.etcd_url
    lease = registration_lease(url, cluster_name, broker.node_id)
    assert lease
    # Right after a keepalive, so that the next one (which finds the lease gone) is ~15 s away.
    wait_for(lambda: lease_remaining_s(url, lease) >= ttl_s - 3, "a keepalive renews the session")
    detach_registration(url, cluster_name, broker.node_id)
    end_session(url, lease)
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        # The produce claims the partition with the lease etcd no longer has; a new group's
        # JoinGroup takes the group's lease the same way.
        batch = make_batch(0, [b"x"])
        produced, _ = produce_partition(wire.request(PRODUCE, 9, produce_body("orphan", 0, batch)))
        join = {
            "group_id": "orphans",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        }
        joined = int(wire.request(JOIN_GROUP, 5, join).error_code)
    assert produced == ErrorCode.NOT_LEADER_OR_FOLLOWER, produced
    assert joined == ErrorCode.NOT_COORDINATOR, joined
    # and once it knows, it comes back: the records go in
    wait_for(
        lambda: registration_lease(url, cluster_name, broker.node_id) not in (None, 0, lease),
        "the broker registers on a new session",
    )
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 120_000})
    failed: list[object] = []
    producer.produce("orphan", b"y", on_delivery=lambda e, m: e is None or failed.append(e))
    assert producer.flush(150) == 0 and not failed, failed
