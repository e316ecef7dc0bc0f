"""OffsetDelete (API 47) end to end: broker processes on etcd and S3, real admin clients.

What ``kafka-consumer-groups.sh --delete-offsets`` relies on: an Empty group's offsets go (and
its next consumer follows ``auto.offset.reset``); a group with members keeps the offsets of the
topics they subscribe to (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others; an unknown group is
GROUP_ID_NOT_FOUND; a non-consumer group with members is NON_EMPTY_GROUP; the request goes to
the group's coordinator, also through the proxy; the authorizer asks DELETE on the group and
READ on each topic. (confluent-kafka's AdminClient has no call for it: it alters and lists.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.groups import open_transaction
from harness.kafka_wire import KafkaWire
from harness.offsets_admin import java_lines
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.secured import authorizing_cluster, kafscale_cli, make_topics
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

OFFSET_DELETE, JOIN_GROUP, OFFSET_COMMIT = 47, 11, 8
GROUP_ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
}
DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def kafka(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    """One broker for the module's tests that neither stop nor reconfigure it: each has topics
    and groups of its own (``_name``)."""
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path_factory.mktemp("od"), "od")
    try:
        yield cluster.start(**GROUP_ENV)
    finally:
        cluster.stop_all()


def _name(what: str) -> str:
    return f"od-{what}-{uuid.uuid4().hex[:6]}"


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, b"%d" % i, partition=p)
        producer.flush(30)
    finally:
        producer.close(10)


def consumer(bootstrap: str, group: str, *topics: str) -> KafkaConsumer:
    return KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
    )


def consume(member: KafkaConsumer, count: int) -> dict[int, list[int]]:
    """Poll until ``count`` records came; the offsets read per partition."""
    read: dict[int, list[int]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while sum(map(len, read.values())) < count:
        assert time.monotonic() < deadline, f"read {read}, expected {count} records"
        for tp, records in member.poll(timeout_ms=500).items():
            read.setdefault(tp.partition, []).extend(r.offset for r in records)
    return read


def committed(admin: KafkaAdminClient, group: str, tps: list[TopicPartition]) -> dict[Any, int]:
    offsets = admin.list_group_offsets({group: tps})[group]
    return {tp: offsets[tp].offset if tp in offsets else -1 for tp in tps}


def test_an_empty_groups_offsets_go_and_its_next_consumer_follows_auto_offset_reset(
    kafka: BrokerProcess,
) -> None:
    topic, group = _name("t"), _name("g")
    create_topics(kafka.bootstrap, [topic], 2)
    produce(kafka.bootstrap, topic, 2, 10)
    first = consumer(kafka.bootstrap, group, topic)
    assert sorted(len(v) for v in consume(first, 20).values()) == [10, 10]
    first.commit()
    first.close()  # the group is Empty now
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        assert committed(admin, group, [p0, p1]) == {p0: 10, p1: 10}
        assert admin.delete_group_offsets(group, [p0]) == {p0: NoError}
        assert committed(admin, group, [p0, p1]) == {p0: -1, p1: 10}
        # a partition without a committed offset is answered NONE, as Kafka answers it
        assert admin.delete_group_offsets(group, [p0]) == {p0: NoError}
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group_offsets(_name("nobody"), [p0])
    finally:
        admin.close()
    produce(kafka.bootstrap, topic, 2, 5)
    second = consumer(kafka.bootstrap, group, topic)
    try:
        read = consume(second, 15 + 5)  # p0 again from the start (earliest), p1 from 10
    finally:
        second.close()
    assert read == {0: list(range(15)), 1: list(range(10, 15))}


def test_a_group_with_members_keeps_the_offsets_of_topics_they_subscribe_to(
    kafka: BrokerProcess,
) -> None:
    consumed_topic, other_topic, group = _name("a"), _name("b"), _name("g")
    create_topics(kafka.bootstrap, [consumed_topic, other_topic], 1)
    produce(kafka.bootstrap, consumed_topic, 1, 3)
    produce(kafka.bootstrap, other_topic, 1, 3)
    earlier = consumer(kafka.bootstrap, group, other_topic)
    consume(earlier, 3)
    earlier.commit()
    earlier.close()
    member = consumer(kafka.bootstrap, group, consumed_topic)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        consume(member, 3)
        member.commit()  # the member stays in the group (Stable), heartbeating
        a0, b0 = TopicPartition(consumed_topic, 0), TopicPartition(other_topic, 0)
        answers = admin.delete_group_offsets(group, [a0, b0])
        assert answers == {a0: GroupSubscribedToTopicError, b0: NoError}
        assert committed(admin, group, [a0, b0]) == {a0: 3, b0: -1}
        member.close()
        assert admin.delete_group_offsets(group, [a0]) == {a0: NoError}
        assert committed(admin, group, [a0]) == {a0: -1}
    finally:
        admin.close()


def test_a_consumer_protocol_group_keeps_the_offsets_of_its_subscriptions(
    kafka: BrokerProcess,
) -> None:
    """A KIP-848 group (librdkafka, group.protocol=consumer): its members' subscriptions."""
    consumed_topic, other_topic, group = _name("a"), _name("b"), _name("g")
    create_topics(kafka.bootstrap, [consumed_topic, other_topic], 1)
    produce(kafka.bootstrap, consumed_topic, 1, 3)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    a0, b0 = TopicPartition(consumed_topic, 0), TopicPartition(other_topic, 0)
    admin.alter_group_offsets(group, {b0: OffsetAndMetadata(1, "", -1)})
    member = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        member.subscribe([consumed_topic])
        read = 0
        deadline = time.monotonic() + DEADLINE_S
        while read < 3:
            assert time.monotonic() < deadline, f"read {read} of 3 records"
            message = member.poll(0.2)
            if message is not None and message.error() is None:
                read += 1
        member.commit(asynchronous=False)
        assert admin.delete_group_offsets(group, [a0, b0]) == {
            a0: GroupSubscribedToTopicError,
            b0: NoError,
        }
        assert committed(admin, group, [a0, b0]) == {a0: 3, b0: -1}
    finally:
        member.close()
        admin.close()


