"""Clients from before Kafka 2.1: the old API versions Kafka 3.9 still serves (issue 27).

Raw requests at the exact old versions (ListOffsets v0, OffsetCommit v0-v1, OffsetFetch v0,
Produce v0-v2, Fetch v0-v3) against a real broker process, and kafka-python pinned to
``api_version=(0, 9)`` and ``(0, 10, 1)`` alongside confluent-kafka on one topic.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster, BrokerProcess, _create_bucket
from harness.kafka_wire import API_VERSIONS, LIST_OFFSETS, KafkaWire
from harness.s3 import S3Endpoint, unique_bucket
from harness.topics import create_topics

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

OFFSET_COMMIT, OFFSET_FETCH = 8, 9


@pytest.fixture(scope="module")
def kafka(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerProcess]:
    bucket = unique_bucket("oldclients")
    _create_bucket(s3_server, bucket)
    cluster = BrokerCluster(
        etcd_server.client_url,
        s3_server,
        bucket,
        f"old-clients-{uuid.uuid4().hex[:8]}",
        tmp_path_factory.mktemp("old-clients"),
    )
    try:
        yield cluster.start()
    finally:
        cluster.stop_all()


@pytest.fixture
def topic() -> str:
    return f"old-{uuid.uuid4().hex[:8]}"


def produce_with_confluent(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode(), partition=0)
    assert producer.flush(30) == 0


def advertised(wire: KafkaWire) -> dict[int, tuple[int, int]]:
    response = wire.request(API_VERSIONS, 3, {})
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in response.api_keys}


def test_old_versions_of_the_simple_apis_are_advertised(kafka: BrokerProcess) -> None:
    with KafkaWire(kafka.bootstrap) as wire:
        ranges = advertised(wire)
    assert ranges[LIST_OFFSETS][0] == 0
    assert ranges[OFFSET_COMMIT][0] == 0
    assert ranges[OFFSET_FETCH][0] == 0


def list_offsets_v0(wire: KafkaWire, topic: str, timestamp: int) -> tuple[int, list[int]]:
    body = {
        "replica_id": -1,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": 0, "timestamp": timestamp, "max_num_offsets": 1}
                ],
            }
        ],
    }
    partition = wire.request(LIST_OFFSETS, 0, body).topics[0].partitions[0]
    return int(partition.error_code), [int(o) for o in partition.old_style_offsets]


def test_list_offsets_v0_answers_latest_and_earliest(kafka: BrokerProcess, topic: str) -> None:
    create_topics(kafka.bootstrap, [topic], partitions=1)
    produce_with_confluent(kafka.bootstrap, topic, 5)
    with KafkaWire(kafka.bootstrap) as wire:
        assert list_offsets_v0(wire, topic, -1) == (0, [5])
        assert list_offsets_v0(wire, topic, -2) == (0, [0])
        error, offsets = list_offsets_v0(wire, "no-such-topic-" + topic, -1)
        assert (error, offsets) == (3, [])  # UNKNOWN_TOPIC_OR_PARTITION


def commit_body(group: str, topic: str, offset: int, metadata: str) -> dict[str, object]:
    partition = {
        "partition_index": 0,
        "committed_offset": offset,
        "commit_timestamp": -1,
        "committed_metadata": metadata,
    }
    return {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [{"name": topic, "partitions": [partition]}],
    }


def fetch_committed_v0(wire: KafkaWire, group: str, topic: str) -> tuple[int, int, str]:
    body = {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}
    partition = wire.request(OFFSET_FETCH, 0, body).topics[0].partitions[0]
    return int(partition.error_code), int(partition.committed_offset), str(partition.metadata)


@pytest.mark.parametrize("commit_version", [0, 1])
def test_offset_commit_v0_v1_then_offset_fetch_v0(
    kafka: BrokerProcess, topic: str, commit_version: int
) -> None:
    """A group-less (simple) consumer commits with v0 or v1 and reads the offset back with
    OffsetFetch v0; a v8 client sees the same commit."""
    create_topics(kafka.bootstrap, [topic], partitions=1)
    group = f"g-{uuid.uuid4().hex[:6]}"
    with KafkaWire(kafka.bootstrap) as wire:
        response = wire.request(OFFSET_COMMIT, commit_version, commit_body(group, topic, 3, "m"))
        assert int(response.topics[0].partitions[0].error_code) == 0
        assert fetch_committed_v0(wire, group, topic) == (0, 3, "m")
        newer = wire.request(
            OFFSET_FETCH,
            7,
            {
                "group_id": group,
                "topics": [{"name": topic, "partition_indexes": [0]}],
                "require_stable": False,
            },
        )
        assert int(newer.topics[0].partitions[0].committed_offset) == 3
