"""Idle groups are let go (``groups.idle_release_ms``) end to end: a broker process with an idle
time of a fraction of a second, real clients (kafka-python classic consumers and admin,
confluent-kafka with the consumer protocol).

What a user relies on, unchanged: a group whose consumers committed and closed keeps its
offsets, is listed by ListGroups and answers OffsetFetch, and a consumer that starts again in
it resumes from its committed offset. What changes is what the broker holds: once nobody asked
for the group for the idle time it is no longer coordinated (no runtime, no lease in etcd), so
a broker's memory and etcd's leases follow the groups in use, not every group ever used.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer
from harness.brokers import BrokerCluster, new_cluster
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

IDLE_ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFSCALE_GROUPS__IDLE_RELEASE_MS": "300",
}
DEADLINE_S = 60.0
RECORDS = 3


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path_factory.mktemp("idle"),
        "idle",
        extra_env=IDLE_ENV,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def _name(what: str) -> str:
    return f"idle-{what}-{uuid.uuid4().hex[:6]}"


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for value in values:
            producer.send(topic, value, partition=0)
        producer.flush(30)
    finally:
        producer.close(10)


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def classic_read_commit_close(bootstrap: str, group: str, topic: str, count: int) -> list[int]:
    """A kafka-python consumer of ``group`` reads ``count`` records, commits and closes: the
    offsets it read."""
    member = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=30_000,
        heartbeat_interval_ms=500,
    )
    read: list[int] = []
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(read) < count:
            assert time.monotonic() < deadline, f"read {len(read)} of {count}"
            for records in member.poll(timeout_ms=500).values():
                read.extend(record.offset for record in records)
        member.commit()
    finally:
        member.close()
    return read


def consumer_protocol_read_commit_close(bootstrap: str, group: str, topic: str) -> None:
    """A KIP-848 member (librdkafka, group.protocol=consumer) reads, commits and leaves."""
    member = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        member.subscribe([topic])
        read = 0
        deadline = time.monotonic() + DEADLINE_S
        while read < RECORDS:
            assert time.monotonic() < deadline, f"read {read} of {RECORDS}"
            message = member.poll(0.2)
            if message is not None and message.error() is None:
                read += 1
        member.commit(asynchronous=False)
    finally:
        member.close()


def test_a_closed_consumers_group_is_let_go_and_keeps_its_offsets_listing_and_position(
    cluster: BrokerCluster,
) -> None:
    bootstrap = cluster.bootstrap
    broker = cluster.brokers[0]
    topic = _name("t")
    create_topics(bootstrap, [topic], 1)
    _produce(bootstrap, topic, [b"%d" % i for i in range(RECORDS)])
    classic, kip848 = _name("classic"), _name("848")
    assert classic_read_commit_close(bootstrap, classic, topic, RECORDS) == list(range(RECORDS))
    consumer_protocol_read_commit_close(bootstrap, kip848, topic)

    def coordinated() -> set[str]:
        """The groups with a lease in etcd (a coordinator holds a runtime only with one)."""
        leases = keys.group_leases_prefix(cluster.cluster)
        under = leases[len(keys.cluster_prefix(cluster.cluster)) :]
        return {keys.group_from_key_part(key[len(leases) :]) for key in cluster.etcd_keys(under)}

    wait_until(
        lambda: (
            not coordinated() & {classic, kip848} and broker.status()["client_state"]["groups"] == 0
        ),
        "both groups to be let go",
    )
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listed = {str(g["group_id"]): g for g in admin.list_groups()}
        assert {classic, kip848} <= listed.keys()
        tp = TopicPartition(topic, 0)
        for group in (classic, kip848):
            assert admin.list_group_offsets({group: [tp]})[group][tp].offset == RECORDS
        described = admin.describe_groups([classic])[classic]
        assert described["error"] is None
        assert described["group_state"] == "Empty"
        assert described["protocol_type"] == "consumer"
        assert described["members"] == []
    finally:
        admin.close()

    # Let go again after the admin's requests; a consumer that starts in the group then
    # resumes from its committed offset.
    wait_until(lambda: classic not in coordinated(), f"{classic} to be let go again")
    _produce(bootstrap, topic, [b"later"])
    assert classic_read_commit_close(bootstrap, classic, topic, 1) == [RECORDS]
