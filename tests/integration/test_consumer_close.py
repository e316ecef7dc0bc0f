"""A cooperative-sticky consumer closes promptly after its topic is deleted under it.

Issue 29: a cooperative-sticky consumer (librdkafka) leaving after its topic was deleted hung
on close, its bootstrap broker connection reconnecting during shutdown. These tests run the
sequences of librdkafka's own tests (0113 ``h_delete_topic``, ``i_delete_topic_2``) with the
confluent-kafka wheel, against three brokers and through the proxy, and bound the close.

The hang itself is librdkafka's (fixed in 2.6.1, confluentinc/librdkafka#4724): a removed
partition's fetch queue keeps a reference to the partition, so the broker handle's reference
count never reaches zero and ``rd_kafka_destroy`` loops, reconnecting. It reproduces with
Debian's librdkafka 2.0.2 (kcat's) on every try; the client then has no request outstanding
on any connection (0 outbufs, 0 waitresps), so nothing the broker answers could end it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from harness.brokers import BrokerCluster, running_cluster
from harness.proxy import start_proxy
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

CLOSE_BOUND_S = 30
METADATA_REFRESH_MS = 1000
"""How often the consumer looks for its topics (librdkafka's test: 3 s). It notices the
deletion at its next look: the close that hung comes after, so a shorter look tests the same."""


@pytest.fixture(scope="module")
def three_brokers(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """Three brokers for the module: each test has topics and a group of its own."""
    with running_cluster(etcd_server, s3_server, tmp_path_factory, "close", brokers=3) as cluster:
        yield cluster


def poll_until_assigned(consumer: Consumer, topics: set[str], bound_s: float = 40) -> None:
    """Poll (as the client's test does, 500 ms at a time) until the assignment's topics are
    exactly ``topics``; fails after ``bound_s``."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        consumer.poll(0.5)
        if {tp.topic for tp in consumer.assignment()} == topics:
            return
    assigned = sorted({tp.topic for tp in consumer.assignment()})
    raise AssertionError(f"assignment {assigned} never became {sorted(topics)}")


def close_within_bound(consumer: Consumer) -> bool:
    """Whether ``consumer.close()`` returned within the bound (run in a thread)."""
    closer = threading.Thread(target=consumer.close, daemon=True)
    closer.start()
    closer.join(CLOSE_BOUND_S)
    return not closer.is_alive()


def subscribe_delete_close(bootstrap: str, keep: list[str], delete: list[str]) -> None:
    """Subscribe to ``keep + delete`` cooperatively, delete ``delete`` once assigned, wait for
    the assignment to drop them, close: close must return."""
    create_topics(bootstrap, keep + delete, partitions=1)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "g-" + "-".join(keep + delete),
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
            "session.timeout.ms": 15000,
        }
    )
    try:
        consumer.subscribe(keep + delete)
        poll_until_assigned(consumer, set(keep + delete))
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics(delete).values():
            future.result(10)
        poll_until_assigned(consumer, set(keep))
    except BaseException:
        consumer.close()
        raise
    assert close_within_bound(consumer), f"close() still running after {CLOSE_BOUND_S} s"


@pytest.mark.parametrize(
    ("keep", "delete"),
    [([], ["only"]), (["kept"], ["dropped"])],
    ids=["its-only-topic", "one-of-two-topics"],
)
def test_a_cooperative_sticky_consumer_closes_after_its_topic_is_deleted(
    three_brokers: BrokerCluster, keep: list[str], delete: list[str]
) -> None:
    subscribe_delete_close(three_brokers.bootstrap, keep, delete)


def test_a_cooperative_sticky_consumer_closes_through_the_proxy_after_deletion(
    broker_cluster: BrokerCluster,
) -> None:
    broker_cluster.start()
    proxy = start_proxy(broker_cluster)
    subscribe_delete_close(proxy.bootstrap, [], ["only"])
