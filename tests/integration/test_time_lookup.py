"""ListOffsets by timestamp reads near its answer, not the whole partition from the log start.

The partition state keeps time marks (offset, largest timestamp below it), dense near the head,
and the largest timestamp ever committed. To show that a look-up uses them, the test deletes the
older segment objects behind the broker's back (a broker without a cache): a look-up that read
from the log start would fail on the first missing object.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from harness.brokers import BrokerCluster

pytestmark = pytest.mark.integration

SEGMENTS = 40
GONE = 30  # the oldest segment objects, deleted behind the broker's back


def test_look_ups_by_time_skip_what_their_time_marks_rule_out(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(KAFSCALE_LOG__CACHE_BYTES="0")
    topic = f"times-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    base_ms = int(time.time() * 1000) - 3_600_000
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(SEGMENTS):  # one acked record per flush: one segment each
        producer.produce(topic, value=b"r%d" % i, partition=0, timestamp=base_ms + i * 1000)
        assert producer.flush(10) == 0

    prefix = f"{broker_cluster.cluster}/topics/{topic}/"
    segments = sorted(k for k in broker_cluster.object_keys(prefix) if k.endswith(".kfs"))
    assert len(segments) == SEGMENTS
    broker_cluster.s3.client().delete_objects(
        Bucket=broker_cluster.bucket,
        Delete={"Objects": [{"Key": key} for key in segments[:GONE]]},
    )

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "times"})
    try:
        # exactly on record 35's time, and between records 36 and 37
        for target, expected in ((base_ms + 35_000, 35), (base_ms + 36_500, 37)):
            [found] = consumer.offsets_for_times([CkTopicPartition(topic, 0, target)], 10)
            assert found.error is None, found.error
            assert found.offset == expected
    finally:
        consumer.close()

    # the largest timestamp comes from the state, not from a scan of every batch
    [future] = admin.list_offsets({CkTopicPartition(topic, 0): OffsetSpec.max_timestamp()}).values()
    found_max = future.result(30)
    assert (found_max.offset, found_max.timestamp) == (SEGMENTS - 1, base_ms + 39_000)
