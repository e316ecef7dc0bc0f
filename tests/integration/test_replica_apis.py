"""ElectLeaders, Alter/ListPartitionReassignments, DescribeTopicPartitions and
ListConfigResources with real clients against two brokers and a proxy in front of them.

A partition's one replica is its lease owner: elections are never needed while a broker can
lead (ELECTION_NOT_NEEDED), reassignments are checked as Kafka checks them and complete when
accepted (nothing is ever in progress), DescribeTopicPartitions reports what Metadata reports,
paged as KIP-966 pages it. Through the proxy, every broker id is the proxy's own, as in its
Metadata. Clients: kafka-python's KafkaAdminClient, confluent-kafka's AdminClient, the Java
AdminClient (``java/ReplicaAdmin.java``; its describeTopics uses DescribeTopicPartitions).
"""

from __future__ import annotations

import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType as CkElectionType
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient as CkAdminClient
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess
from harness.java_client import java_program
from harness.kafka_wire import KafkaWire
from harness.proxy import brokers_behind_a_proxy
from harness.s3 import S3Endpoint
from harness.secured import authorizing_cluster, grant_cluster
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import (
    ClusterAuthorizationFailedError,
    InvalidReplicationAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

NONE, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED = 0, 3, 29
CLUSTER_AUTHORIZATION_FAILED, ELECTION_NOT_NEEDED = 31, 84
ELECT_LEADERS = 43
PROXY_ID = 1000  # the proxy's default node id
PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("replicas")
    with brokers_behind_a_proxy(
        etcd_server.client_url, s3_server, workdir, "replicas", brokers=2
    ) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def brokers(cluster: BrokerCluster) -> list[BrokerProcess]:
    return cluster.brokers[:2]


@pytest.fixture(scope="module")
def proxy(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.brokers[2]


@pytest.fixture
def admin(brokers: list[BrokerProcess]) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=brokers[0].bootstrap, request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def proxy_admin(proxy: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=proxy.bootstrap, request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


def new_topic(admin: KafkaAdminClient, partitions: int = PARTITIONS, prefix: str = "rep") -> str:
    """A new topic whose ownership has settled: the brokers assign a new topic's partitions
    right after it is created, and a leader may move once meanwhile."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, partitions, 1)])
    deadline = time.monotonic() + 15
    seen = [metadata_partitions(admin, name)]
    while len(seen) < 3 or any(s != seen[-1] for s in seen[-3:]):
        assert time.monotonic() < deadline, f"the leaders of {name} never settled: {seen[-3:]}"
        time.sleep(0.2)
        seen.append(metadata_partitions(admin, name))
    return name


def metadata_partitions(
    admin: KafkaAdminClient, topic: str
) -> dict[int, tuple[int, int, list[int]]]:
    """partition -> (leader, leader epoch, replicas) as Metadata reports them."""
    described = admin.describe_topics([topic])[0]
    return {
        p["partition_index"]: (p["leader_id"], p["leader_epoch"], list(p["replica_nodes"]))
        for p in described["partitions"]
    }


# --- ElectLeaders ------------------------------------------------------------------------------


def test_a_led_partition_needs_no_election(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin)
    for election_type in (0, 1):  # preferred, unclean
        response = admin.elect_leaders(election_type, {topic: list(range(PARTITIONS))})
        (result,) = response.replica_election_results
        assert result.topic == topic
        assert sorted((p.partition_id, p.error_code) for p in result.partition_result) == [
            (p, ELECTION_NOT_NEEDED) for p in range(PARTITIONS)
        ]


def test_an_unknown_partition_is_unknown_topic_or_partition(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin, 1)
    response = admin.elect_leaders(0, {topic: [0, 7], "no-such-topic": [0]}, raise_errors=False)
    codes = {
        (r.topic, p.partition_id): p.error_code
        for r in response.replica_election_results
        for p in r.partition_result
    }
    assert codes == {
        (topic, 0): ELECTION_NOT_NEEDED,
        (topic, 7): UNKNOWN_TOPIC_OR_PARTITION,
        ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION,
    }


def test_electing_every_partition_leaves_out_those_that_needed_none(
    admin: KafkaAdminClient, brokers: list[BrokerProcess]
) -> None:
    """topic_partitions null (what kafka-leader-election.sh --all-topic-partitions sends; the
    Python clients expand it themselves): every topic, no partition that needed no election."""
    topic = new_topic(admin)
    for version in (0, 2):
        with KafkaWire(brokers[1].bootstrap) as wire:
            body = {"election_type": 1, "topic_partitions": None, "timeout": 30_000}
            response = wire.request(ELECT_LEADERS, version, body)
        if version > 0:
            assert int(response.error_code) == NONE
        results = {str(r.topic): r.partition_result for r in response.replica_election_results}
        assert results[topic] == ()


def test_confluent_kafka_elects_leaders(
    brokers: list[BrokerProcess], admin: KafkaAdminClient
) -> None:
    topic = new_topic(admin, 2)
    client = CkAdminClient({"bootstrap.servers": brokers[1].bootstrap})
    partitions = [CkTopicPartition(topic, 0), CkTopicPartition(topic, 1)]
    results = client.elect_leaders(CkElectionType.PREFERRED, partitions).result(timeout=30)
    assert {tp.partition: error.code() for tp, error in results.items()} == {
        0: ELECTION_NOT_NEEDED,
        1: ELECTION_NOT_NEEDED,
    }


# --- reassignments -----------------------------------------------------------------------------


def test_a_valid_reassignment_completes_at_once(
    admin: KafkaAdminClient, brokers: list[BrokerProcess]
) -> None:
    topic = new_topic(admin)
    before = metadata_partitions(admin, topic)
    ids = sorted(b.node_id for b in admin._manager.cluster.brokers())
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    result = admin.alter_partition_reassignments({tp0: [before[0][0]], tp1: list(reversed(ids))})
    assert result == {tp0: None, tp1: None}
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments([tp0, tp1]) == {}
    # collapsed to the lease owner: Metadata never shows the requested lists (the brokers go
    # on balancing ownership, so the leader itself may move meanwhile, as it may anyway)
    after = metadata_partitions(admin, topic)
    assert sorted(after) == sorted(before)
    assert all(replicas == [leader] for leader, _epoch, replicas in after.values())


def test_invalid_reassignments_get_kafkas_errors(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin, 1)
    ids = [b.node_id for b in admin._manager.cluster.brokers()]
    tp = TopicPartition(topic, 0)
    unknown = TopicPartition(topic, 5)
    missing = TopicPartition("no-such-topic", 0)
    result = admin.alter_partition_reassignments(
        {tp: [ids[0], ids[0]], unknown: [ids[0]], missing: [ids[0]]}
    )
    assert result == {
        tp: InvalidReplicationAssignmentError,
        unknown: UnknownTopicOrPartitionError,
        missing: UnknownTopicOrPartitionError,
    }
    assert admin.alter_partition_reassignments({tp: [max(ids) + 100]}) == {
        tp: InvalidReplicationAssignmentError
    }
    assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
    assert admin.list_partition_reassignments({topic: [0, 9], "no-such-topic": [0]}) == {}


# --- DescribeTopicPartitions -------------------------------------------------------------------


def test_describe_topic_partitions_reports_what_metadata_reports(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin)
    described = admin.describe_topic_partitions([topic, "no-such-topic"])
    assert described["next_cursor"] is None
    unknown, mine = described["topics"]  # sorted by name
    assert (unknown["name"], unknown["error_code"]) == ("no-such-topic", UNKNOWN_TOPIC_OR_PARTITION)
    assert (mine["name"], mine["error_code"], mine["is_internal"]) == (topic, NONE, False)
    assert mine["topic_authorized_operations"] > 0
    metadata = metadata_partitions(admin, topic)
    assert {
        p["partition_index"]: (p["leader_id"], p["leader_epoch"], p["replica_nodes"])
        for p in mine["partitions"]
    } == metadata
    for p in mine["partitions"]:
        assert p["isr_nodes"] == [p["leader_id"]] and p["offline_replicas"] == []
        assert p["leader_id"] in {b.node_id for b in admin._manager.cluster.brokers()}


def test_describe_topic_partitions_pages_with_a_cursor(admin: KafkaAdminClient) -> None:
    first = new_topic(admin, 3, prefix="page-a")
    second = new_topic(admin, 2, prefix="page-b")
    seen: list[tuple[str, int]] = []
    cursor = None
    pages = 0
    while True:
        page = admin.describe_topic_partitions(
            [second, first], response_partition_limit=2, cursor=cursor
        )
        pages += 1
        seen += [(t["name"], p["partition_index"]) for t in page["topics"] for p in t["partitions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10
    assert pages == 3
    assert seen == [(first, 0), (first, 1), (first, 2), (second, 0), (second, 1)]


def test_describe_all_topics_lists_every_topic(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin, 1)
    names = [t["name"] for t in admin.describe_topic_partitions([])["topics"]]
    assert topic in names and names == sorted(names)


# --- ListConfigResources -----------------------------------------------------------------------


def test_list_config_resources_names_topics_and_brokers(admin: KafkaAdminClient) -> None:
    topic = new_topic(admin, 1)
    ids = sorted(str(b.node_id) for b in admin._manager.cluster.brokers())
    every = admin.list_config_resources()
    assert topic in every["topic"] and sorted(every["broker"]) == ids
    assert admin.list_config_resources(["BROKER"]) == {"broker": ids}


# --- through the proxy -------------------------------------------------------------------------


def test_through_the_proxy_every_broker_id_is_the_proxys(
    admin: KafkaAdminClient, proxy_admin: KafkaAdminClient
) -> None:
    topic = new_topic(admin, 2)
    (mine,) = proxy_admin.describe_topic_partitions([topic])["topics"]
    assert {
        p["partition_index"]: (p["leader_id"], p["replica_nodes"]) for p in mine["partitions"]
    } == {
        0: (PROXY_ID, [PROXY_ID]),
        1: (PROXY_ID, [PROXY_ID]),
    }
    assert {
        p: (leader, replicas)
        for p, (leader, _e, replicas) in metadata_partitions(proxy_admin, topic).items()
    } == {
        0: (PROXY_ID, [PROXY_ID]),
        1: (PROXY_ID, [PROXY_ID]),
    }
    tp = TopicPartition(topic, 0)
    real_id = admin._manager.cluster.brokers().pop().node_id
    assert proxy_admin.alter_partition_reassignments({tp: [PROXY_ID]}) == {tp: None}
    assert proxy_admin.alter_partition_reassignments({tp: [real_id]}) == {
        tp: InvalidReplicationAssignmentError
    }
    assert proxy_admin.list_partition_reassignments() == {}
    response = proxy_admin.elect_leaders(0, {topic: [0, 1]})
    assert [
        p.error_code for r in response.replica_election_results for p in r.partition_result
    ] == [
        ELECTION_NOT_NEEDED,
        ELECTION_NOT_NEEDED,
    ]
    assert proxy_admin.list_config_resources(["BROKER"]) == {"broker": [str(PROXY_ID)]}


# --- the Java AdminClient ----------------------------------------------------------------------

JAVA_SOURCE = Path(__file__).with_name("java") / "ReplicaAdmin.java"


def java_replica_admin() -> list[str]:
    """The command running ``java/ReplicaAdmin.java`` (compiled once per source version)."""
    return java_program(JAVA_SOURCE, "ReplicaAdmin")


def served(process: BrokerProcess, api: str) -> float:
    """How many requests of ``api`` the process has answered (its /metrics)."""
    with urllib.request.urlopen(f"{process.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf'kafscale_request_duration_seconds_count\{{api="{api}"\}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def run_java(bootstrap: str, topic: str) -> list[list[str]]:
    done = children.run(
        [*java_replica_admin(), bootstrap, topic], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return [line.split() for line in done.stdout.splitlines()]


def test_the_java_admin_client(admin: KafkaAdminClient, brokers: list[BrokerProcess]) -> None:
    """kafka-topics.sh --describe, kafka-leader-election.sh and kafka-reassign-partitions.sh
    run these calls; describeTopics goes through DescribeTopicPartitions when offered."""
    topic = new_topic(admin, 2)
    before = sum(served(b, "DescribeTopicPartitions") for b in brokers)
    lines = run_java(brokers[0].bootstrap, topic)
    assert sum(served(b, "DescribeTopicPartitions") for b in brokers) > before
    metadata = metadata_partitions(admin, topic)
    for p, (leader, _epoch, _replicas) in metadata.items():
        assert [
            "partition",
            str(p),
            "leader",
            str(leader),
            "replicas",
            str(leader),
            "isr",
            str(leader),
        ] in lines
    assert sorted(line for line in lines if line[0] == "elect") == [
        ["elect", "0", "ElectionNotNeededException"],
        ["elect", "1", "ElectionNotNeededException"],
    ]
    steps = {
        line[0]: line[1:] for line in lines if line[0] in ("reassign", "widen", "cancel", "ongoing")
    }
    assert steps == {
        "reassign": ["none"],
        "widen": ["InvalidReplicationFactorException"],
        "cancel": ["NoReassignmentInProgressException"],
        "ongoing": ["0"],
    }
    ids = sorted(str(b.node_id) for b in admin._manager.cluster.brokers())
    resources = [line[1:] for line in lines if line[0] == "resource"]
    assert ["TOPIC", topic] in resources
    assert sorted(name for kind, name in resources if kind == "BROKER") == ids


def test_the_java_admin_client_through_the_proxy(
    admin: KafkaAdminClient, proxy: BrokerProcess
) -> None:
    """The same calls through the proxy, in its broker ids (the proxy counts no requests per
    API: that its DescribeTopicPartitions answers in them is kafka-python's test above)."""
    topic = new_topic(admin, 2)
    lines = run_java(proxy.bootstrap, topic)
    me = str(PROXY_ID)
    for p in ("0", "1"):
        assert ["partition", p, "leader", me, "replicas", me, "isr", me] in lines
        assert ["elect", p, "ElectionNotNeededException"] in lines
    steps = {
        line[0]: line[1:] for line in lines if line[0] in ("reassign", "widen", "cancel", "ongoing")
    }
    # the proxy is its clients' only broker: [1000] is the whole cluster, no factor change
    assert steps == {
        "reassign": ["none"],
        "widen": ["none"],
        "cancel": ["NoReassignmentInProgressException"],
        "ongoing": ["0"],
    }
    assert ["BROKER", me] in [line[1:] for line in lines if line[0] == "resource"]


# --- authorization -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("replicas-acl")
    with authorizing_cluster(etcd_server.client_url, s3_server, workdir, "repacl") as cluster:
        yield cluster


def test_the_cluster_operations_kafka_asks_for(secured: BrokerCluster) -> None:
    """ListPartitionReassignments needs DESCRIBE on the cluster; AlterPartitionReassignments
    and ElectLeaders ALTER; ListConfigResources DESCRIBE_CONFIGS. A topic the client may not
    describe gets TOPIC_AUTHORIZATION_FAILED from DescribeTopicPartitions."""
    client = KafkaAdminClient(
        bootstrap_servers=secured.brokers[0].bootstrap, request_timeout_ms=30_000
    )
    try:
        with pytest.raises(ClusterAuthorizationFailedError):
            client.list_partition_reassignments()
        with pytest.raises(ClusterAuthorizationFailedError):
            client.alter_partition_reassignments({TopicPartition("t", 0): [1]})
        response = client.elect_leaders(0, {"t": [0]}, raise_errors=False)
        assert response.error_code == CLUSTER_AUTHORIZATION_FAILED
        assert [
            p.error_code for r in response.replica_election_results for p in r.partition_result
        ] == [CLUSTER_AUTHORIZATION_FAILED]
        with pytest.raises(ClusterAuthorizationFailedError):
            client.list_config_resources()
        (denied,) = client.describe_topic_partitions(["t"])["topics"]
        assert denied["error_code"] == TOPIC_AUTHORIZATION_FAILED
        grant_cluster(secured, "DESCRIBE")
        wait_until(lambda: _listed(client))
        with pytest.raises(ClusterAuthorizationFailedError):
            client.alter_partition_reassignments({TopicPartition("t", 0): [1]})
        grant_cluster(secured, "ALTER")
        wait_until(lambda: _elect_code(client) == UNKNOWN_TOPIC_OR_PARTITION)
    finally:
        client.close()


def _listed(client: KafkaAdminClient) -> bool:
    try:
        return client.list_partition_reassignments() == {}
    except ClusterAuthorizationFailedError:
        return False


def _elect_code(client: KafkaAdminClient) -> Any:
    response = client.elect_leaders(0, {"no-such-topic": [0]}, raise_errors=False)
    return next(p.error_code for r in response.replica_election_results for p in r.partition_result)


def wait_until(condition: Any, deadline_s: float = 15.0) -> None:
    """Poll until an ACL change has reached the broker through its watch."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "the ACL change never reached the broker"
        time.sleep(0.05)
