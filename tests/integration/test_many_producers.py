"""Many idempotent producers on many partitions of one broker.

Each partition's state in etcd keeps the last five batches of up to 256 producers (so a
retried batch is acked once, even after a handoff); that is tens of KB per partition. A flush
commits many partitions in one etcd transaction, and etcd refuses requests over 1.5 MiB by
default: the commit must still go through, in as many transactions as it takes.
"""

from __future__ import annotations

import time

import pytest
from harness.batches import make_batch
from harness.brokers import BrokerCluster
from harness.kafka_wire import PRODUCE, KafkaWire
from harness.topics import create_topic

pytestmark = pytest.mark.integration

PARTITIONS = 32
PRODUCERS = 256  # the most producers a partition's state remembers
BATCHES_EACH = 5  # the batches per producer it remembers
PRODUCE_VERSION = 9


def _request(topic: str, producer_id: int, sequence: int) -> dict[str, object]:
    return {
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [
            {
                "name": topic,
                "partition_data": [
                    {
                        "index": p,
                        "records": make_batch(
                            0,
                            [b"%d-%d-%d" % (producer_id, p, sequence)],
                            producer_id=producer_id,
                            producer_epoch=0,
                            base_sequence=sequence,
                        ),
                    }
                    for p in range(PARTITIONS)
                ],
            }
        ],
    }


def test_commits_of_large_partition_states_fit_etcd_requests(broker_cluster: BrokerCluster) -> None:
    # The default session TTL, not the harness's 4 s: on a starved machine a keepalive can
    # wait behind these megabyte commits past 4 s, and the broker then gives up every
    # partition (seen once in CI at load 9). This test is about request sizes, not leases.
    broker = broker_cluster.start(KAFSCALE_ETCD__SESSION_TTL_S="10")
    topic = "many-producers"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    offsets: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    began = time.monotonic()
    with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
        for sequence in range(BATCHES_EACH):
            sent = [
                wire.send(PRODUCE, PRODUCE_VERSION, _request(topic, 10_000 + pid, sequence))
                for pid in range(PRODUCERS)
            ]
            for correlation_id in sent:
                received, response = wire.recv(PRODUCE, PRODUCE_VERSION)
                assert received == correlation_id
                for result in response.responses[0].partition_responses:
                    assert int(result.error_code) == 0, (int(result.index), result)
                    offsets[int(result.index)].append(int(result.base_offset))
    # Every batch of every producer got its own offset, densely, on every partition.
    expected = list(range(PRODUCERS * BATCHES_EACH))
    assert all(sorted(found) == expected for found in offsets.values())
    assert time.monotonic() - began < 120
    assert "too large" not in broker.tail(200)