def test_wire_answers_for_group_level_errors(kafka: BrokerProcess) -> None:
    """Kafka's group-level answers (no topics in them): INVALID_GROUP_ID for "", a
    non-consumer group with members NON_EMPTY_GROUP; unknown partitions per partition."""
    topic, group = _name("t"), _name("connect")
    create_topics(kafka.bootstrap, [topic], 1)
    with KafkaWire(kafka.bootstrap) as wire:
        joined = wire.request(
            JOIN_GROUP,
            3,
            {
                "group_id": group,
                "session_timeout": 30_000,
                "rebalance_timeout": 30_000,
                "member_id": "",
                "protocol_type": "connect",
                "protocols": [{"name": "default", "metadata": b"\x00\x01"}],
            },
        )
        assert int(joined.error_code) == 0
        asked = [{"name": topic, "partitions": [{"partition_index": 0}, {"partition_index": 7}]}]
        busy = wire.request(OFFSET_DELETE, 0, {"group_id": group, "topics": asked})
        assert (int(busy.error_code), busy.topics) == (68, ())  # NON_EMPTY_GROUP
        nameless = wire.request(OFFSET_DELETE, 0, {"group_id": "", "topics": asked})
        assert (int(nameless.error_code), nameless.topics) == (24, ())  # INVALID_GROUP_ID
        simple = _name("simple")
        commit = simple_commit(simple, topic)
        assert int(wire.request(OFFSET_COMMIT, 8, commit).topics[0].partitions[0].error_code) == 0
        answer = wire.request(OFFSET_DELETE, 0, {"group_id": simple, "topics": asked})
    assert int(answer.error_code) == 0
    codes = [(int(p.partition_index), int(p.error_code)) for p in answer.topics[0].partitions]
    assert codes == [(0, 0), (7, 3)]  # UNKNOWN_TOPIC_OR_PARTITION for a partition not there


