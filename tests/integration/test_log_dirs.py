"""DescribeLogDirs (API 35) and AlterReplicaLogDirs (API 34) end to end: broker processes on
etcd and S3 (or a directory), the admin clients of kafka-python and Java, one broker, two
brokers splitting the partitions, and the proxy in front of them.

Each broker reports one log dir named after its store, holding the partitions it owns, each
with the bytes of its committed segment objects: exactly what the bucket holds for it. Moving
a replica it hosts to that dir is a no-op that succeeds; any other dir is not found.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.kafka_wire import KafkaWire
from harness.offsets_admin import java_lines
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.secured import authorizing_cluster, grant_cluster
from harness.topics import create_topics
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import (
    LogDirNotFoundError,
    NoError,
    ReplicaNotAvailableError,
    UnknownTopicOrPartitionError,
)
from kafka.structs import TopicPartitionReplica

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

DESCRIBE_LOG_DIRS = 35
ALTER_REPLICA_LOG_DIRS = 34
DEADLINE_S = 30.0
TopicPartition = tuple[str, int]


def _name(what: str) -> str:
    return f"ld-{what}-{uuid.uuid4().hex[:6]}"


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, b"value-%d" % i, partition=p)
        producer.flush(30)
    finally:
        producer.close(10)


def describe(bootstrap: str) -> list[dict[str, Any]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_log_dirs()  # type: ignore[no-any-return]
    finally:
        admin.close()


def sizes_by_broker(answer: list[dict[str, Any]], topic: str) -> dict[int, dict[int, int]]:
    """Per broker, ``topic``'s partitions and their sizes, from every log dir it reports."""
    found: dict[int, dict[int, int]] = {}
    for broker in answer:
        mine = found.setdefault(broker["broker"], {})
        for log_dir in broker["log_dirs"]:
            assert log_dir["error_code"] == 0
            for t in log_dir["topics"]:
                if t["name"] == topic:
                    for p in t["partitions"]:
                        assert (p["offset_lag"], p["is_future_key"]) == (0, False)
                        mine[p["partition_index"]] = p["partition_size"]
    return found


def stored_sizes(cluster: BrokerCluster, topic: str) -> dict[int, int]:
    """The bytes of ``topic``'s segment objects in the bucket, per partition."""
    listed = cluster.s3.client().list_objects_v2(
        Bucket=cluster.bucket, Prefix=f"{cluster.cluster}/topics/{topic}/"
    )
    sizes: dict[int, int] = {}
    for entry in listed.get("Contents", []):
        key: str = entry["Key"]
        if key.endswith(".kfs"):
            partition = int(key.split("/")[-2])
            sizes[partition] = sizes.get(partition, 0) + int(entry["Size"])
    return sizes


def eventually(check: Callable[[], Any], what: str) -> Any:
    """Ownership follows the assignment within a watch round trip: poll, never sleep blind."""
    deadline = time.monotonic() + DEADLINE_S
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


@pytest.fixture(scope="module")
def kafka_one(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerCluster, BrokerProcess]]:
    """One broker on S3, started once for the tests that each use a topic of their own and
    only add to it."""
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("logdirs-one"), "ld1"
    )
    try:
        yield cluster, cluster.start()
    finally:
        cluster.stop_all()


def test_one_broker_reports_its_store_and_the_sizes_grow_with_produced_data(
    kafka_one: tuple[BrokerCluster, BrokerProcess],
) -> None:
    broker_cluster, kafka = kafka_one
    topic = _name("t")
    create_topics(kafka.bootstrap, [topic], 3)
    # Partitions are taken one by one: wait for all three (a first answer may list two).
    empty = eventually(
        lambda: [
            s for s in sizes_by_broker(describe(kafka.bootstrap), topic).values() if len(s) == 3
        ],
        "the broker to own all of the new topic's partitions",
    )
    assert empty == [{0: 0, 1: 0, 2: 0}]
    node_id = describe(kafka.bootstrap)[0]["broker"]
    answer = describe(kafka.bootstrap)
    assert [d["log_dir"] for d in answer[0]["log_dirs"]] == [f"s3://{broker_cluster.bucket}"]
    assert (answer[0]["log_dirs"][0]["total_bytes"], answer[0]["log_dirs"][0]["usable_bytes"]) == (
        -1,
        -1,
    )
    produce(kafka.bootstrap, topic, 3, 20)
    grown = sizes_by_broker(describe(kafka.bootstrap), topic)[node_id]
    assert all(size > 0 for size in grown.values()), grown
    assert grown == stored_sizes(broker_cluster, topic)  # acked means committed: exact
    produce(kafka.bootstrap, topic, 1, 20)  # partition 0 only
    again = sizes_by_broker(describe(kafka.bootstrap), topic)[node_id]
    assert again[0] > grown[0] and (again[1], again[2]) == (grown[1], grown[2])
    assert again == stored_sizes(broker_cluster, topic)


