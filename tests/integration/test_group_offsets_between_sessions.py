"""OffsetFetch to a coordinator between two etcd sessions is retried, not stranded.

A broker whose etcd session ended (paused, partitioned, etcd electing a leader; with the
campaign's 4-s TTL on a loaded machine, often) drops every group at once and coordinates
nothing until its next session is up; it is most often the group's coordinator again a moment
later. A librdkafka member that has just been assigned partitions asks its coordinator for their
committed offsets (OffsetFetch): answered NOT_COORDINATOR at the group level, librdkafka 2.16
never asks again and never starts those partitions (issue 5586; the partitions stay "queried"),
so the group stops consuming for good with every partition assigned. ``bench/chaos.py --seed
41 --kinds coord-kill,coord-stop,coord-term,etcd-leader`` caught exactly that (bench/README.md).
A broker that does not coordinate the group answers OffsetFetch from etcd
(``test_group_offsets_elsewhere``); between sessions that read fails too (etcd is what the
broker cannot reach), and the answer is COORDINATOR_LOAD_IN_PROGRESS, which Kafka answers while
a coordinator takes a group on, and which librdkafka (and the other clients) retry.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from harness.brokers import new_cluster
from harness.kafka_wire import KafkaWire
from harness.s3 import S3Endpoint
from harness.topics import create_topic

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

OFFSET_FETCH = 9
DEADLINE_S = 120.0  # generous: the machine is shared


def consumer(bootstrap: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})


def values_read(reader: Consumer, count: int) -> list[bytes]:
    """The values ``reader`` delivers until it has ``count`` (or the deadline passes)."""
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < count and time.monotonic() < deadline:
        message = reader.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def test_offset_fetch_between_sessions_answers_load_in_progress(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "s", name=cluster_name
    )
    try:
        broker = cluster.start(KAFSCALE_ETCD__TIMEOUT_S="2")
        create_topic(broker.bootstrap, "t", 1)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(8):
            producer.produce("t", f"v{i}".encode())
        assert producer.flush(60) == 0
        committer = consumer(broker.bootstrap)  # the group is coordinated on this broker now
        committer.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
        committer.close()
        etcd_pid = etcd_server_private.pid
        assert etcd_pid is not None
        reader = consumer(broker.bootstrap)
        os.kill(etcd_pid, signal.SIGSTOP)  # past the 4-s session TTL: the session ends
        try:
            deadline = time.monotonic() + DEADLINE_S
            while "etcd session lost" not in broker.log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline, broker.tail()
                time.sleep(0.2)
            fetch = {
                "groups": [{"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}]}]
            }
            with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
                answer = wire.request(OFFSET_FETCH, 8, fetch)
            # A librdkafka consumer assigned the partition now asks for its committed offset
            # from the broker between sessions (the assignment's own OffsetFetch).
            reader.assign([TopicPartition("t", 0)])
            for _ in range(10):  # 5 s: the OffsetFetch goes out and is answered meanwhile
                reader.poll(0.5)
        finally:
            os.kill(etcd_pid, signal.SIGCONT)
        assert answer.groups[0].error_code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert not answer.groups[0].topics
        # Once the new session is up the broker coordinates the group again: the consumer's
        # retried OffsetFetch finds the committed offset and it reads on from there (answered
        # NOT_COORDINATOR, librdkafka never fetched the partition at all).
        try:
            assert values_read(reader, 3) == [b"v5", b"v6", b"v7"]
        finally:
            reader.close()
    finally:
        cluster.stop_all()
