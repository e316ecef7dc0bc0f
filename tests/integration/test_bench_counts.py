"""The ack-latency bench counts only records the broker acked.

Its max-rate step queues records with ``produce_batch``, which queues what fits in the client's
queue and returns that count (it raises only when nothing fits). The bench once counted every
call as a full batch: its figures then included records never sent, and its consume step waited
for records that did not exist (reported as a consumer "stall" at 64-78k of 100k records).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster
from harness.topics import create_topic

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_max_rate_step_counts_what_the_topic_holds(broker_cluster: BrokerCluster) -> None:
    """A queue much smaller than the records to send (so ``produce_batch`` queues part of a
    batch): the step's acked count is what the topic's high watermarks say, and its consume
    step reads every one of them back."""
    from confluent_kafka import Consumer, TopicPartition

    sys.path.insert(0, str(BENCH))
    try:
        import ack_latency
    finally:
        sys.path.remove(str(BENCH))
    broker = broker_cluster.start()
    topic = "counted"
    create_topic(broker.bootstrap, topic, 3)
    records = 6_000
    step = ack_latency.produce_max(
        broker.bootstrap, topic, records, os.urandom(256), queue_messages=1_500
    )
    assert (step.records, step.errors) == (records, 0)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "counts"})
    try:
        high = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(3)
        ]
    finally:
        consumer.close()
    assert sum(high) == records + 1  # and the step's first record, sent before timing
    read = ack_latency.consume(broker.bootstrap, topic, records + 1)
    assert (read.records, read.note) == (records + 1, "")
