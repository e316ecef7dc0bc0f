"""Offset retention (``offsets.retention.minutes``, KIP-211) end to end: a broker process with a
retention of a few seconds, real clients (kafka-python, confluent-kafka with the consumer
protocol).

What a Kafka user relies on: a group whose consumers closed loses its committed offsets once it
has been Empty for the retention, and then the group itself goes (ListGroups no longer shows it,
its etcd keys are gone); offsets committed outside group management (``assign()`` + commit)
expire after their own commit; a group with a live member keeps the offsets of the topics it
subscribes to however old, and loses those of a topic it no longer subscribes to one retention
after their commit; and a group that nobody asks for after a restart expires too (its
coordinator takes it on).
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaPartition
from harness.brokers import BrokerCluster, new_cluster
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.admin import KafkaAdminClient

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

RETENTION_ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFSCALE_GROUPS__OFFSETS_RETENTION_MINUTES": "0.07",  # 4.2 s
    "KAFSCALE_GROUPS__OFFSETS_RETENTION_CHECK_INTERVAL_MS": "300",
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
        tmp_path_factory.mktemp("retention"),
        "retention",
        extra_env=RETENTION_ENV,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def _name(what: str) -> str:
    return f"ret-{what}-{uuid.uuid4().hex[:6]}"


def _topic(bootstrap: str) -> str:
    topic = _name("t")
    create_topics(bootstrap, [topic], 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i in range(RECORDS):
            producer.send(topic, b"%d" % i, partition=0)
        producer.flush(30)
    finally:
        producer.close(10)
    return topic


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def subscribed(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    """A member of ``group`` that read every record and committed (it stays in the group,
    heartbeating from its own thread, until closed)."""
    member = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=30_000,
        heartbeat_interval_ms=500,
    )
    read = 0
    deadline = time.monotonic() + DEADLINE_S
    while read < RECORDS:
        assert time.monotonic() < deadline, f"read {read} of {RECORDS}"
        read += sum(len(records) for records in member.poll(timeout_ms=500).values())
    member.commit()
    return member


def standalone_commit(bootstrap: str, group: str, topic: str) -> None:
    """``assign()`` + commit: offsets outside group management (generation -1)."""
    member = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        member.assign([tp])
        member.commit({tp: OffsetAndMetadata(2, "", -1)})
    finally:
        member.close()


def read_and_commit(member: Consumer, topic: str) -> None:
    """Subscribe ``member`` to ``topic``, read its ``RECORDS`` records and commit them."""
    member.subscribe([topic])
    read = 0
    deadline = time.monotonic() + DEADLINE_S
    while read < RECORDS:
        assert time.monotonic() < deadline, f"read {read} of {RECORDS}"
        message = member.poll(0.2)
        if message is not None and message.error() is None:
            read += 1
    member.commit(asynchronous=False)


def consumer_protocol_commit(bootstrap: str, group: str, topic: str) -> None:
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
        read_and_commit(member, topic)
    finally:
        member.close()


class Groups:
    """What an operator sees with kafka-consumer-groups.sh: offsets and listed groups."""

    def __init__(self, cluster: BrokerCluster) -> None:
        self._cluster = cluster
        self._admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)

    def close(self) -> None:
        self._admin.close()

    def committed(self, group: str, topic: str) -> int:
        tp = TopicPartition(topic, 0)
        offsets = self._admin.list_group_offsets({group: [tp]})[group]
        return offsets[tp].offset if tp in offsets else -1

    def listed(self) -> set[str]:
        return {str(g["group_id"]) for g in self._admin.list_groups()}

    def stored_keys(self, group: str) -> list[str]:
        """The group's etcd keys (metadata, offsets)."""
        prefix = keys.group_prefix(self._cluster.cluster, group)
        return self._cluster.etcd_keys(prefix[len(keys.cluster_prefix(self._cluster.cluster)) :])

    def gone(self, group: str, topic: str) -> bool:
        return (
            self.committed(group, topic) == -1
            and group not in self.listed()
            and not self.stored_keys(group)
        )


@pytest.fixture
def groups(cluster: BrokerCluster) -> Iterator[Groups]:
    groups = Groups(cluster)
    try:
        yield groups
    finally:
        groups.close()