def test_a_request_naming_partitions_gets_only_those_it_owns(kafka_two: Any) -> None:
    cluster, topic = kafka_two
    owners = eventually(lambda: owners_if_split(cluster, topic), "both brokers to own some")
    broker, partitions = next(iter(owners.items()))
    chosen = sorted(partitions)[:1]
    body = {"topics": [{"topic": topic, "partitions": [*chosen, 99]}, {"topic": "nope"}]}
    with KafkaWire(bootstrap_of(cluster, broker)) as wire:
        response = wire.request(DESCRIBE_LOG_DIRS, 4, body)
    assert int(response.error_code) == 0
    (result,) = response.results
    assert [(t.name, [int(p.partition_index) for p in t.partitions]) for t in result.topics] == [
        (topic, chosen)
    ]


PARTITIONS = 6


@pytest.fixture(scope="module")
def kafka_two(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BrokerCluster, str]]:
    """Two brokers sharing one bucket, a topic of six partitions with data in each: started
    once for the module (two broker starts, not two per test), as its tests only read the
    topic or move replicas to where they already are."""
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("logdirs-two"), "ld2"
    )
    try:
        cluster.start()
        cluster.start()
        topic = _name("t")
        create_topics(cluster.bootstrap, [topic], PARTITIONS)
        produce(cluster.bootstrap, topic, PARTITIONS, 10)
        yield cluster, topic
    finally:
        cluster.stop_all()


@pytest.fixture(scope="module")
def proxy_two(kafka_two: tuple[BrokerCluster, str]) -> BrokerProcess:
    """A proxy in front of ``kafka_two``, started once its partitions are split."""
    cluster, topic = kafka_two
    eventually(lambda: owners_if_split(cluster, topic), "the partitions to split between both")
    return start_proxy(cluster)


def bootstrap_of(cluster: BrokerCluster, node_id: int) -> str:
    """The address of broker ``node_id``, as the cluster's metadata gives it."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(",")[0])
    try:
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    (broker,) = [b for b in brokers if b["broker_id"] == node_id]
    return f"{broker['host']}:{broker['port']}"


def owners_if_split(cluster: BrokerCluster, topic: str) -> dict[int, set[int]] | None:
    """Per broker, the partitions it reports, once they split the topic between both brokers
    (every partition once) and agree with Metadata's leaders; None until then."""
    reported = sizes_by_broker(describe(cluster.bootstrap.split(",")[0]), topic)
    owners = {broker: set(sizes) for broker, sizes in reported.items()}
    every = [p for partitions in owners.values() for p in partitions]
    if len(owners) != 2 or sorted(every) != list(range(PARTITIONS)) or not all(owners.values()):
        return None
    if leaders(cluster.bootstrap.split(",")[0], topic) != owners:
        return None
    return owners


