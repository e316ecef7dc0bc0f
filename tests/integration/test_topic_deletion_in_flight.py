"""Deleting a topic deletes its data, even what was still being uploaded when it was deleted,
even when the object store is unreachable for a while right then, and even when the broker that
deleted it stops before it could delete the objects.

The broker that handles DeleteTopics lists the topic's objects once. An upload in flight at that
moment lands after the listing: a segment whose commit can no longer happen, or an index that
follows a committed segment. A proxy in front of moto holds such a PUT back for two seconds, so
the race is hit every time; the same proxy refuses connections to play an outage. Until the
objects are gone, etcd keeps a tombstone of the topic, from which another broker finishes the job.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from harness.brokers import BrokerCluster, BrokerProcess
from harness.s3_proxy import S3Proxy, s3_proxy

pytestmark = pytest.mark.integration

HOLD_S = 2.0


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def start_topic(broker: BrokerProcess) -> str:
    topic = f"gone-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    return topic


def stored_topic(cluster: BrokerCluster, broker: BrokerProcess) -> tuple[str, str]:
    """A new topic with an acknowledged record, and the prefix of its objects (not empty)."""
    topic = start_topic(broker)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    producer.produce(topic, b"stored before the topic is deleted")
    assert producer.flush(10) == 0
    prefix = f"{cluster.cluster}/topics/{topic}/"
    assert cluster.object_keys(prefix)
    return topic, prefix


def purge_lines(broker: BrokerProcess, topic: str, kind: str) -> int:
    """How many lines of ``kind`` the deleting broker logged about deleting ``topic``'s objects
    (``TopicPurger.purge_with_retries``, a run of failures as ``retry_log`` writes it:
    ``; retrying`` for its first failure, ``recovered after`` at its end): a condition to wait
    on, not a guessed time."""
    lines = broker.log_path.read_text(errors="replace").splitlines()
    about = f"deleting the objects of topic {topic}: "
    return sum(1 for line in lines if about in line and kind in line)


def delete_topic(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics([topic])[topic].result(10)


def held_topic_prefix(proxy: S3Proxy, cluster: BrokerCluster, topic: str) -> str:
    """``cluster/topics/<topic>/<topic id>/`` of the held PUT (the id changes if the producer's
    retries auto-create the topic again)."""
    match = re.search(rf"/({re.escape(cluster.cluster)}/topics/{topic}/[0-9a-f]+/)", proxy.held[0])
    assert match is not None, proxy.held
    return match.group(1)


def test_segment_upload_in_flight_when_its_topic_is_deleted_leaves_nothing(
    broker_cluster: BrokerCluster,
) -> None:
    with s3_proxy(broker_cluster.s3.url, HOLD_S) as proxy:
        broker = broker_cluster.start(KAFSCALE_STORAGE__ENDPOINT=proxy.url)
        topic = start_topic(broker)
        proxy.hold = re.compile(rf"/topics/{topic}/.*\.kfs")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 3000})
        producer.produce(topic, b"never committed")
        producer.poll(0)
        assert wait_for(lambda: bool(proxy.held), 10), "the segment upload never started"
        delete_topic(broker, topic)  # lists the topic's objects while the PUT is held
        prefix = held_topic_prefix(proxy, broker_cluster, topic)
        time.sleep(HOLD_S + 0.5)  # the held segment has landed by now
        producer.purge()
        producer.flush(5)
        assert wait_for(lambda: not broker_cluster.object_keys(prefix), 10), (
            f"left behind: {broker_cluster.object_keys(prefix)}"
        )


def test_index_upload_in_flight_when_its_topic_is_deleted_leaves_nothing(
    broker_cluster: BrokerCluster,
) -> None:
    with s3_proxy(broker_cluster.s3.url, HOLD_S) as proxy:
        broker = broker_cluster.start(
            KAFSCALE_STORAGE__ENDPOINT=proxy.url, KAFSCALE_LOG__INDEX_MIN_SEGMENT_BYTES="0"
        )
        topic = start_topic(broker)
        proxy.hold = re.compile(rf"/topics/{topic}/.*\.idx")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        producer.produce(topic, b"committed, then deleted")
        assert producer.flush(10) == 0  # acked: the segment is committed, its index follows
        assert wait_for(lambda: bool(proxy.held), 10), "the index upload never started"
        prefix = held_topic_prefix(proxy, broker_cluster, topic)
        assert any(k.endswith(".kfs") for k in broker_cluster.object_keys(prefix))
        delete_topic(broker, topic)
        time.sleep(HOLD_S + 0.5)  # the held index has landed by now
        assert wait_for(lambda: not broker_cluster.object_keys(prefix), 10), (
            f"left behind: {broker_cluster.object_keys(prefix)}"
        )
        assert wait_for(lambda: not broker_cluster.etcd_keys(f"deleted-topics/{topic}/"), 10)


def test_objects_of_a_topic_deleted_during_a_storage_outage_go_once_it_is_back(
    broker_cluster: BrokerCluster,
) -> None:
    with s3_proxy(broker_cluster.s3.url) as proxy:
        broker = broker_cluster.start(KAFSCALE_STORAGE__ENDPOINT=proxy.url)
        topic, prefix = stored_topic(broker_cluster, broker)
        proxy.refuse = True
        delete_topic(broker, topic)  # etcd only: the objects cannot be listed now
        # The first attempt fails (after botocore's own retries), as logged.
        assert wait_for(lambda: purge_lines(broker, topic, "; retrying") >= 1, 60), broker.tail()
        assert broker_cluster.object_keys(prefix), "deleted although S3 was unreachable?"
        assert broker_cluster.etcd_keys(f"deleted-topics/{topic}/"), "no tombstone while pending"
        proxy.refuse = False
        assert wait_for(lambda: not broker_cluster.object_keys(prefix), 40), (
            f"left behind: {broker_cluster.object_keys(prefix)}"
        )
        assert wait_for(lambda: not broker_cluster.etcd_keys(f"deleted-topics/{topic}/"), 10)
        # One run of failures: its first line and its recovery, not a line per attempt.
        assert wait_for(lambda: purge_lines(broker, topic, "recovered after") == 1, 10)
        assert purge_lines(broker, topic, "; retrying") == 1, broker.tail()


def test_objects_left_by_a_deleting_broker_that_stopped_are_deleted_by_another(
    broker_cluster: BrokerCluster,
) -> None:
    foreign = f"{broker_cluster.cluster}/topics/unknown-to-etcd/0123abcd/0/x.kfs"
    broker_cluster.s3.client().put_object(Bucket=broker_cluster.bucket, Key=foreign, Body=b"x")
    with s3_proxy(broker_cluster.s3.url) as proxy:
        deleting = broker_cluster.start(KAFSCALE_STORAGE__ENDPOINT=proxy.url)
        topic, prefix = stored_topic(broker_cluster, deleting)
        proxy.refuse = True
        delete_topic(deleting, topic)
        assert deleting.stop() == 0  # gives up its retries on the way out
    assert broker_cluster.object_keys(prefix), "deleted although S3 was unreachable?"
    assert broker_cluster.etcd_keys(f"deleted-topics/{topic}/")
    broker_cluster.start(KAFSCALE_LOG__PURGE_INTERVAL_S="0.5")
    assert wait_for(lambda: not broker_cluster.object_keys(prefix), 20), (
        f"left behind: {broker_cluster.object_keys(prefix)}"
    )
    assert wait_for(lambda: not broker_cluster.etcd_keys(f"deleted-topics/{topic}/"), 10)
    # Objects without a tombstone are never taken for garbage (an empty or restored etcd, say).
    assert broker_cluster.object_keys(foreign) == [foreign]
