"""The broker on Ceph radosgw, a real S3 implementation (moto is a mock): a round trip through
stock clients, and every acked record surviving a SIGKILL and a restart.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster, new_cluster
from harness.read_back import read_everything
from harness.s3 import S3Endpoint
from harness.topics import create_topic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = [pytest.mark.integration, pytest.mark.radosgw]


@pytest.fixture
def rgw_cluster(
    etcd_server: EmbeddedEtcd, radosgw_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    """Like ``broker_cluster``, on a fresh radosgw bucket."""
    cluster = new_cluster(
        etcd_server.client_url, radosgw_server, tmp_path, "rgw", name=cluster_name
    )
    try:
        yield cluster
    finally:
        cluster.stop_all()


def _produce(
    bootstrap: str, topic: str, values: list[bytes], partitions: int
) -> dict[tuple[int, int], bytes]:
    acked: dict[tuple[int, int], bytes] = {}
    failed: list[str] = []

    def report(err: object, msg: object) -> None:
        if err is None:
            acked[(msg.partition(), msg.offset())] = msg.value()  # type: ignore[attr-defined]
        else:
            failed.append(str(err))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    for i, value in enumerate(values):
        producer.produce(
            topic, value=value, key=b"k%d" % i, partition=i % partitions, on_delivery=report
        )
    assert producer.flush(60) == 0
    assert not failed, failed[:3]
    return acked


def test_round_trip_on_radosgw(rgw_cluster: BrokerCluster) -> None:
    broker = rgw_cluster.start()
    topic = "rgw-round-trip"
    create_topic(broker.bootstrap, topic, 2)
    acked = _produce(broker.bootstrap, topic, [b"value-%d" % i for i in range(50)], 2)
    assert sorted(acked) == [(p, o) for p in range(2) for o in range(25)]
    assert read_everything(broker.bootstrap, topic, 2) == acked

    # a second client, other codec, keyed with headers, read back by the first
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap, compression_type="gzip", acks="all"
    )
    sent = producer.send(
        topic,
        key=b"kp",
        value=b"from-kafka-python",
        partition=1,
        headers=[("h", b"1")],
        timestamp_ms=1_700_000_000_000,
    ).get(30)
    producer.close(10)
    assert (sent.partition, sent.offset) == (1, 25)
    consumer = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False
    )
    try:
        tp = KpTopicPartition(topic, 1)
        consumer.assign([tp])
        consumer.seek(tp, 25)
        records = []
        for _ in range(20):
            for batch in consumer.poll(timeout_ms=500).values():
                records += batch
            if records:
                break
    finally:
        consumer.close()
    [record] = records
    assert (record.key, record.value, record.headers, record.timestamp) == (
        b"kp",
        b"from-kafka-python",
        [("h", b"1")],
        1_700_000_000_000,
    )


def test_sigkill_restart_keeps_every_acked_record_on_radosgw(rgw_cluster: BrokerCluster) -> None:
    broker = rgw_cluster.start()
    topic = f"rgw-durable-{uuid.uuid4().hex[:6]}"
    create_topic(broker.bootstrap, topic, 3)
    acked = _produce(broker.bootstrap, topic, [b"before-%d" % i for i in range(150)], 3)
    assert len(acked) == 150

    broker.kill()
    restarted = rgw_cluster.start(port=broker.port)
    assert read_everything(restarted.bootstrap, topic, 3) == acked

    more = _produce(restarted.bootstrap, topic, [b"after-%d" % i for i in range(30)], 3)
    assert sorted(more) == [(p, o) for p in range(3) for o in range(50, 60)]
    assert read_everything(restarted.bootstrap, topic, 3) == acked | more