def leaders(bootstrap: str, topic: str) -> dict[int, set[int]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        (described,) = admin.describe_topics([topic])
    finally:
        admin.close()
    found: dict[int, set[int]] = {}
    for p in described["partitions"]:
        found.setdefault(p["leader_id"], set()).add(p["partition_index"])
    return found


def test_two_brokers_each_report_only_the_partitions_they_own(
    kafka_two: tuple[BrokerCluster, str],
) -> None:
    cluster, topic = kafka_two
    eventually(lambda: owners_if_split(cluster, topic), "the partitions to split between both")
    answer = describe(cluster.bootstrap.split(",")[0])
    sizes = sizes_by_broker(answer, topic)
    merged = {p: size for per_broker in sizes.values() for p, size in per_broker.items()}
    assert merged == stored_sizes(cluster, topic)
    assert {d["log_dir"] for b in answer for d in b["log_dirs"]} == {f"s3://{cluster.bucket}"}


def test_through_the_proxy_one_broker_holds_every_partition(
    kafka_two: tuple[BrokerCluster, str], proxy_two: BrokerProcess
) -> None:
    """The proxy is the one broker its clients see: it reports the brokers' dirs joined."""
    cluster, topic = kafka_two
    eventually(lambda: owners_if_split(cluster, topic), "the partitions to split between both")
    proxy = proxy_two
    answer = describe(proxy.bootstrap)
    assert len(answer) == 1 and len(answer[0]["log_dirs"]) == 1
    assert answer[0]["log_dirs"][0]["log_dir"] == f"s3://{cluster.bucket}"
    (through_proxy,) = sizes_by_broker(answer, topic).values()
    assert through_proxy == stored_sizes(cluster, topic)
    lines = java_lines("logdirs", proxy.bootstrap)
    assert lines[0][:4] == ["dir", str(answer[0]["broker"]), f"s3://{cluster.bucket}", "none"]
    replicas = {int(line[3]): int(line[4]) for line in lines[1:] if line[2] == topic}
    assert replicas == through_proxy


def test_the_java_admin_client_describes_every_brokers_log_dirs(
    kafka_two: tuple[BrokerCluster, str],
) -> None:
    """``Admin.describeLogDirs``: what kafka-log-dirs.sh --describe runs."""
    cluster, topic = kafka_two
    owners = eventually(lambda: owners_if_split(cluster, topic), "both brokers to own some")
    lines = java_lines("logdirs", cluster.bootstrap.split(",")[0])
    dirs = [line for line in lines if line[0] == "dir"]
    assert dirs == [
        ["dir", str(b), f"s3://{cluster.bucket}", "none", "-1", "-1"] for b in sorted(owners)
    ]
    replicas = [line for line in lines if line[0] == "replica" and line[2] == topic]
    assert {(int(r[1]), int(r[3])) for r in replicas} == {
        (b, p) for b, ps in owners.items() for p in ps
    }
    assert {int(r[3]): int(r[4]) for r in replicas} == stored_sizes(cluster, topic)
    assert {(r[5], r[6]) for r in replicas} == {("0", "false")}


def test_a_local_directory_is_reported_with_its_volume(broker_cluster: BrokerCluster) -> None:
    data = broker_cluster.workdir / "objects"
    kafka = broker_cluster.start(
        KAFSCALE_STORAGE__KIND="local", KAFSCALE_STORAGE__LOCAL_DIR=str(data)
    )
    (broker,) = describe(kafka.bootstrap)
    (log_dir,) = broker["log_dirs"]
    assert log_dir["log_dir"] == str(data.resolve())
    assert log_dir["total_bytes"] >= log_dir["usable_bytes"] > 0


# --- authorization --------------------------------------------------------------------------------


@pytest.fixture
def secured(etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path) -> Iterator[Any]:
    with authorizing_cluster(etcd_server.client_url, s3_server, tmp_path, "ldacl") as cluster:
        yield cluster, cluster.brokers[0]


def test_describe_on_the_cluster_is_required(secured: tuple[BrokerCluster, BrokerProcess]) -> None:
    cluster, kafka = secured
    with KafkaWire(kafka.bootstrap) as wire:
        denied = wire.request(DESCRIBE_LOG_DIRS, 4, {"topics": None})
        old = wire.request(DESCRIBE_LOG_DIRS, 1, {"topics": None})  # no error field before v3
    assert (int(denied.error_code), denied.results) == (31, ())  # CLUSTER_AUTHORIZATION_FAILED
    assert old.results == ()
    grant_cluster(cluster, "DESCRIBE")

    def allowed() -> bool:
        with KafkaWire(kafka.bootstrap) as wire:
            response = wire.request(DESCRIBE_LOG_DIRS, 4, {"topics": None})
        return int(response.error_code) == 0 and len(response.results) == 1

    eventually(allowed, "the grant to reach the broker")


# --- AlterReplicaLogDirs ------------------------------------------------------------------------


def alter(bootstrap: str, moves: dict[TopicPartitionReplica, str]) -> dict[Any, Any]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.alter_replica_log_dirs(moves)  # type: ignore[no-any-return]
    finally:
        admin.close()


def test_moving_a_replica_to_its_own_dir_succeeds_and_changes_nothing(
    kafka_one: tuple[BrokerCluster, BrokerProcess],
) -> None:
    """What kafka-python's own suite asks of a broker: the dir DescribeLogDirs names is where
    the replica is, so the move is a no-op with NoError; the data stays where and what it was."""
    broker_cluster, kafka = kafka_one
    topic = _name("mv")
    create_topics(kafka.bootstrap, [topic], 2)
    produce(kafka.bootstrap, topic, 2, 10)
    (broker,) = describe(kafka.bootstrap)
    node_id, log_dir = broker["broker"], broker["log_dirs"][0]["log_dir"]
    before = stored_sizes(broker_cluster, topic)
    moves = {TopicPartitionReplica(topic, p, node_id): log_dir for p in (0, 1)}
    assert alter(kafka.bootstrap, moves) == dict.fromkeys(moves, NoError)
    assert stored_sizes(broker_cluster, topic) == before
    assert sizes_by_broker(describe(kafka.bootstrap), topic)[node_id] == before
    with KafkaWire(kafka.bootstrap) as wire:  # v1, the non-flexible version, too
        body = {"dirs": [{"path": log_dir, "topics": [{"name": topic, "partitions": [0]}]}]}
        (result,) = wire.request(ALTER_REPLICA_LOG_DIRS, 1, body).results
    assert [(int(p.partition_index), int(p.error_code)) for p in result.partitions] == [(0, 0)]


def test_another_dir_is_not_found_and_an_unknown_partition_is_unknown(
    kafka_one: tuple[BrokerCluster, BrokerProcess],
) -> None:
    _, kafka = kafka_one
    topic = _name("mv")
    create_topics(kafka.bootstrap, [topic], 1)
    (broker,) = describe(kafka.bootstrap)
    node_id, log_dir = broker["broker"], broker["log_dirs"][0]["log_dir"]
    elsewhere = TopicPartitionReplica(topic, 0, node_id)
    assert alter(kafka.bootstrap, {elsewhere: "/var/lib/kafka/data"}) == {
        elsewhere: LogDirNotFoundError
    }
    missing = [TopicPartitionReplica(topic, 5, node_id), TopicPartitionReplica("nope", 0, node_id)]
    assert alter(kafka.bootstrap, dict.fromkeys(missing, log_dir)) == dict.fromkeys(
        missing, UnknownTopicOrPartitionError
    )


def test_a_broker_refuses_a_replica_another_broker_hosts(
    kafka_two: tuple[BrokerCluster, str],
) -> None:
    """The Java AdminClient's ``alterReplicaLogDirs`` (what kafka-reassign-partitions.sh sends
    for log dirs): each broker moves only what it hosts, REPLICA_NOT_AVAILABLE otherwise."""
    cluster, topic = kafka_two
    owners = eventually(lambda: owners_if_split(cluster, topic), "both brokers to own some")
    log_dir = f"s3://{cluster.bucket}"
    bootstrap = cluster.bootstrap.split(",")[0]
    (mine, theirs), (partitions, others) = (
        sorted(owners),
        (owners[min(owners)], owners[max(owners)]),
    )
    assert mine != theirs
    asked = [str(p) for p in sorted(partitions)]
    lines = java_lines("alterdir", bootstrap, str(mine), log_dir, topic, *asked)
    assert lines == [["ok", topic, p] for p in asked]
    wrong = str(min(others))
    assert java_lines("alterdir", bootstrap, str(mine), log_dir, topic, wrong) == [
        ["error", topic, wrong, "ReplicaNotAvailableException"]
    ]
    replica = TopicPartitionReplica(topic, int(wrong), mine)  # kafka-python sends it to ``mine``
    assert alter(bootstrap, {replica: log_dir}) == {replica: ReplicaNotAvailableError}
    assert java_lines("alterdir", bootstrap, str(mine), "/data", topic, asked[0]) == [
        ["error", topic, asked[0], "LogDirNotFoundException"]
    ]


def test_through_the_proxy_every_replica_is_in_the_one_dir(
    kafka_two: tuple[BrokerCluster, str], proxy_two: BrokerProcess
) -> None:
    """The proxy is one broker holding every partition in one dir: each partition goes to its
    owner, and the answers come back as the proxy's."""
    cluster, topic = kafka_two
    eventually(lambda: owners_if_split(cluster, topic), "the partitions to split between both")
    proxy = proxy_two
    (broker,) = describe(proxy.bootstrap)
    node_id, log_dir = broker["broker"], broker["log_dirs"][0]["log_dir"]
    every = {TopicPartitionReplica(topic, p, node_id): log_dir for p in range(PARTITIONS)}
    assert alter(proxy.bootstrap, every) == dict.fromkeys(every, NoError)
    moves = {
        TopicPartitionReplica(topic, 0, node_id): "/elsewhere",
        TopicPartitionReplica("nope", 0, node_id): log_dir,
    }
    assert alter(proxy.bootstrap, moves) == {
        TopicPartitionReplica(topic, 0, node_id): LogDirNotFoundError,
        TopicPartitionReplica("nope", 0, node_id): UnknownTopicOrPartitionError,
    }
    lines = java_lines("alterdir", proxy.bootstrap, str(node_id), log_dir, topic, "1", "4")
    assert lines == [["ok", topic, "1"], ["ok", topic, "4"]]


def test_through_the_proxy_with_no_broker_alive_the_answers_are_a_brokers(
    broker_cluster: BrokerCluster,
) -> None:
    """No broker is alive, so no partition has an owner to ask: the proxy answers as a broker
    that does not host the partition would, in Kafka's order (the dir it registered with, then
    the topic), not REPLICA_NOT_AVAILABLE for everything."""
    kafka = broker_cluster.start()
    topic = _name("orphan")
    create_topics(kafka.bootstrap, [topic], 2)
    proxy = start_proxy(broker_cluster)
    (broker,) = describe(proxy.bootstrap)
    log_dir = broker["log_dirs"][0]["log_dir"]
    assert kafka.stop() == 0  # deregisters: the proxy routes to nobody now
    eventually(lambda: not proxy.status()["brokers"], "the proxy to see no broker")
    body = {
        "dirs": [
            {"path": log_dir, "topics": [{"name": topic, "partitions": [0, 7]}]},
            {"path": "/var/lib/kafka/data", "topics": [{"name": topic, "partitions": [1]}]},
            {"path": log_dir, "topics": [{"name": "nope", "partitions": [0]}]},
        ]
    }
    with KafkaWire(proxy.bootstrap) as wire:
        results = wire.request(ALTER_REPLICA_LOG_DIRS, 2, body).results
    codes = {
        (str(t.topic_name), int(p.partition_index)): int(p.error_code)
        for t in results
        for p in t.partitions
    }
    assert codes == {
        (topic, 0): ReplicaNotAvailableError.errno,
        (topic, 7): UnknownTopicOrPartitionError.errno,
        (topic, 1): LogDirNotFoundError.errno,
        ("nope", 0): UnknownTopicOrPartitionError.errno,
    }


def test_alter_on_the_cluster_is_required(secured: tuple[BrokerCluster, BrokerProcess]) -> None:
    cluster, kafka = secured
    log_dir = f"s3://{cluster.bucket}"
    body = {"dirs": [{"path": log_dir, "topics": [{"name": "t", "partitions": [0, 1]}]}]}
    with KafkaWire(kafka.bootstrap) as wire:
        (denied,) = wire.request(ALTER_REPLICA_LOG_DIRS, 2, body).results
    assert [(int(p.partition_index), int(p.error_code)) for p in denied.partitions] == [
        (0, 31),  # CLUSTER_AUTHORIZATION_FAILED
        (1, 31),
    ]
    grant_cluster(cluster, "ALTER")

    def allowed() -> bool:
        with KafkaWire(kafka.bootstrap) as wire:
            (result,) = wire.request(ALTER_REPLICA_LOG_DIRS, 2, body).results
        # the grant reached the broker: "t" does not exist, so it is unknown, not refused
        return {int(p.error_code) for p in result.partitions} == {3}

    eventually(allowed, "the grant to reach the broker")
