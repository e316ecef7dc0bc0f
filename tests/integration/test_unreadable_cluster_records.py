"""A key of the cluster view that does not decode is left out, not fatal (``metadata/cluster``).

etcd is written by hand sometimes (a restore, an ``etcdctl put`` gone wrong, a tool of another
version). A reload after a watch resync already left such a key out; the first read at start-up
did not, so one bad topic or partition value kept every broker of the cluster from starting
(and a restarted one from coming back). What a user relies on, with a real etcd, a real broker
process and kafka-python: the broker starts, names the bad keys in its log, and serves the
topics that are intact.
"""

from __future__ import annotations

import asyncio

import pytest
from harness.brokers import new_cluster
from harness.etcd import harness_etcd
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration


def write_garbage(etcd_url: str, cluster: str) -> list[str]:
    """A topic record and a partition state that do not decode, as a broken restore leaves
    them; the keys written."""
    bad = [keys.topic_key(cluster, "broken"), keys.partition_state_key(cluster, "broken", 0)]

    async def write() -> None:
        etcd = await harness_etcd(etcd_url)
        try:
            for key in bad:
                await etcd.put(key, b"\xff\xfe{ not json")
        finally:
            await etcd.close()

    asyncio.run(write())
    return bad


def test_a_broker_starts_past_garbage_in_its_view_and_serves_the_rest(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("garbled")
    cluster = new_cluster(etcd_server.client_url, s3_server, workdir, "garbled")
    bad = write_garbage(etcd_server.client_url, cluster.cluster)
    try:
        broker = cluster.start()  # raised "the broker exited" before
        create_topics(broker.bootstrap, ["intact"], 1)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        producer.send("intact", b"kept").get(timeout=60)
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, consumer_timeout_ms=30_000)
        consumer.assign([TopicPartition("intact", 0)])
        consumer.seek_to_beginning()
        first = next(iter(consumer), None)  # None after 30 s without a record
        assert first is not None and first.value == b"kept"
        consumer.close()
        log = broker.log_path.read_text(errors="replace")
        for key in bad:
            assert f"cannot load {key}, left out of the cluster view" in log
        assert "Traceback" not in log
    finally:
        cluster.stop_all()