def test_through_the_proxy_the_coordinator_deletes(broker_cluster: BrokerCluster) -> None:
    """Two brokers behind a proxy: the request reaches the group's coordinator, whichever."""
    broker_cluster.start(**GROUP_ENV)
    broker_cluster.start(**GROUP_ENV)
    proxy = start_proxy(broker_cluster)
    topic = _name("t")
    create_topics(proxy.bootstrap, [topic], 2)
    produce(proxy.bootstrap, topic, 2, 4)
    groups = [_name(f"g{i}") for i in range(4)]  # coordinators spread over both brokers
    for group in groups:
        member = consumer(proxy.bootstrap, group, topic)
        consume(member, 8)
        member.commit()
        member.close()
    admin = KafkaAdminClient(bootstrap_servers=proxy.bootstrap)
    try:
        p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        for group in groups:
            assert admin.delete_group_offsets(group, [p1]) == {p1: NoError}
            assert committed(admin, group, [p0, p1]) == {p0: 4, p1: -1}
    finally:
        admin.close()
    # straight to a broker, only the group's coordinator answers it
    body = {
        "group_id": groups[0],
        "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}],
    }
    answers = []
    for broker in broker_cluster.brokers[:2]:
        with KafkaWire(broker.bootstrap) as wire:
            answers.append(int(wire.request(OFFSET_DELETE, 0, body).error_code))
    assert sorted(answers) == [0, 16]  # NONE at the coordinator, NOT_COORDINATOR elsewhere


def committed_once(
    admin: KafkaAdminClient, group: str, tps: list[TopicPartition], tp: TopicPartition, offset: int
) -> dict[Any, int]:
    """The committed offsets of ``tps`` once ``tp``'s is ``offset`` (a transaction settled)."""
    deadline = time.monotonic() + DEADLINE_S
    while (seen := committed(admin, group, tps))[tp] != offset:
        assert time.monotonic() < deadline, f"the transaction's offsets: {seen}"
        time.sleep(0.1)
    return seen


def test_deleting_offsets_drops_those_pending_in_an_open_transaction(
    broker_cluster: BrokerCluster,
) -> None:
    """Kafka's tombstone also removes a partition's offsets pending in open transactions
    (``OffsetMetadataManager.replay``): a transaction that sent offsets
    (send_offsets_to_transaction), then saw them deleted, does not bring them back when it
    commits. Its offsets for a partition that was not deleted become visible as usual."""
    kafka = broker_cluster.start(**GROUP_ENV, KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="200")
    topic, group = _name("t"), _name("g")
    create_topics(kafka.bootstrap, [topic], 3)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    p0, p1, p2 = (TopicPartition(topic, p) for p in range(3))
    admin.alter_group_offsets(group, {p0: OffsetAndMetadata(5, "", -1)})  # an Empty group
    try:
        with open_transaction(kafka.bootstrap, group, topic, 2, {0: 10, 1: 7, 2: 4}) as txn:
            # p0: committed 5 and pending 10; p1: pending only. Both go.
            assert admin.delete_group_offsets(group, [p0, p1]) == {p0: NoError, p1: NoError}
            txn.commit_transaction(30)
        seen = committed_once(admin, group, [p0, p1, p2], p2, 4)
    finally:
        admin.close()
    assert seen == {p0: -1, p1: -1, p2: 4}
    stored = broker_cluster.etcd_keys(f"groups/{group}/")  # what a next coordinator loads
    assert [k.split("/groups/")[1] for k in stored if "offsets/" in k] == [
        f"{group}/offsets/{topic}/2"
    ]


def test_a_group_with_only_offsets_pending_in_a_transaction_is_found(
    broker_cluster: BrokerCluster,
) -> None:
    """Kafka creates an empty classic group at the first TxnOffsetCommit of a group nobody
    joined (``validateTransactionalOffsetCommit``): OffsetDelete finds it while the offsets are
    still pending, and the deleted offsets do not come back when the transaction commits."""
    kafka = broker_cluster.start(**GROUP_ENV, KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS="200")
    topic, group = _name("t"), _name("g")
    create_topics(kafka.bootstrap, [topic], 2)
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    try:
        with open_transaction(kafka.bootstrap, group, topic, 1, {0: 3, 1: 6}) as txn:
            assert admin.delete_group_offsets(group, [p0]) == {p0: NoError}
            txn.commit_transaction(30)
        seen = committed_once(admin, group, [p0, p1], p1, 6)
    finally:
        admin.close()
    assert seen == {p0: -1, p1: 6}


# --- the Java AdminClient -----------------------------------------------------------------------


