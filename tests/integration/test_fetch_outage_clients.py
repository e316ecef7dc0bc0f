"""Consumers poll through an etcd outage that their Fetch meets, and then read every record.

A broker that does not own a partition reads its state from etcd for a Fetch at the end of the
log. With etcd away that read fails, and the broker answered REQUEST_TIMED_OUT for the
partition. The Java consumer does not expect that code in a Fetch: its
``FetchCollector.handleInitializeErrors`` threw IllegalStateException("Unexpected error code 7
while fetching at offset ...") out of the application's poll(); librdkafka handed the
application an error for it. The broker answers KAFKA_STORAGE_ERROR instead
(``protocol.errors.fetch_partition_code``), which both retry after a metadata refresh.

The consumers read from the partition's owner, which then hands it over (POST /drain): they
go on fetching from it, a non-owner now, at the end of the log, as consumers of a broker whose
partitions moved do until their metadata says otherwise.

A ShareFetch opening a share session meets the same outage when the owner checks the
share-partition's stored state; the Java share consumer's handling of the codes is the same
(``ShareFetchCollector``), so that test asserts the code on the wire.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from harness import children, share, topics
from harness.brokers import new_cluster
from harness.children import freeze
from harness.java_client import java_program
from harness.kafka_wire import (
    KafkaWire,
    fetch_body,
    fetch_partition,
    share_fetch,
    share_heartbeat,
)
from harness.log_cleaner import create_compacted, eventually
from harness.s3 import S3Endpoint
from harness.share import set_group_configs

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

JAVA_SOURCE = Path(__file__).parent / "java" / "OutageReader.java"
TOPIC = "outage"
BEFORE, AFTER = 20, 20  # records produced before the outage and after it
# etcd calls give up after 1 s (a fetch meets the outage quickly); the session lives 30 s, so
# the outage is an etcd that does not answer, not sessions lost.
ENV = {"KAFSCALE_ETCD__TIMEOUT_S": "1", "KAFSCALE_ETCD__SESSION_TTL_S": "30"}
OUTAGE_S = 5.0  # the consumers poll this long while etcd is stopped: several 1-s etcd timeouts
READ_MAX_S = 180.0  # a loaded machine's JVM start and reads; a reader that dies ends it sooner
FETCH = 1


class JavaReader:
    """``OutageReader`` (the official Java consumer's poll loop) in a child process; its
    stdout lines gathered by a thread."""

    def __init__(self, bootstrap: str, count: int) -> None:
        command = java_program(JAVA_SOURCE, "OutageReader")
        args = [bootstrap, TOPIC, "0", str(count), str(int(READ_MAX_S * 1000))]
        self.process = children.spawn([*command, *args], stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._gather, daemon=True)
        self._thread.start()

    def _gather(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def records(self) -> list[tuple[int, str]]:
        return [
            (int(offset), value)
            for offset, value in (
                line.split(" ", 2)[1:] for line in list(self.lines) if line.startswith("record ")
            )
        ]

    def errors(self) -> list[str]:
        return [line for line in list(self.lines) if line.startswith("error ")]

    def wait_for(self, count: int) -> None:
        """Until it read ``count`` records or ended (bounded)."""
        deadline = time.monotonic() + READ_MAX_S
        while len(self.records()) < count and self.process.poll() is None:
            assert time.monotonic() < deadline, f"the Java reader is stuck: {self.lines[-5:]}"
            time.sleep(0.1)
        self._thread.join(5)  # an ended reader's last lines

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)


def produce(bootstrap: str, offsets: range) -> None:
    failed: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in offsets:
        producer.produce(
            TOPIC, value=f"v{n}".encode(), partition=0, on_delivery=lambda e, _: failed.append(e)
        )
    assert producer.flush(60) == 0
    assert [e for e in failed if e is not None] == []


def poll(consumer: Consumer, read: list[Any], errors: list[Any], until: Any) -> None:
    """Poll as an application does, gathering records and the errors handed to it."""
    deadline = time.monotonic() + READ_MAX_S
    while not until() and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error() is not None:
            errors.append(message.error())
        else:
            read.append((message.offset(), message.value().decode()))


def test_consumers_poll_through_an_etcd_outage_a_fetch_meets_and_read_every_record(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    cluster = new_cluster(etcd_server_private.client_url, s3_server, tmp_path, "fo", extra_env=ENV)
    java = None
    consumer = None
    try:
        brokers = (cluster.start(), cluster.start())
        bootstrap = ",".join(b.bootstrap for b in brokers)
        create_compacted(brokers[0].bootstrap, TOPIC, **{"cleanup.policy": "delete"})
        produce(bootstrap, range(BEFORE))
        owner = eventually(
            lambda: next((b for b in brokers if f"{TOPIC}-0" in b.owned()), None), "an owner"
        )
        java = JavaReader(bootstrap, BEFORE + AFTER)
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"fo-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        read: list[tuple[int, str]] = []
        errors: list[Any] = []
        poll(consumer, read, errors, lambda: len(read) >= BEFORE)
        java.wait_for(BEFORE)
        assert len(read) == BEFORE and len(java.records()) == BEFORE, (read, java.lines)

        # The owner hands the partition over; both consumers go on fetching from it.
        assert owner.http("POST", "/drain")[0] == 200
        eventually(lambda: f"{TOPIC}-0" not in owner.owned(), "the owner let the partition go")
        pid = etcd_server_private.pid
        assert pid is not None
        freeze(pid)
        try:
            # A fixed time on purpose: the outage the consumers poll through.
            started = time.monotonic()
            poll(consumer, read, errors, lambda: time.monotonic() - started > OUTAGE_S)
            with KafkaWire(owner.bootstrap, timeout_s=60) as wire:
                answer = fetch_partition(wire.request(FETCH, 12, fetch_body(TOPIC, 0, BEFORE)))
                old = fetch_partition(wire.request(FETCH, 4, fetch_body(TOPIC, 0, BEFORE)))
        finally:
            os.kill(pid, signal.SIGCONT)
        # Neither application was handed an error; what they met, from the broker they
        # fetch from, was a storage error of that partition.
        assert java.errors() == []
        assert [str(e) for e in errors] == []
        assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR
        # Fetch v4 predates that code: NOT_LEADER_OR_FOLLOWER, as Kafka answers it.
        assert old.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER

        produce(bootstrap, range(BEFORE, BEFORE + AFTER))
        java.wait_for(BEFORE + AFTER)
        poll(consumer, read, errors, lambda: len(read) >= BEFORE + AFTER)
        expected = [(n, f"v{n}") for n in range(BEFORE + AFTER)]
        assert java.errors() == []
        assert java.records() == expected, java.lines[-5:]
        assert [str(e) for e in errors] == []
        assert read == expected
    finally:
        if consumer is not None:
            consumer.close()
        if java is not None:
            java.stop()
        cluster.stop_all()


def test_a_share_fetch_that_meets_etcd_away_gets_a_code_the_java_share_consumer_retries(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    """A member opening its share session makes the owner check the share-partition's stored
    state in etcd (an admin may have changed it). With etcd away that check answered
    REQUEST_TIMED_OUT for the partition, on which the Java share consumer's
    ``ShareFetchCollector.handleInitializeErrors`` throws IllegalStateException out of poll()
    (kafka-clients 4.3.0, as for a Fetch). It gets KAFKA_STORAGE_ERROR, which it retries."""
    cluster = new_cluster(etcd_server_private.client_url, s3_server, tmp_path, "fs", extra_env=ENV)
    try:
        broker = cluster.start()
        topics.create_topic(broker.bootstrap, TOPIC, 1)
        set_group_configs(broker.bootstrap, "g", {"share.auto.offset.reset": "earliest"})
        share.produce(broker.bootstrap, TOPIC, [b"v0", b"v1"])
        with KafkaWire(broker.bootstrap, timeout_s=60) as wire:
            joined = share_heartbeat(wire, "g", "a", 0, TOPIC)
            assert joined.error_code == ErrorCode.NONE, joined
            assert share_heartbeat(wire, "g", "b", 0, TOPIC).error_code == ErrorCode.NONE
            topic_id = joined.assignment.topic_partitions[0].topic_id
            first = share_fetch(wire, "g", "a", 0, topic_id)  # the share-partition is loaded
            assert first.responses[0].partitions[0].error_code == ErrorCode.NONE, first
            pid = etcd_server_private.pid
            assert pid is not None
            freeze(pid)
            try:
                answer = share_fetch(wire, "g", "b", 0, topic_id)
            finally:
                os.kill(pid, signal.SIGCONT)
        assert answer.error_code == ErrorCode.NONE, answer
        assert answer.responses[0].partitions[0].error_code == ErrorCode.KAFKA_STORAGE_ERROR
    finally:
        cluster.stop_all()
