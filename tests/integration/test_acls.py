"""ACLs end to end, with stock clients against a broker process that has the authorizer on.

Without SASL every connection is ``User:ANONYMOUS``, so the ACLs here name that principal.
The first grants go through ``kafscale acls`` (etcd, the bootstrap path); after that
confluent-kafka's and kafka-python's admin clients create, describe and delete ACLs, and
producers, consumers and admin calls get Kafka's authorization errors where the ACLs say no.
A change applies to a connection that is already open, within a watch round trip.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess
from harness.etcd import harness_etcd
from harness.java_client import java_program
from harness.kafka_wire import (
    KafkaWire,
    fetch_body,
    fetch_partition,
    metadata_body,
    produce_body,
    produce_partition,
)
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.secured import (
    ANONYMOUS,
    authorizing_cluster,
    consume_error,
    grant_cluster,
    kafscale_cli,
    make_topics,
)
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType
from kafka.errors import ClusterAuthorizationFailedError, SecurityDisabledError

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd

pytestmark = pytest.mark.integration

WATCH_DEADLINE_S = 15.0  # generous: the machine is shared; the change normally lands in ms


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("acls")
    with authorizing_cluster(etcd_server.client_url, s3_server, workdir, "acls") as cluster:
        yield cluster


@pytest.fixture
def kafka(cluster: BrokerCluster) -> Iterator[BrokerProcess]:
    """The secured broker, with no ACL at all when the test starts and ends."""
    _etcd(cluster, lambda etcd: etcd.delete_prefix(keys.acls_prefix(cluster.cluster)))
    yield cluster.brokers[0]
    _etcd(cluster, lambda etcd: etcd.delete_prefix(keys.acls_prefix(cluster.cluster)))


@pytest.fixture
def prefix() -> str:
    return f"acl-{uuid.uuid4().hex[:8]}"


def _etcd(cluster: BrokerCluster, action: Any) -> Any:
    """Run ``action(etcd)`` against the cluster's etcd (test set-up, not the user's path)."""

    async def run() -> Any:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            return await action(etcd)
        finally:
            await etcd.close()

    return asyncio.run(run())


def _make_topic(cluster: BrokerCluster, name: str) -> None:
    make_topics(cluster.etcd_url, cluster.cluster, 1, name)


def acls_cli(cluster: BrokerCluster, *args: str) -> str:
    """``kafscale acls ...`` against the cluster's etcd, as an operator runs it."""
    return kafscale_cli(cluster.etcd_url, cluster.cluster, "acls", *args)


