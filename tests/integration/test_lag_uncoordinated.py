"""Consumer lag of groups nobody coordinates, end to end: two broker processes, a real etcd,
kafka-python consumers and producers, each broker's ``/metrics`` read as Prometheus reads it.

What a user's lag alert relies on: the consumers of a group all close, the group goes Empty
and is let go (``groups.idle_release_ms``, a fraction of a second here), and its
``kafscale_consumer_group_lag`` series stays, on exactly one broker (a ``sum`` over brokers
counts it once), and grows as records are produced. After every broker restarted, a group with
committed offsets shows its lag without any member coming back. (Before, lag was reported by a
group's coordinator only: both series were gone.)
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import harness_etcd
from harness.groups import wait_for
from harness.s3 import S3Endpoint
from harness.topics import create_topics
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

ENV = {
    "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "0",
    "KAFSCALE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
    "KAFSCALE_GROUPS__IDLE_RELEASE_MS": "300",
    "KAFSCALE_GROUPS__LAG_REFRESH_INTERVAL_MS": "500",
}
DEADLINE_S = 90.0
PARTITIONS = 2
RECORDS = 10  # per partition
COMMITTED = {0: 4, 1: 7}

Series = dict[tuple[str, int], float]


@pytest.fixture
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path_factory.mktemp("lag"), "lag", extra_env=ENV
    )
    try:
        yield cluster
    finally:
        cluster.stop_all()


def _name(what: str) -> str:
    return f"lag-{what}-{uuid.uuid4().hex[:6]}"


def produce(bootstrap: str, topic: str, per_partition: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for partition in range(PARTITIONS):
            for index in range(per_partition):
                producer.send(topic, b"%d" % index, partition=partition)
        producer.flush(30)
    finally:
        producer.close(10)


def read_commit_close(bootstrap: str, group: str, topic: str) -> None:
    """A subscribed consumer reads every record, commits ``COMMITTED`` and closes (leaves)."""
    member = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=30_000,
        heartbeat_interval_ms=500,
    )
    try:
        read = 0
        deadline = time.monotonic() + DEADLINE_S
        while read < RECORDS * PARTITIONS:
            assert time.monotonic() < deadline, f"read {read} records"
            read += sum(len(r) for r in member.poll(timeout_ms=500).values())
        member.commit(
            {
                TopicPartition(topic, p): OffsetAndMetadata(offset, "", -1)
                for p, offset in COMMITTED.items()
            }
        )
    finally:
        member.close()


def lag_on(broker: BrokerProcess, group: str) -> Series:
    """The group's ``kafscale_consumer_group_lag`` samples on one broker's /metrics."""
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: Series = {}
    for family in text_string_to_metric_families(text):
        if family.name != "kafscale_consumer_group_lag":
            continue
        for sample in family.samples:
            if sample.labels["group"] == group:
                found[(sample.labels["topic"], int(sample.labels["partition"]))] = sample.value
    return found


def reported(cluster: BrokerCluster, group: str) -> list[tuple[int, Series]]:
    """(node id, series) of every live broker whose /metrics has the group's lag."""
    live = [b for b in cluster.brokers if b.alive]
    return [(b.node_id, series) for b in live if (series := lag_on(b, group))]


def on_exactly_one(cluster: BrokerCluster, group: str, expected: Series) -> bool:
    """Exactly one live broker reports the group, with ``expected``, and no other has any of
    its series."""
    found = reported(cluster, group)
    return len(found) == 1 and found[0][1] == expected


def coordinated(cluster: BrokerCluster) -> set[str]:
    """The groups with a lease in etcd (a broker coordinates a group only with one)."""
    leases = keys.group_leases_prefix(cluster.cluster)
    under = leases[len(keys.cluster_prefix(cluster.cluster)) :]
    return {keys.group_from_key_part(key[len(leases) :]) for key in cluster.etcd_keys(under)}


