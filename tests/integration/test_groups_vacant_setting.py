"""``groups.vacant_release_ms`` end to end: a broker process started with its own value keeps a
group that holds nothing (one a DescribeGroups named but nobody created) coordinated that long.

The witness is a group with committed offsets and no members, let go after
``groups.idle_release_ms`` (6 s here) unused. It is committed after the vacant group was named,
so when it goes, the vacant group has been unused longer than 6 s: with the old fixed 5 s the
vacant group was gone by then (at the same look of the release loop or an earlier one); with
10 minutes it is still coordinated. No time is measured: the test waits on conditions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__IDLE_RELEASE_MS": "6000",
    "KAFSCALE_GROUPS__VACANT_RELEASE_MS": "600000",
}
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url,
        s3_server,
        tmp_path_factory.mktemp("vacant"),
        "vacant",
        extra_env=ENV,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def _name(what: str) -> str:
    return f"vacant-{what}-{uuid.uuid4().hex[:6]}"


def _wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _coordinated(cluster: BrokerCluster) -> set[str]:
    """The groups with a lease in etcd (a coordinator holds a runtime only with one)."""
    leases = keys.group_leases_prefix(cluster.cluster)
    under = leases[len(keys.cluster_prefix(cluster.cluster)) :]
    return {keys.group_from_key_part(key[len(leases) :]) for key in cluster.etcd_keys(under)}


def _commit_standalone(bootstrap: str, group: str, tp: TopicPartition, offset: int) -> None:
    """Offsets committed outside group management: the group has offsets and no members."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
    finally:
        consumer.close()


def test_a_vacant_group_is_kept_for_the_configured_time_not_5_s(cluster: BrokerCluster) -> None:
    bootstrap = cluster.bootstrap
    topic = _name("t")
    create_topics(bootstrap, [topic], 1)
    vacant, witness = _name("nobody"), _name("offsets")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_groups([vacant])[vacant]
        assert described["group_state"] == "Dead"  # Kafka's answer for a group nobody created
    finally:
        admin.close()
    _wait_until(lambda: vacant in _coordinated(cluster), f"{vacant} to be coordinated")

    _commit_standalone(bootstrap, witness, TopicPartition(topic, 0), 0)
    _wait_until(lambda: witness in _coordinated(cluster), f"{witness} to be coordinated")
    _wait_until(lambda: witness not in _coordinated(cluster), f"{witness} to be let go")
    assert vacant in _coordinated(cluster)