def test_empty_and_standalone_groups_expire_while_a_group_with_a_member_keeps_its_offsets(
    cluster: BrokerCluster, groups: Groups
) -> None:
    bootstrap = cluster.bootstrap
    topic = _topic(bootstrap)
    live, closed, standalone, kip848 = (_name(w) for w in ("live", "closed", "alone", "848"))
    member = subscribed(bootstrap, live, topic)
    try:
        subscribed(bootstrap, closed, topic).close()  # the group is Empty from now on
        standalone_commit(bootstrap, standalone, topic)
        consumer_protocol_commit(bootstrap, kip848, topic)
        assert groups.committed(closed, topic) == RECORDS  # kept until the retention passed
        assert groups.committed(standalone, topic) == 2
        wait_until(lambda: groups.gone(closed, topic), f"group {closed} to expire")
        wait_until(lambda: groups.gone(standalone, topic), f"group {standalone} to expire")
        wait_until(lambda: groups.gone(kip848, topic), f"group {kip848} to expire")
        # The live group committed before the closed one: its commit is older than the
        # retention by now. A few more checks run while its member stays.
        time.sleep(1.0)
        assert groups.committed(live, topic) == RECORDS
        assert live in groups.listed()
    finally:
        member.close()


def test_an_offset_committed_with_its_own_retention_time_outlives_the_brokers(
    cluster: BrokerCluster, groups: Groups
) -> None:
    """OffsetCommit v2-v4's ``retention_time`` (old clients, kafka-python's v2) sets the
    offset's own expiry, as Kafka's ``expireTimestamp``: ten minutes outlive the broker's few
    seconds, while a plain commit made later expires."""
    bootstrap = cluster.bootstrap
    topic = _topic(bootstrap)
    kept, plain = _name("kept"), _name("plain")
    commit = {
        "group_id": kept,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "retention_time": datetime.timedelta(minutes=10),
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
    }
    with KafkaWire(cluster.brokers[-1].bootstrap) as wire:
        answer = wire.request(8, 2, commit)  # OffsetCommit v2
    assert int(answer.topics[0].partitions[0].error_code) == 0
    standalone_commit(bootstrap, plain, topic)
    wait_until(lambda: groups.gone(plain, topic), f"group {plain} to expire")
    assert groups.committed(kept, topic) == 1


def test_a_group_nobody_asks_for_after_a_restart_expires(
    cluster: BrokerCluster, groups: Groups
) -> None:
    """The broker that coordinated the group stops; the next one is never asked about the
    group, and still expires it: otherwise every throwaway group id stays in etcd for good."""
    bootstrap = cluster.bootstrap
    topic = _topic(bootstrap)
    forgotten = _name("forgotten")
    subscribed(bootstrap, forgotten, topic).close()
    assert groups.stored_keys(forgotten)
    old = cluster.brokers[-1]
    old.stop()
    cluster.start(port=old.port)
    wait_until(lambda: not groups.stored_keys(forgotten), f"group {forgotten} to expire")


def test_a_stable_group_loses_the_offsets_of_a_topic_no_member_subscribes_to(
    cluster: BrokerCluster, groups: Groups
) -> None:
    """Kafka 2.5+: while a consumer group is Stable, the offsets of a topic none of its members
    subscribes to (a topic it moved away from) expire one retention after their commit; those
    of the topic its members read stay, and so does the group. A classic member (kafka-python)
    and a KIP-848 member (librdkafka, group.protocol=consumer), each subscribed to ``new``,
    commit an offset of ``old`` in their own group, which is never Empty meanwhile."""
    bootstrap = cluster.bootstrap
    old, new = _topic(bootstrap), _topic(bootstrap)
    classic, kip848 = _name("moved"), _name("moved848")
    member = subscribed(bootstrap, classic, new)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": kip848,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        read_and_commit(consumer, new)
        consumer.commit(offsets=[KafkaPartition(old, 0, 2)], asynchronous=False)
        member.commit({TopicPartition(old, 0): OffsetAndMetadata(2, "", -1)})
        for group in (classic, kip848):
            assert groups.committed(group, old) == 2
        moved = (classic, kip848)
        wait_until(lambda: all(groups.committed(g, old) == -1 for g in moved), f"{old} to expire")
        # ``new``'s commits came first: older than the retention too by now. A few more
        # checks run while the members stay subscribed to it.
        time.sleep(1.0)
        for group in moved:
            assert groups.committed(group, new) == RECORDS
            assert group in groups.listed()
    finally:
        consumer.close()
        member.close()