def expected_lag(topic: str, per_partition: int) -> Series:
    return {(topic, p): float(per_partition - offset) for p, offset in COMMITTED.items()}


def test_a_let_go_groups_lag_stays_on_one_broker_and_grows(cluster: BrokerCluster) -> None:
    # Refreshes an hour apart: each broker's first, at its start, finds no group; so the
    # series after the group is let go comes from the coordinator's hand-over, at once.
    for _ in range(2):
        cluster.start(KAFSCALE_GROUPS__LAG_REFRESH_INTERVAL_MS="3600000")
    bootstrap = cluster.bootstrap
    topic, group = _name("t"), _name("g")
    create_topics(bootstrap, [topic], PARTITIONS)
    produce(bootstrap, topic, RECORDS)
    read_commit_close(bootstrap, group, topic)

    wait_until_deadline(lambda: group not in coordinated(cluster), "the group to be let go")
    wait_until_deadline(
        lambda: on_exactly_one(cluster, group, expected_lag(topic, RECORDS)),
        f"the lag of {group} on exactly one broker after it was let go: {reported(cluster, group)}",
    )

    produce(bootstrap, topic, 5)
    wait_until_deadline(
        lambda: on_exactly_one(cluster, group, expected_lag(topic, RECORDS + 5)),
        f"the lag to grow on exactly one broker: {reported(cluster, group)}",
    )
    assert group not in coordinated(cluster)  # nobody took it on: the lag came from etcd


def test_lag_shows_after_every_broker_restarted_without_members(cluster: BrokerCluster) -> None:
    for _ in range(2):
        cluster.start()
    bootstrap = cluster.bootstrap
    topic = _name("t")
    groups = [_name(f"g{i}") for i in range(4)]  # likely picked to both brokers
    create_topics(bootstrap, [topic], PARTITIONS)
    produce(bootstrap, topic, RECORDS)
    for group in groups:
        read_commit_close(bootstrap, group, topic)

    for broker in list(cluster.brokers):
        broker.stop()
    for _ in range(2):
        cluster.start()
    produce(cluster.bootstrap, topic, 3)

    for group in groups:
        wait_until_deadline(
            lambda group=group: on_exactly_one(cluster, group, expected_lag(topic, RECORDS + 3)),
            f"the lag of {group} on exactly one broker after the restart: "
            f"{reported(cluster, group)}",
        )
    assert not coordinated(cluster) & set(groups)  # no member came back, nobody took them on


def put_key(cluster: BrokerCluster, key: str, value: bytes) -> None:
    """One etcd key written as an operator's ``etcdctl put`` would."""

    async def put() -> None:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            await etcd.put(key, value)
        finally:
            await etcd.close()

    asyncio.run(put())


def test_a_corrupt_committed_offset_hides_no_other_groups_lag(cluster: BrokerCluster) -> None:
    # One broker: every stored group is its pick. Another group's committed offset holds
    # garbage (an etcdctl put gone wrong). Before, each lag refresh raised on it: no group
    # read in the same etcd page (here: all of them) got a series after the restart.
    broker = cluster.start()
    topic, group = _name("t"), _name("g")
    corrupt = _name("corrupt")
    create_topics(broker.bootstrap, [topic], PARTITIONS)
    produce(broker.bootstrap, topic, RECORDS)
    read_commit_close(broker.bootstrap, group, topic)
    put_key(cluster, keys.group_offset_key(cluster.cluster, corrupt, topic, 0), b"\xff{")

    broker.stop()
    broker = cluster.start()
    wait_until_deadline(
        lambda: on_exactly_one(cluster, group, expected_lag(topic, RECORDS)),
        f"the lag of {group} after the restart: {reported(cluster, group)}",
    )
    assert lag_on(broker, corrupt) == {}


def wait_until_deadline(check: Callable[[], bool], what: str) -> None:
    """``harness.groups.wait_for`` with this file's deadline."""
    wait_for(check, DEADLINE_S, what)
