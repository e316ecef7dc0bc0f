"""``kafscale status`` against a known cluster: two brokers, a topic whose partitions hold known
record counts, a group with known commits. Brokers, owners, high watermarks and lag are checked
in both the table and the JSON output."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness import children
from harness.brokers import BrokerCluster
from harness.topics import create_topic

from kafscale.broker.child_process import KAFSCALE

pytestmark = pytest.mark.integration

PER_PARTITION = {0: 7, 1: 12}
COMMITS = {0: 3, 1: 12}


def run_status(cluster: BrokerCluster, *flags: str) -> str:
    env = cluster.env(0, 0)
    result = children.run(
        [KAFSCALE, "status", *flags], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_owned(cluster: BrokerCluster, partitions: int) -> dict[str, object]:
    """The JSON status once every partition has an owner and every broker is ready."""
    deadline = time.monotonic() + 30
    while True:
        status = json.loads(run_status(cluster, "--json"))
        owned = all(p["owner"] is not None for p in status["partitions"])
        ready = all(b["state"] == "ready" for b in status["brokers"])
        if (owned and ready and len(status["partitions"]) == partitions) or (
            time.monotonic() > deadline
        ):
            return dict(status)
        time.sleep(0.5)


def test_status_shows_brokers_owners_and_lag(broker_cluster: BrokerCluster) -> None:
    first = broker_cluster.start()
    second = broker_cluster.start()
    topic, group = "status-topic", "status-group"
    create_topic(first.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": broker_cluster.bootstrap})
    for partition, count in PER_PARTITION.items():
        for i in range(count):
            producer.produce(topic, value=b"v%d" % i, partition=partition)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": first.bootstrap, "group.id": group})
    consumer.commit(
        offsets=[TopicPartition(topic, p, offset) for p, offset in COMMITS.items()],
        asynchronous=False,
    )
    consumer.close()

    status = wait_owned(broker_cluster, 2)
    brokers = {b["node_id"]: b for b in status["brokers"]}
    assert set(brokers) == {first.node_id, second.node_id}
    for broker in (first, second):
        row = brokers[broker.node_id]
        assert row["address"] == broker.bootstrap
        assert row["admin"] == f"127.0.0.1:{broker.admin_port}"
        assert row["state"] == "ready"
    assert sum(b["owned_partitions"] for b in brokers.values()) == 2
    partitions = {p["partition"]: p for p in status["partitions"] if p["topic"] == topic}
    assert {p: row["high_watermark"] for p, row in partitions.items()} == PER_PARTITION
    assert all(row["owner"] in brokers for row in partitions.values())
    lag = {(r["group"], r["partition"]): r["lag"] for r in status["lag"]}
    assert lag == {(group, p): PER_PARTITION[p] - COMMITS[p] for p in PER_PARTITION}

    table = run_status(broker_cluster)
    assert "2 brokers, 1 topics, 2 partitions (0 without owner)" in table
    group_totals = table.split("GROUPS")[1]
    assert f"{group}  {sum(PER_PARTITION[p] - COMMITS[p] for p in PER_PARTITION)}" in group_totals
    assert f"{group}  {topic}  0          3          7               4" in group_totals


def test_status_without_etcd_is_a_clear_error(broker_cluster: BrokerCluster) -> None:
    env = broker_cluster.env(0, 0, KAFSCALE_ETCD__ENDPOINTS='["http://127.0.0.1:1"]',
                             KAFSCALE_ETCD__TIMEOUT_S="1")  # fmt: skip
    result = children.run([KAFSCALE, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "kafscale status: etcd" in result.stderr
