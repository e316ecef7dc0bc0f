"""A broker process on etcd and S3 serves a produce/consume round trip (confluent-kafka)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import BrokerProcess

pytestmark = pytest.mark.integration


def test_round_trip_confluent(broker: BrokerProcess) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    delivered = []
    for i in range(100):
        producer.produce(
            "smoke",
            key=b"k%d" % i,
            value=b"v%d" % i,
            on_delivery=lambda err, msg: delivered.append((err, msg.offset())),
        )
    assert producer.flush(30) == 0
    assert all(err is None for err, _ in delivered)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    partitions = consumer.list_topics("smoke", timeout=10).topics["smoke"].partitions
    consumer.assign([TopicPartition("smoke", p, 0) for p in partitions])
    values = set()
    for _ in range(200):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.add(message.value())
        if len(values) == 100:
            break
    consumer.close()
    assert values == {b"v%d" % i for i in range(100)}
