"""The broker uses every etcd endpoint: a real 3-member etcd cluster loses the member a broker
talks to, and produce goes on within the session TTL with nothing acked lost; a member that
freezes under a broker's watches does not leave its view of the cluster behind. A bad endpoint
is a one-line start-up error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness import children
from harness.brokers import BrokerCluster
from harness.children import settings_free_env
from harness.etcd import harness_etcd_binary
from harness.kafka_wire import KafkaWire, metadata_body
from harness.ports import free_ports
from harness.topics import create_topics

from kafscale.broker.child_process import KAFSCALE
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.topics import create_topic
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, MetadataTimeout

pytestmark = pytest.mark.integration

SESSION_TTL_S = 4


@pytest.fixture
def etcd_trio(tmp_path: Path) -> Iterator[list[EmbeddedEtcd]]:
    """Three etcd members forming one cluster on loopback."""
    names = [f"m{i}" for i in range(3)]
    peers = free_ports(len(names))
    initial = ",".join(f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, peers, strict=True))
    members = [
        EmbeddedEtcd(
            tmp_path / name,
            name=name,
            peer_port=peer,
            fast=True,
            no_fsync=True,
            die_with_parent=True,
            initial_cluster=initial,
            binary=harness_etcd_binary(),
        )
        for name, peer in zip(names, peers, strict=True)
    ]
    with ExitStack() as stack:
        for member in members:
            member.launch()
            stack.callback(member.kill)
        for member in members:
            member.wait_healthy(30)
        yield members


def test_losing_the_member_a_broker_talks_to_costs_no_acked_record(
    broker_cluster: BrokerCluster, etcd_trio: list[EmbeddedEtcd]
) -> None:
    endpoints = [member.client_url for member in etcd_trio]
    broker_cluster.etcd_url = endpoints[0]
    broker = broker_cluster.start(KAFSCALE_ETCD__ENDPOINTS=json.dumps(endpoints))
    create_topics(broker.bootstrap, ["failover"], partitions=2)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "acks": "all", "message.timeout.ms": 60000}
    )
    acked: list[bytes] = []
    failed: list[Any] = []

    def on_delivery(error: Any, message: Any) -> None:
        (acked if error is None else failed).append(message.value() if error is None else error)

    def produce(start: int, count: int) -> None:
        for i in range(start, start + count):
            producer.produce("failover", value=b"f%d" % i, on_delivery=on_delivery)
        assert producer.flush(60) == 0

    produce(0, 100)
    etcd_trio[0].kill()  # the member the broker talks to: the first endpoint that answered
    killed_at = time.monotonic()
    produce(100, 1)
    resumed_s = time.monotonic() - killed_at
    produce(101, 199)
    assert not failed, failed
    assert len(acked) == 300
    assert resumed_s < SESSION_TTL_S + 6, resumed_s
    assert broker.alive and broker.status()["ready"]

    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "failover", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition("failover", p, 0) for p in range(2)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < len(acked) and time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert sorted(values) == sorted(acked)


def _topics_seen_by(bootstrap: str) -> set[str]:
    """The topics a broker's Metadata names (answered from its view, never read from etcd)."""
    with KafkaWire(bootstrap) as wire:
        response = wire.request(3, 9, metadata_body(None, allow_auto_topic_creation=False))
    return {topic.name for topic in response.topics}


async def _create_elsewhere(endpoints: list[str], cluster: str, topic: str) -> None:
    """Create ``topic`` in etcd through ``endpoints`` alone (no broker), again while etcd times
    out: the frozen member may have been its leader, and a write waits out the election."""
    etcd = await Etcd.connect(endpoints, 5.0)
    try:
        for _ in range(10):
            try:
                await create_topic(etcd, cluster, topic, 1, {})
                return
            except MetadataTimeout:
                await asyncio.sleep(0.5)
            except KafkaError as error:  # a timed-out try that was applied after all
                if error.code is ErrorCode.TOPIC_ALREADY_EXISTS:
                    return
                raise
        raise AssertionError(f"etcd at {endpoints} never took the topic")
    finally:
        await etcd.close()


def test_a_member_frozen_under_the_watches_leaves_no_broker_behind(
    broker_cluster: BrokerCluster, etcd_trio: list[EmbeddedEtcd]
) -> None:
    """A broker's watches sit on its first etcd member. Frozen (SIGSTOP; a partitioned or
    diverged member is as silent), the member keeps the streams open and delivers nothing while
    the other two go on: the broker must notice and watch elsewhere, not answer from a stale
    view for as long as the member stays frozen (the fault campaign's seed 16)."""
    endpoints = [member.client_url for member in etcd_trio]
    broker_cluster.etcd_url = endpoints[1]
    broker = broker_cluster.start(KAFSCALE_ETCD__ENDPOINTS=json.dumps(endpoints))
    frozen = etcd_trio[0].pid
    assert frozen is not None
    children.freeze(frozen)  # stopped: a watch event from it now would make the test prove nothing
    try:
        asyncio.run(_create_elsewhere(endpoints[1:], broker_cluster.cluster, "after"))
        deadline = time.monotonic() + 30
        seen = _topics_seen_by(broker.bootstrap)
        while "after" not in seen and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = _topics_seen_by(broker.bootstrap)
        assert "after" in seen, f"a topic created 30 s ago is missing from {sorted(seen)}"
        assert broker.alive
    finally:
        os.kill(frozen, signal.SIGCONT)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [("ftp://127.0.0.1:2379", "is not http(s)://host:port"), ("http://etcd:notaport", "port")],
)
def test_a_bad_etcd_endpoint_is_one_clear_line(endpoint: str, expected: str) -> None:
    result = children.run(
        [KAFSCALE, "broker", "--storage-kind", "local", "--etcd-endpoints", json.dumps([endpoint])],
        env=settings_free_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
