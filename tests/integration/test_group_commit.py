"""Group commit: an ack costs one PUT and one etcd commit, not a wait for a flush tick.

Every test here sets ``log.flush_interval_ms`` to a minute: a broker that still flushed on that
tick would not answer a single produce within the test's request timeouts. The counts are what
a user relies on: one round (one segment per partition, one etcd transaction) per request when
each request waits for its ack, and no more rounds than the minimum interval allows.
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import KafkaWire, produce_partition
from harness.topics import create_topic

pytestmark = pytest.mark.integration

PRODUCE = 0
NO_TICK = {"KAFSCALE_LOG__FLUSH_INTERVAL_MS": "60000"}


def produce_to_partitions(
    wire: KafkaWire, topic: str, batches: dict[int, bytes], timeout_ms: int = 20_000
) -> list[tuple[int, int]]:
    """One acks=all produce request carrying a batch for each partition; (code, base offset)
    per partition, in partition order."""
    body = {
        "acks": -1,
        "timeout": timeout_ms,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [
                    {"index": p, "records": batch} for p, batch in sorted(batches.items())
                ],
            }
        ],
    }
    response = wire.request(PRODUCE, 9, body)
    partitions = response.responses[0].partition_responses
    return [(int(p.error_code), int(p.base_offset)) for p in partitions]


def segments(cluster: BrokerCluster, topic: str) -> list[str]:
    keys = cluster.object_keys(f"{cluster.cluster}/topics/{topic}/")
    return [key for key in keys if key.endswith(".kfs")]


def etcd_txns(cluster: BrokerCluster) -> int:
    """etcd's own count of Txn RPCs served (every client's)."""
    text = urllib.request.urlopen(cluster.etcd_url + "/metrics", timeout=5).read().decode()
    return int(
        sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith("grpc_server_started_total{") and 'grpc_method="Txn"' in line
        )
    )


def test_a_producer_waiting_for_each_ack_gets_one_round_per_request(
    broker_cluster: BrokerCluster,
) -> None:
    """Ten requests, each sent after the previous one was acked, across three partitions: each
    is acked by a round of its own (three segments, one etcd transaction), in order, while the
    flush interval is a minute."""
    broker = broker_cluster.start(**NO_TICK, KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS="0")
    topic = "one-at-a-time"
    create_topic(broker.bootstrap, topic, 3)
    with KafkaWire(broker.bootstrap, timeout_s=30) as wire:
        # Takes the three partitions (acquisition transactions) before counting.
        assert [code for code, _ in produce_to_partitions(wire, topic, _batches(0))] == [0] * 3
        before = etcd_txns(broker_cluster)
        acked = []
        for i in range(1, 11):
            outcome = produce_to_partitions(wire, topic, _batches(i))
            assert [code for code, _ in outcome] == [0] * 3
            acked.append([offset for _, offset in outcome])
        txns = etcd_txns(broker_cluster) - before
    assert acked == [[i, i, i] for i in range(1, 11)]  # offsets dense, in request order
    assert len(segments(broker_cluster, topic)) == 3 * 11  # a segment per partition and round
    assert txns == 10  # one commit transaction per round, for all three partitions


def test_the_minimum_interval_bounds_the_rounds(broker_cluster: BrokerCluster) -> None:
    """Sixty requests in flight at once on one connection, with a 1-s minimum interval: they
    share the rounds the interval allows instead of getting one each."""
    broker = broker_cluster.start(**NO_TICK, KAFSCALE_LOG__FLUSH_MIN_INTERVAL_MS="1000")
    topic = "budgeted"
    create_topic(broker.bootstrap, topic, 1)
    requests = 60
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        began = time.monotonic()
        for i in range(requests):  # pipelined: every request is sent before any ack is read
            wire.send(PRODUCE, 9, _body(topic, make_batch(0, [b"v%d" % i])))
        codes = [produce_partition(wire.recv(PRODUCE, 9)[1])[0] for _ in range(requests)]
        elapsed_s = time.monotonic() - began
    assert codes == [0] * requests
    rounds = len(segments(broker_cluster, topic))
    # The broker's start counts as a round: at most one round per started second since.
    assert 1 <= rounds <= int(elapsed_s) + 1
    assert rounds < requests


def test_idempotent_producer_on_defaults_is_acked_without_a_tick(
    broker_cluster: BrokerCluster,
) -> None:
    """confluent-kafka's idempotent producer (five requests in flight), with the S3 store's
    default interval: every record is acked, stored once and in order, long before the flush
    interval of a minute would have come round."""
    from confluent_kafka import Producer

    broker = broker_cluster.start(**NO_TICK)
    topic = "idempotent"
    create_topic(broker.bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 0,
            "batch.num.messages": 10,  # many small requests, five in flight
            "message.timeout.ms": 30_000,
        }
    )
    acked: list[int] = []
    errors: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append(msg.offset())  # type: ignore[attr-defined]

    for i in range(500):
        producer.produce(topic, value=b"%d" % i, partition=0, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []
    assert acked == list(range(500))


def _batches(i: int) -> dict[int, bytes]:
    return {p: make_batch(0, [b"r%d-p%d" % (i, p)]) for p in range(3)}


def _body(topic: str, batch: bytes) -> dict[str, object]:
    return {
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    }
