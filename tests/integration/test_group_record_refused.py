"""A group record etcd refuses is an answer, and the group is served on.

etcd refuses a request over its ``--max-request-bytes`` (1.5 MiB by default) with "request is
too large". A classic group's record holds every member's subscription and assignment, so a
large group, or members whose assignor carries its own state in the subscription's user data
(Kafka Streams' does), can pass that limit. Before, the refusal ended the group's writer task:
the leader's SyncGroup was never answered, and neither was any later rebalance's, while the
broker went on coordinating the group. Now the SyncGroup is answered UNKNOWN_SERVER_ERROR (what
Kafka answers for a group record too large for its log) and later rebalances are stored.

The etcd here takes requests of up to 64 KiB, so that a 100 KiB subscription passes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import running_etcd
from harness.s3 import S3Endpoint
from harness.topics import create_topic
from kafka import KafkaConsumer, KafkaProducer
from kafka.coordinator.assignors.abstract import ConsumerProtocolSubscription
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, UnknownError

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

ETCD_MAX_REQUEST_BYTES = 64 * 1024
USER_DATA_BYTES = 100_000
DEADLINE_S = 120.0  # generous: the machine is shared


class BulkyRange(RangePartitionAssignor):
    """The range assignor with 100 KiB of its own state in each subscription."""

    @classmethod
    def metadata(cls, topics: list[str]) -> ConsumerProtocolSubscription:  # type: ignore[override]
        return ConsumerProtocolSubscription(cls.version, list(topics), b"s" * USER_DATA_BYTES)


@pytest.fixture
def small_requests_etcd() -> Iterator[EmbeddedEtcd]:
    with running_etcd((f"--max-request-bytes={ETCD_MAX_REQUEST_BYTES}",)) as server:
        yield server


@pytest.fixture
def cluster(
    small_requests_etcd: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[BrokerCluster]:
    made = new_cluster(small_requests_etcd.client_url, s3_server, tmp_path, "refused")
    try:
        yield made
    finally:
        made.stop_all()


def consumer(bootstrap: str, **config: object) -> KafkaConsumer:
    return KafkaConsumer(
        "t",
        bootstrap_servers=bootstrap,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=10_000,
        **config,
    )


def first_error(bulky: KafkaConsumer) -> KafkaError:
    """What the bulky member's poll raises (it never gets an assignment)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            assert not bulky.poll(timeout_ms=500), "assigned a group etcd did not store"
        except KafkaError as exc:
            return exc
    raise AssertionError("the SyncGroup was never answered")


def test_a_refused_group_record_is_answered_and_the_group_goes_on(
    cluster: BrokerCluster,
) -> None:
    cluster.start()
    create_topic(cluster.bootstrap, "t", 1)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    for i in range(3):
        producer.send("t", f"v{i}".encode())
    producer.flush(60)
    producer.close()

    bulky = consumer(
        cluster.bootstrap, partition_assignment_strategy=[BulkyRange], request_timeout_ms=300_000
    )
    try:
        assert isinstance(first_error(bulky), UnknownError)  # UNKNOWN_SERVER_ERROR
    finally:
        bulky.close()

    # The group's writer goes on: a member of ordinary size joins, is assigned and reads.
    plain = consumer(cluster.bootstrap, consumer_timeout_ms=1_000)
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < 3 and time.monotonic() < deadline:
            for batch in plain.poll(timeout_ms=1_000).values():
                values.extend(record.value for record in batch)
        assert values == [b"v0", b"v1", b"v2"]
    finally:
        plain.close()
