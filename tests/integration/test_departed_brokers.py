"""A broker that left stays in Metadata for a grace period (``metadata.departed_broker_grace_s``,
``broker/metadata/listed_brokers.py``), never as leader, coordinator or controller.

librdkafka ≥ 2.10 destroys the handle of any broker missing from one Metadata answer. A
transactional producer whose group coordinator stopped, and whose Metadata refresh dropped that
broker before its ``send_offsets_to_transaction``, then waited on the destroyed handle past the
call's own timeout (librdkafka #5511; 4 runs of 5 without the forced refresh). Real brokers,
etcd and confluent-kafka; the producer runs in a child process so that a hung call fails the
test within a bound and is killed with it."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness import children
from harness.brokers import STEADY_SESSION_TTL_S, BrokerCluster, BrokerProcess
from harness.etcd import harness_etcd
from harness.kafka_wire import KafkaWire, metadata_body
from harness.topics import create_topic

from kafscale.broker.groups.leases import choose_coordinator
from kafscale.broker.metadata import keys

pytestmark = pytest.mark.integration

METADATA, DESCRIBE_CLUSTER = 3, 60

SEND_OFFSETS_TIMEOUT_S = 20
ANSWER_BOUND_S = 60.0
"""How long the test waits for the call that has a 20-s timeout: well past it, well under the
hang (which never ends)."""

WORKER = r"""
import sys
from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap, group, txn_id, source, sink, timeout_s = sys.argv[1:]
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
consumer.subscribe([source])
got = []
for _ in range(120):
    message = consumer.poll(1)
    if message is not None and not message.error():
        got.append(message)
    if len(got) >= 3:
        break
assert got, "nothing consumed"
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
producer.init_transactions(30)
# One whole transaction: the group's coordinator is then a broker handle librdkafka keeps.
producer.begin_transaction()
producer.produce(sink, value=b"first")
offsets = [TopicPartition(source, 0, got[0].offset() + 1)]
producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
producer.commit_transaction(30)
producer.begin_transaction()
producer.produce(sink, value=b"second")
producer.flush(30)
print("ready", flush=True)
sys.stdin.readline()  # the group's coordinator has stopped
producer.list_topics(timeout=10)  # the Metadata refresh that used to drop it
offsets = [TopicPartition(source, 0, got[-1].offset() + 1)]
try:
    producer.send_offsets_to_transaction(
        offsets, consumer.consumer_group_metadata(), float(timeout_s))
    print("sent", flush=True)
    producer.commit_transaction(30)
    print("committed", flush=True)
except Exception as exc:
    print("failed", repr(exc), flush=True)