def test_the_java_admin_client_deletes_consumer_group_offsets(kafka: BrokerProcess) -> None:
    """``Admin.deleteConsumerGroupOffsets``: what kafka-consumer-groups.sh --delete-offsets runs."""
    consumed_topic, other_topic, group = _name("a"), _name("b"), _name("g")
    create_topics(kafka.bootstrap, [consumed_topic, other_topic], 2)
    produce(kafka.bootstrap, other_topic, 2, 2)
    produce(kafka.bootstrap, consumed_topic, 2, 2)
    earlier = consumer(kafka.bootstrap, group, other_topic)
    consume(earlier, 4)
    earlier.commit()
    earlier.close()
    assert java_lines("delete", kafka.bootstrap, group, other_topic, "0", "1") == [
        ["ok", other_topic, "0"],
        ["ok", other_topic, "1"],
    ]
    assert java_lines("delete", kafka.bootstrap, _name("nobody"), other_topic, "0") == [
        ["error", "GroupIdNotFoundException"]
    ]
    member = consumer(kafka.bootstrap, group, consumed_topic)
    try:
        consume(member, 4)
        member.commit()
        assert java_lines("delete", kafka.bootstrap, group, consumed_topic, "0") == [
            ["error", consumed_topic, "0", "GroupSubscribedToTopicException"]
        ]
    finally:
        member.close()


# --- authorization --------------------------------------------------------------------------------


@pytest.fixture
def secured(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[BrokerCluster]:
    with authorizing_cluster(
        etcd_server.client_url, s3_server, tmp_path, "odacl", extra_env=GROUP_ENV
    ) as cluster:
        yield cluster


def grant(cluster: BrokerCluster, resource: list[str], operation: str) -> None:
    kafscale_cli(
        cluster.etcd_url,
        cluster.cluster,
        "acls",
        "add",
        *resource,
        "--principal",
        "User:ANONYMOUS",
        "--operation",
        operation,
    )


def offset_delete(bootstrap: str, group: str, topic: str) -> Any:
    with KafkaWire(bootstrap) as wire:
        body = {
            "group_id": group,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0}]}],
        }
        return wire.request(OFFSET_DELETE, 0, body)


def wait_for(answer: Any, expected: Any) -> None:
    """ACLs reach the broker through its etcd watch: ask until the answer is ``expected``."""
    deadline = time.monotonic() + DEADLINE_S
    while (got := answer()) != expected:
        assert time.monotonic() < deadline, f"still {got}, expected {expected}"
        time.sleep(0.05)


def commit_code(bootstrap: str, group: str, topic: str) -> int:
    with KafkaWire(bootstrap) as wire:
        response = wire.request(OFFSET_COMMIT, 8, simple_commit(group, topic))
    return int(response.topics[0].partitions[0].error_code)


def simple_commit(group: str, topic: str) -> dict[str, Any]:
    """An OffsetCommit of offset 0 on partition 0 outside group membership (generation -1)."""
    return {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0}]}],
    }


def test_the_authorizer_asks_delete_on_the_group_and_read_on_each_topic(
    secured: BrokerCluster,
) -> None:
    """As Kafka's KafkaApis: DELETE on the group first (the whole answer), then READ per topic;
    a topic filtered out is TOPIC_AUTHORIZATION_FAILED in an answer that is otherwise fine."""
    kafka = secured.brokers[0]
    topic, committed_topic, group = _name("t"), _name("c"), _name("g")
    make_topics(secured.etcd_url, secured.cluster, 1, topic, committed_topic)
    denied = offset_delete(kafka.bootstrap, group, topic)
    assert (int(denied.error_code), denied.topics) == (30, ())  # GROUP_AUTHORIZATION_FAILED
    grant(secured, ["--group", group], "READ")
    grant(secured, ["--group", group], "DELETE")
    grant(secured, ["--topic", committed_topic], "READ")
    wait_for(lambda: commit_code(kafka.bootstrap, group, committed_topic), 0)  # the group exists

    def codes() -> tuple[int, int]:
        response = offset_delete(kafka.bootstrap, group, topic)
        return int(response.error_code), int(response.topics[0].partitions[0].error_code)

    assert codes() == (0, 29)  # TOPIC_AUTHORIZATION_FAILED
    grant(secured, ["--topic", topic], "READ")
    wait_for(codes, (0, 0))
