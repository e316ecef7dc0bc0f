"""What other clients' own integration suites found, each as a check of our own with a real
client against a real broker process (the suites are in docs/client-suites.md).

* confluent-kafka's AdminClient sends DeleteRecords and then, without waiting, ListOffsets on
  the same connection: Kafka processes a connection's requests in order, so the earliest offset
  it reads is the new log start. Run concurrently, ListOffsets was answered first (old start).
  Through the proxy both come inside Envelopes, ordered as the requests they carry.
* IncrementalAlterConfigs APPEND and SUBTRACT edit list configs (``cleanup.policy``), starting
  from the default when the topic has none set; other configs refuse them (INVALID_CONFIG).
* DescribeUserScramCredentials with an empty user list describes every user, as Kafka does:
  librdkafka sends an empty array (not null) for "all users".
* aiokafka's consume-transform-produce loop (its own suite's): offsets sent in transactions for
  partition 0, then for partition 1, are all committed; the consumer that asks for partition 0
  and then partition 1 sees both (partition 1 stayed at its old offset).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

INVALID_CONFIG = 40


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster: BrokerCluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("suites"), "suites"
    )
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture(scope="module")
def kafka(cluster: BrokerCluster) -> BrokerProcess:
    return cluster.start()


@pytest.fixture
def admin(kafka: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": kafka.bootstrap})


def _create(admin: AdminClient, partitions: int = 1) -> str:
    topic = f"suites-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def test_list_offsets_sent_right_after_delete_records_sees_the_new_log_start(
    admin: AdminClient, kafka: BrokerProcess
) -> None:
    _check_list_offsets_after_delete_records(admin, kafka.bootstrap)


def test_through_the_proxy_list_offsets_after_delete_records_sees_the_new_log_start(
    cluster: BrokerCluster, kafka: BrokerProcess
) -> None:
    """The proxy forwards both inside Envelopes (KIP-590) on one broker connection: the
    broker orders an Envelope as the request it carries."""
    proxy = start_proxy(cluster)
    _check_list_offsets_after_delete_records(
        AdminClient({"bootstrap.servers": proxy.bootstrap}), proxy.bootstrap
    )


def _check_list_offsets_after_delete_records(admin: AdminClient, bootstrap: str) -> None:
    for _ in range(3):
        topic = _create(admin)
        producer = Producer({"bootstrap.servers": bootstrap})
        for value in (b"one", b"two", b"three"):
            producer.produce(topic, value)
        assert producer.flush(30) == 0
        deleted = admin.delete_records([TopicPartition(topic, 0, 2)])
        earliest = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.earliest()})
        low_watermark = next(iter(deleted.values())).result(30).low_watermark
        assert low_watermark == 2
        assert next(iter(earliest.values())).result(30).offset == 2


def _alter(admin: AdminClient, topic: str, *entries: ConfigEntry) -> None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
    next(iter(admin.incremental_alter_configs([resource]).values())).result(30)


def _config(admin: AdminClient, topic: str, name: str) -> str:
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    return str(next(iter(described.values())).result(30)[name].value)


def test_append_and_subtract_edit_the_cleanup_policy_list(admin: AdminClient) -> None:
    topic = _create(admin)
    append, subtract = AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT
    _alter(admin, topic, ConfigEntry("cleanup.policy", "compact", incremental_operation=append))
    assert _config(admin, topic, "cleanup.policy") == "delete,compact"
    _alter(admin, topic, ConfigEntry("cleanup.policy", "compact", incremental_operation=append))
    assert _config(admin, topic, "cleanup.policy") == "delete,compact"  # no duplicates
    _alter(admin, topic, ConfigEntry("cleanup.policy", "delete", incremental_operation=subtract))
    assert _config(admin, topic, "cleanup.policy") == "compact"
    _alter(admin, topic, ConfigEntry("cleanup.policy", "compact", incremental_operation=subtract))
    assert _config(admin, topic, "cleanup.policy") == ""

    with pytest.raises(KafkaException) as refused:
        _alter(admin, topic, ConfigEntry("retention.ms", "5", incremental_operation=append))
    assert refused.value.args[0].code() == INVALID_CONFIG
    assert _config(admin, topic, "retention.ms") == "604800000"


def test_describing_all_scram_users_lists_a_user_made_through_the_admin_api(
    admin: AdminClient,
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    upsert = UserScramCredentialUpsertion(user, info, b"password", b"salt")
    admin.alter_user_scram_credentials([upsert])[user].result(30)
    try:
        described = admin.describe_user_scram_credentials().result(30)
        assert user in described
        infos = described[user].scram_credential_infos
        described_infos = [(i.mechanism, i.iterations) for i in infos]
        assert described_infos == [(ScramMechanism.SCRAM_SHA_256, 4096)]
    finally:
        deletion = UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_256)
        admin.alter_user_scram_credentials([deletion])[user].result(30)
    assert user not in admin.describe_user_scram_credentials().result(30)


def test_offsets_sent_in_transactions_partition_after_partition_are_all_committed(
    admin: AdminClient, kafka: BrokerProcess
) -> None:
    topic = _create(admin, partitions=2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for partition in (0, 1):
        for i in range(30):
            producer.produce(topic, str(i).encode(), partition=partition)
    assert producer.flush(30) == 0
    committed = asyncio.run(_transform_in_transactions(kafka.bootstrap, topic))
    assert committed == {0: 30, 1: 30}


async def _transform_in_transactions(bootstrap: str, topic: str) -> dict[int, int | None]:
    """Read ``topic`` in a group, ten records a transaction (so partition 0's transactions
    come first, then partition 1's), each sending its offsets; then the committed offsets, as
    that consumer asks for them, one partition at a time."""
    group = f"{topic}-group"
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"{topic}-txn")
    await consumer.start()
    await producer.start()
    try:
        assert len(consumer.assignment()) == 2  # start() joins the group
        for tp in consumer.assignment():
            await consumer.commit({tp: 0})
        while batch := await consumer.getmany(timeout_ms=3000, max_records=10):
            async with producer.transaction():
                offsets = {}
                for tp, messages in batch.items():
                    for message in messages:
                        await producer.send(f"{topic}-out", message.value, partition=0)
                    offsets[tp] = messages[-1].offset + 1
                await producer.send_offsets_to_transaction(offsets, group)
        return {p: await consumer.committed(AioTopicPartition(topic, p)) for p in (0, 1)}
    finally:
        await producer.stop()
        await consumer.stop()