def wait_for(condition: Any, what: str, deadline_s: float = WATCH_DEADLINE_S) -> Any:
    """Poll ``condition`` until it returns something truthy (a watch round trip, not a sleep)."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def produce_one(producer: Producer, topic: str, value: bytes = b"v") -> KafkaError | None:
    """Produce one record and flush; the delivery error, or None if it was acked."""
    outcome: list[KafkaError | None] = []
    try:
        producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    except KafkaException as exc:  # librdkafka refuses at once while its metadata says so
        return exc.args[0]  # type: ignore[no-any-return]
    producer.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def kp_admin(kafka: BrokerProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=kafka.bootstrap, request_timeout_ms=10_000)


def ck_binding(
    resource: ResourceType,
    name: str,
    operation: AclOperation,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(resource, name, pattern, ANONYMOUS, "*", operation, permission)


# --- tests ------------------------------------------------------------------------------------


def test_acl_apis_answer_security_disabled_without_an_authorizer(broker: BrokerProcess) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    try:
        everything = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KpResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        with pytest.raises(SecurityDisabledError):
            admin.describe_acls(everything)
    finally:
        admin.close()


def test_without_acls_nothing_is_visible_and_everything_is_refused(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    topic = f"{prefix}-t"
    _make_topic(cluster, topic)
    admin = kp_admin(kafka)
    try:
        assert topic not in admin.list_topics()
        assert admin.list_topics() == []
        everything = ACLFilter(
            principal=None,
            host=None,
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(
                KpResourceType.ANY, None, ACLResourcePatternType.ANY
            ),
        )
        with pytest.raises(ClusterAuthorizationFailedError):
            admin.describe_acls(everything)
    finally:
        admin.close()
    ck_admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    created = ck_admin.create_topics([NewTopic(f"{prefix}-new", 1, 1)])[f"{prefix}-new"]
    with pytest.raises(Exception) as refused:
        created.result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 20_000})
    error = produce_one(producer, topic)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED = 29, 30, 31


def _wire_cases(topic: str) -> list[tuple[str, int, int, dict[str, Any], Any, int]]:
    """(name, api key, version, request body, where the code is, the code Kafka answers)."""
    partition = {"partition_index": 0}
    return [
        ("Produce", 0, 9, produce_body(topic, 0, b""), _produce_code, TOPIC_DENIED),
        ("Fetch", 1, 12, fetch_body(topic, 0, 0), lambda r: fetch_partition(r).error_code, 29),
        (
            "ListOffsets",
            2,
            7,
            {"topics": [{"name": topic, "partitions": [{**partition, "timestamp": -1}]}]},
            lambda r: r.topics[0].partitions[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "Metadata",
            3,
            12,
            metadata_body([topic, f"{topic}-auto"]),
            lambda r: [t.error_code for t in r.topics],
            [TOPIC_DENIED, TOPIC_DENIED],
        ),
        (
            "OffsetCommit",
            8,
            8,
            {
                "group_id": "g",
                "generation_id_or_member_epoch": -1,
                "topics": [{"name": topic, "partitions": [{**partition, "committed_offset": 0}]}],
            },
            lambda r: r.topics[0].partitions[0].error_code,
            GROUP_DENIED,
        ),
        (
            "OffsetFetch",
            9,
            8,
            {"groups": [{"group_id": "g", "topics": None}]},
            lambda r: r.groups[0].error_code,
            GROUP_DENIED,
        ),
        (
            "FindCoordinator",
            10,
            4,
            {"key_type": 0, "coordinator_keys": ["g"]},
            lambda r: r.coordinators[0].error_code,
            GROUP_DENIED,
        ),
        (
            "JoinGroup",
            11,
            9,
            {
                "group_id": "g",
                "session_timeout": 10_000,
                "rebalance_timeout": 10_000,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
            lambda r: r.error_code,
            GROUP_DENIED,
        ),
        ("Heartbeat", 12, 4, {"group_id": "g", "member_id": "m"}, _code, GROUP_DENIED),
        ("LeaveGroup", 13, 5, {"group_id": "g", "members": []}, _code, GROUP_DENIED),
        (
            "SyncGroup",
            14,
            5,
            {"group_id": "g", "member_id": "m", "protocol_type": "consumer", "protocol_name": "r"},
            _code,
            GROUP_DENIED,
        ),
        ("DescribeGroups", 15, 5, {"groups": ["g"]}, lambda r: r.groups[0].error_code, 30),
        ("DeleteGroups", 42, 2, {"groups_names": ["g"]}, lambda r: r.results[0].error_code, 30),
        (
            "CreateTopics",
            19,
            7,
            {"topics": [{"name": f"{topic}-new", "num_partitions": 1, "replication_factor": 1}]},
            lambda r: r.topics[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "DeleteTopics",
            20,
            6,
            {"topics": [{"name": topic}]},
            lambda r: r.responses[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "DeleteRecords",
            21,
            2,
            {"topics": [{"name": topic, "partitions": [{**partition, "offset": 0}]}]},
            lambda r: r.topics[0].partitions[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "InitProducerId",
            22,
            4,
            {"transactional_id": None, "producer_id": -1, "producer_epoch": -1},
            _code,
            CLUSTER_DENIED,
        ),
        (
            "OffsetForLeaderEpoch",
            23,
            4,
            {"topics": [{"topic": topic, "partitions": [{"partition": 0, "leader_epoch": 0}]}]},
            lambda r: r.topics[0].partitions[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "DescribeConfigs",
            32,
            4,
            {
                "resources": [
                    {"resource_type": 2, "resource_name": topic, "configuration_keys": None},
                    {"resource_type": 4, "resource_name": "", "configuration_keys": None},
                ]
            },
            lambda r: [x.error_code for x in r.results],
            [TOPIC_DENIED, CLUSTER_DENIED],
        ),
        (
            "AlterConfigs",
            33,
            2,
            {"resources": [{"resource_type": 2, "resource_name": topic, "configs": []}]},
            lambda r: r.responses[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "CreatePartitions",
            37,
            3,
            {"topics": [{"name": topic, "count": 2, "assignments": None}]},
            lambda r: r.results[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "IncrementalAlterConfigs",
            44,
            1,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": topic,
                        "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}],
                    }
                ]
            },
            lambda r: r.responses[0].error_code,
            TOPIC_DENIED,
        ),
        (
            "CreateAcls",
            30,
            3,
            {"creations": [_creation(topic)]},
            lambda r: r.results[0].error_code,
            CLUSTER_DENIED,
        ),
        ("DescribeAcls", 29, 3, _acl_filter(), _code, CLUSTER_DENIED),
        (
            "DeleteAcls",
            31,
            3,
            {"filters": [_acl_filter()]},
            lambda r: r.filter_results[0].error_code,
            CLUSTER_DENIED,
        ),
        # the partition half of transactions
        (
            "Produce with a transactional id",
            0,
            9,
            {**produce_body(topic, 0, b""), "transactional_id": "tx"},
            _produce_code,
            53,  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED: WRITE on the transactional id
        ),
        (
            "WriteTxnMarkers",
            27,
            1,
            {
                "markers": [
                    {
                        "producer_id": 1,
                        "producer_epoch": 0,
                        "transaction_result": True,
                        "topics": [{"name": topic, "partition_indexes": [0]}],
                        "coordinator_epoch": 0,
                    }
                ]
            },
            lambda r: r.markers[0].topics[0].partitions[0].error_code,
            CLUSTER_DENIED,
        ),
        (
            "DescribeProducers",
            61,
            0,
            {"topics": [{"name": topic, "partition_indexes": [0]}]},
            lambda r: r.topics[0].partitions[0].error_code,
            TOPIC_DENIED,
        ),
        *_transaction_cases(topic),
    ]


TXN_ID_DENIED = 53


def _transaction_cases(topic: str) -> list[tuple[str, int, int, dict[str, Any], Any, int]]:
    """The transaction coordinator's APIs: WRITE (DESCRIBE to find and describe) on the
    transactional id comes first, as in Kafka."""
    producer = {"producer_id": 1, "producer_epoch": 0}
    return [
        (
            "FindCoordinator (transaction)",
            10,
            4,
            {"key_type": 1, "coordinator_keys": ["t"]},
            lambda r: r.coordinators[0].error_code,
            TXN_ID_DENIED,
        ),
        (
            "InitProducerId (transactional)",
            22,
            4,
            {"transactional_id": "t", "transaction_timeout": 60_000},
            _code,
            TXN_ID_DENIED,
        ),
        (
            "AddPartitionsToTxn",
            24,
            3,
            {
                "v3_and_below_transactional_id": "t",
                "v3_and_below_producer_id": 1,
                "v3_and_below_producer_epoch": 0,
                "v3_and_below_topics": [{"name": topic, "partitions": [0]}],
            },
            lambda r: (
                r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
            ),
            TXN_ID_DENIED,
        ),
        (
            "AddOffsetsToTxn",
            25,
            3,
            {"transactional_id": "t", **producer, "group_id": "g"},
            _code,
            TXN_ID_DENIED,
        ),
        ("EndTxn", 26, 3, {"transactional_id": "t", **producer, "committed": True}, _code, 53),
        (
            "TxnOffsetCommit",
            28,
            3,
            {
                "transactional_id": "t",
                "group_id": "g",
                **producer,
                "generation_id": -1,
                "member_id": "",
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "committed_offset": 1,
                                "committed_leader_epoch": -1,
                                "committed_metadata": None,
                            }
                        ],
                    }
                ],
            },
            lambda r: r.topics[0].partitions[0].error_code,
            TXN_ID_DENIED,
        ),
        (
            "ListTransactions",
            66,
            1,
            {"state_filters": [], "producer_id_filters": [], "duration_filter": -1},
            lambda r: [int(r.error_code), len(r.transaction_states)],
            [0, 0],
        ),
    ]


def _code(response: Any) -> int:
    return int(response.error_code)


def _produce_code(response: Any) -> int:
    return produce_partition(response)[0]


def _creation(topic: str) -> dict[str, Any]:
    return {
        "resource_type": 2,
        "resource_name": topic,
        "resource_pattern_type": 3,
        "principal": ANONYMOUS,
        "host": "*",
        "operation": 3,
        "permission_type": 3,
    }


def _acl_filter() -> dict[str, Any]:
    return {
        "resource_type_filter": 1,
        "resource_name_filter": None,
        "pattern_type_filter": 1,
        "principal_filter": None,
        "host_filter": None,
        "operation": 1,
        "permission_type": 1,
    }


def test_every_api_answers_kafkas_authorization_error_without_acls(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    topic = f"{prefix}-w"
    _make_topic(cluster, topic)
    with KafkaWire(kafka.bootstrap) as wire:
        for name, api_key, version, body, code_of, expected in _wire_cases(topic):
            response = wire.request(api_key, version, body)
            codes = code_of(response)
            codes = [int(c) for c in codes] if isinstance(codes, list) else int(codes)
            assert codes == expected, name
    assert topic in _etcd(cluster, lambda etcd: _topic_names(etcd, cluster.cluster))
    assert f"{topic}-auto" not in _etcd(cluster, lambda etcd: _topic_names(etcd, cluster.cluster))


async def _topic_names(etcd: Etcd, cluster: str) -> list[str]:
    prefix = keys.topics_prefix(cluster)
    return [kv.key[len(prefix) :] for kv in await etcd.get_prefix(prefix)]


def test_admin_clients_manage_acls_and_clients_follow_them(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    grant_cluster(cluster, "ALTER", "DESCRIBE", "CREATE")
    ck_admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    granted = [
        ck_binding(
            ResourceType.TOPIC, f"{prefix}-ok", AclOperation.ALL, ResourcePatternType.PREFIXED
        ),
        ck_binding(
            ResourceType.TOPIC,
            f"{prefix}-ok-secret",
            AclOperation.READ,
            permission=AclPermissionType.DENY,
        ),
        ck_binding(ResourceType.GROUP, prefix, AclOperation.READ, ResourcePatternType.PREFIXED),
    ]
    for future in ck_admin.create_acls(granted).values():
        future.result(30)
    ok, secret, other = f"{prefix}-ok-a", f"{prefix}-ok-secret", f"{prefix}-other"
    for future in ck_admin.create_topics([NewTopic(t, 1, 1) for t in (ok, secret, other)]).values():
        future.result(30)

    # DescribeAcls through both clients: the three bindings and the cluster grants
    described = ck_admin.describe_acls(
        AclBindingFilter(
            ResourceType.ANY,
            None,
            ResourcePatternType.ANY,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(30)
    assert set(granted) <= set(described)
    assert len(described) == 6
    admin = kp_admin(kafka)
    try:
        matching, _ = admin.describe_acls(
            ACLFilter(
                principal=ANONYMOUS,
                host=None,
                operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    KpResourceType.TOPIC, secret, ACLResourcePatternType.MATCH
                ),
            )
        )
        assert {(a.resource_pattern.resource_name, a.permission_type) for a in matching} == {
            (f"{prefix}-ok", ACLPermissionType.ALLOW),
            (secret, ACLPermissionType.DENY),
        }
        # Metadata lists what the principal may describe (DENY READ leaves DESCRIBE to ALL)
        visible = set(admin.list_topics())
        assert {ok, secret} <= visible and other not in visible
    finally:
        admin.close()

    # an idempotent producer starts with WRITE on some topic; writes where allowed only
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 20_000,
        }
    )
    assert produce_one(producer, ok, b"hello") is None
    error = produce_one(producer, other)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # a consumer group allowed by the group prefix reads the allowed topic
    assert _consume(kafka, f"{prefix}-g", ok) == b"hello"
    # ... not the denied one, and a group outside the prefix is refused
    assert _consume_error(kafka, f"{prefix}-g", secret) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _consume_error(kafka, "elsewhere", ok) == KafkaError.GROUP_AUTHORIZATION_FAILED

    # the CLI sees what the admin clients stored, and kafka-python's DeleteAcls removes it
    listed = acls_cli(cluster, "list", "--topic", secret)
    assert listed.split() == ["TOPIC", "LITERAL", secret, ANONYMOUS, "*", "READ", "DENY"]
    admin = kp_admin(kafka)
    try:
        [(_, deleted, error_type)] = admin.delete_acls(
            [
                ACLFilter(
                    principal=None,
                    host=None,
                    operation=ACLOperation.ANY,
                    permission_type=ACLPermissionType.DENY,
                    resource_pattern=ResourcePatternFilter(
                        KpResourceType.TOPIC, None, ACLResourcePatternType.ANY
                    ),
                )
            ]
        )
        assert [a.resource_pattern.resource_name for a in deleted] == [secret]
        assert error_type.errno == 0
    finally:
        admin.close()
    assert acls_cli(cluster, "list", "--topic", secret) == ""
    assert wait_for(lambda: _consume(kafka, f"{prefix}-g2", ok) == b"hello", "the group")


def test_an_acl_change_applies_to_an_open_connection(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    grant_cluster(cluster, "ALTER")
    topic = f"{prefix}-live"
    _make_topic(cluster, topic)
    acls_cli(cluster, "add", "--topic", topic, "--principal", ANONYMOUS, "--operation", "WRITE")
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "message.timeout.ms": 20_000,
            # librdkafka refuses locally, from its metadata, once refused: let it look again
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    assert wait_for(lambda: produce_one(producer, topic) is None, "the WRITE grant")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    revoke = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        ANONYMOUS,
        None,
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    [removed] = admin.delete_acls([revoke]).values()
    assert len(removed.result(30)) == 1

    def refused() -> bool:
        error = produce_one(producer, topic)
        return error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    wait_for(refused, "the revoked WRITE to reach the open connection")
    grant = ck_binding(ResourceType.TOPIC, topic, AclOperation.WRITE)
    for future in admin.create_acls([grant]).values():
        future.result(30)
    wait_for(lambda: produce_one(producer, topic) is None, "the new grant")


def test_super_users_and_the_cli(cluster: BrokerCluster, kafka: BrokerProcess, prefix: str) -> None:
    topic = f"{prefix}-cli"
    _make_topic(cluster, topic)
    acls_cli(
        cluster,
        "add",
        "--topic",
        prefix,
        "--prefixed",
        "--principal",
        "User:*",
        "--operation",
        "READ",
    )
    acls_cli(cluster, "add", "--group", "*", "--principal", ANONYMOUS, "--operation", "DESCRIBE")
    out = acls_cli(cluster, "list")
    assert len(out.splitlines()) == 2
    admin = kp_admin(kafka)
    try:
        assert wait_for(lambda: topic in admin.list_topics(), "READ (implies DESCRIBE)")
    finally:
        admin.close()
    removed = acls_cli(cluster, "remove", "--topic", prefix, "--prefixed")
    assert removed.split()[:3] == ["TOPIC", "PREFIXED", prefix]
    assert len(acls_cli(cluster, "list").splitlines()) == 1


def test_through_the_proxy_the_brokers_decide(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    """The proxy forwards the ACL APIs and the data path; the brokers authorize its clients
    (here, on PLAINTEXT, User:ANONYMOUS) once they trust the proxy's own connection (here
    User:ANONYMOUS too) with CLUSTER_ACTION; tests/integration/test_proxy_security.py has
    the secured version, with SASL clients and an mTLS proxy."""
    grant_cluster(cluster, "ALTER", "DESCRIBE", "CLUSTER_ACTION")
    allowed, refused = f"{prefix}-via-proxy", f"{prefix}-not-via-proxy"
    _make_topic(cluster, allowed)
    _make_topic(cluster, refused)
    proxy = start_proxy(cluster)
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    grant = ck_binding(ResourceType.TOPIC, allowed, AclOperation.WRITE)
    for future in admin.create_acls([grant]).values():
        future.result(30)
    described = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            allowed,
            ResourcePatternType.LITERAL,
            None,
            None,
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(30)
    assert described == [grant]
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 20_000})
    assert wait_for(lambda: produce_one(producer, allowed) is None, "the grant")
    error = produce_one(producer, refused)
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def _consume(kafka: BrokerProcess, group: str, topic: str) -> bytes | None:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise AssertionError(message.error())
            return bytes(message.value())
        return None
    finally:
        consumer.close()


def _consume_error(kafka: BrokerProcess, group: str, topic: str) -> int:
    return consume_error({"bootstrap.servers": kafka.bootstrap}, topic, group)


JAVA_SOURCE = Path(__file__).with_name("java") / "AclAdmin.java"


def java_acl_admin() -> list[str]:
    """The command running ``java/AclAdmin.java`` (compiled once per source version)."""
    return java_program(JAVA_SOURCE, "AclAdmin")


def test_the_java_admin_client_manages_acls(
    cluster: BrokerCluster, kafka: BrokerProcess, prefix: str
) -> None:
    """The Java client is what kafka-acls.sh runs: create, describe and delete through it."""
    command = java_acl_admin()
    refused = children.run(
        [*command, kafka.bootstrap, prefix], capture_output=True, text=True, timeout=120
    )
    assert refused.stdout.split() == ["error", "ClusterAuthorizationException"], refused.stderr
    grant_cluster(cluster, "ALTER", "DESCRIBE")
    done = children.run(
        [*command, kafka.bootstrap, prefix], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    mine = ["TOPIC", "PREFIXED", prefix, ANONYMOUS, "*", "READ", "ALLOW"]
    assert lines[0] == ["created"]
    assert lines[1] == ["described", "3"] and mine in lines[2:5]  # and the two cluster grants
    assert lines[5:] == [["deleted", "1"], mine, ["after", "0"]]