"""


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The child's stdout lines, as they come (a thread reads them: ``readline`` blocks)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def _next_line(lines: queue.Queue[str], bound_s: float, waiting_for: str) -> str:
    try:
        return lines.get(timeout=bound_s)
    except queue.Empty:
        pytest.fail(f"no answer within {bound_s:.0f} s: {waiting_for}")


def _lease_holder(cluster: BrokerCluster, key: str) -> int | None:
    async def read() -> int | None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(key)
            return None if entry is None else int(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def _names_on_different_brokers(live: list[int]) -> tuple[str, str]:
    """A group and a transactional id whose coordinators (the stable pick of
    ``choose_coordinator``, nobody holding either yet) are different brokers."""
    while True:
        group, txn_id = f"g-{uuid.uuid4().hex[:8]}", f"tx-{uuid.uuid4().hex[:8]}"
        if choose_coordinator(group, None, live) != choose_coordinator(txn_id, None, live):
            return group, txn_id


def _start(cluster: BrokerCluster, **overrides: str) -> BrokerProcess:
    return cluster.start(KAFSCALE_ETCD__SESSION_TTL_S=STEADY_SESSION_TTL_S, **overrides)


def test_send_offsets_to_transaction_returns_after_its_group_coordinator_stopped(
    broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    """Before: the call blocked past 60 s although its timeout was 20 s (librdkafka had
    decommissioned the stopped coordinator at the forced Metadata refresh)."""
    brokers = [_start(broker_cluster), _start(broker_cluster)]
    by_id = {b.node_id: b for b in brokers}
    bootstrap = broker_cluster.bootstrap
    create_topic(bootstrap, "in", 1)
    create_topic(bootstrap, "out", 1)
    source = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        source.produce("in", value=b"v%d" % i)
    assert source.flush(30) == 0
    group, txn_id = _names_on_different_brokers(sorted(by_id))
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, str(script), bootstrap, group, txn_id, "in", "out"]
    worker = children.spawn(
        [*command, str(SEND_OFFSETS_TIMEOUT_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = _lines(worker)
        assert _next_line(lines, 180, "the first transaction") == "ready"
        cluster = broker_cluster.cluster
        group_coordinator = _lease_holder(broker_cluster, keys.group_lease_key(cluster, group))
        txn_coordinator = _lease_holder(broker_cluster, keys.transaction_lease_key(cluster, txn_id))
        assert group_coordinator is not None and txn_coordinator is not None
        assert group_coordinator != txn_coordinator, "one broker coordinates both"
        by_id[group_coordinator].stop()
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
        what = f"send_offsets_to_transaction(..., {SEND_OFFSETS_TIMEOUT_S}) (librdkafka #5511)"
        assert _next_line(lines, ANSWER_BOUND_S, what) == "sent"
        assert _next_line(lines, ANSWER_BOUND_S, "commit_transaction(30)") == "committed"
    finally:
        worker.kill()
        worker.wait(30)


def _metadata_ids(broker: BrokerProcess) -> tuple[list[int], int, dict[int, int]]:
    """(listed node ids, controller id, leader of each partition of ``t``) from ``broker``."""
    with KafkaWire(broker.bootstrap) as wire:
        answer: Any = wire.request(METADATA, 9, metadata_body(["t"]))
    (topic,) = answer.topics
    leaders = {p.partition_index: p.leader_id for p in topic.partitions}
    return sorted(b.node_id for b in answer.brokers), answer.controller_id, leaders


def _described_ids(broker: BrokerProcess) -> list[int]:
    with KafkaWire(broker.bootstrap) as wire:
        answer: Any = wire.request(
            DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False}
        )
    return sorted(b.broker_id for b in answer.brokers)


def _wait_unregistered(cluster: BrokerCluster, node_id: int) -> None:
    deadline = time.monotonic() + 60
    while keys.broker_key(cluster.cluster, node_id) in cluster.etcd_keys("brokers/"):
        assert time.monotonic() < deadline, f"broker {node_id} is still registered"
        time.sleep(0.1)


def test_metadata_and_describe_cluster_list_a_departed_broker_but_never_as_leader(
    broker_cluster: BrokerCluster,
) -> None:
    """Before: a stopped broker left both lists at once."""
    leaving = _start(broker_cluster)  # the lowest id: the controller while it lived
    lister = _start(broker_cluster)
    not_lister = _start(broker_cluster, KAFSCALE_METADATA__DEPARTED_BROKER_GRACE_S="0")
    create_topic(broker_cluster.bootstrap, "t", 6)
    assert _metadata_ids(lister)[1] == leaving.node_id
    leaving.stop()
    _wait_unregistered(broker_cluster, leaving.node_id)
    every_id = sorted([lister.node_id, not_lister.node_id, leaving.node_id])
    live_ids = sorted([lister.node_id, not_lister.node_id])
    deadline = time.monotonic() + 60
    while True:  # the leaving broker's partitions move to the others
        listed, controller, leaders = _metadata_ids(lister)
        if all(leader in live_ids for leader in leaders.values()):
            break
        assert time.monotonic() < deadline, f"partitions still leaderless: {leaders}"
        time.sleep(0.2)
    assert listed == every_id
    assert controller in live_ids
    assert _described_ids(lister) == every_id
    assert _metadata_ids(not_lister)[0] == live_ids  # 0: the grace is off
    assert _described_ids(not_lister) == live_ids
