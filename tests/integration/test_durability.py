"""Acked means durable: every acknowledged record survives the broker's death, and outages.

A broker is killed with SIGKILL (no flush, no handoff) or stopped with SIGTERM, and a new
broker process is started on the same cluster, bucket and port. Every record that was acked
(acks=all) must be readable at the offset it was acked with; producing continues at the next
offset with no gap; an idempotent producer that retries across the restart stores each record
exactly once. The same holds while etcd stops answering for longer than the broker's session
TTL, and while the object store refuses every connection for a while.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from harness import children
from harness.batches import make_batch
from harness.brokers import BrokerCluster, BrokerProcess, new_cluster
from harness.kafka_wire import (
    API_VERSIONS,
    FETCH,
    LIST_OFFSETS,
    PRODUCE,
    KafkaWire,
    batches_in,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
    while_leader_moves,
)
from harness.ports import closed_port, free_ports
from harness.read_back import Acked, read_everything
from harness.relayed_cluster import relayed_cluster
from harness.s3 import S3Endpoint, unique_bucket
from harness.s3_proxy import s3_proxy
from harness.topics import create_topic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition

from kafscale.broker.child_process import KAFSCALE
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.record_batch import read_header

pytestmark = pytest.mark.integration


class AckingProducer:
    """A confluent-kafka producer that records what was acked, and where."""

    def __init__(self, bootstrap: str, **config: Any) -> None:
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 200,
                "topic.metadata.refresh.interval.ms": 1000,
                **config,
            }
        )
        self.acked: Acked = {}
        self.failed: list[tuple[bytes, str]] = []
        self._lock = threading.Lock()

    def _report(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is None:
                key = (msg.partition(), msg.offset())
                assert key not in self.acked, f"offset {key} acked twice"
                self.acked[key] = msg.value()
            else:
                self.failed.append((msg.value(), str(err)))

    def send(self, topic: str, value: bytes, partition: int) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value=value, partition=partition, on_delivery=self._report
                )
                return
            except BufferError:
                self.producer.poll(0.1)

    def flush(self, timeout_s: float = 120) -> None:
        assert self.producer.flush(timeout_s) == 0, "records still undelivered"


def produce_batch(
    producer: AckingProducer, topic: str, prefix: str, count: int, partitions: int
) -> list[bytes]:
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    for i, value in enumerate(values):
        producer.send(topic, value, i % partitions)
    producer.flush()
    assert not producer.failed, producer.failed[:5]
    return values


def restart(
    broker_cluster: BrokerCluster, old: BrokerProcess, how: Callable[[], Any]
) -> BrokerProcess:
    how()
    assert old.process is not None and old.process.poll() is not None
    return broker_cluster.start(port=old.port)


def test_sigkill_restart_keeps_every_acked_record(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start()
    topic, partitions = "durable", 3
    create_topic(broker.bootstrap, topic, partitions)
    producer = AckingProducer(broker.bootstrap, **{"enable.idempotence": False})
    produce_batch(producer, topic, "before", 300, partitions)
    acked_before = dict(producer.acked)
    assert len(acked_before) == 300

    new = restart(broker_cluster, broker, broker.kill)
    assert read_everything(new.bootstrap, topic, partitions) == acked_before

    # offsets continue densely after the restart (read_everything checks density)
    produce_batch(producer, topic, "after", 60, partitions)
    everything = read_everything(new.bootstrap, topic, partitions)
    assert everything == producer.acked
    for p in range(partitions):
        in_order = [everything[(p, o)] for o in range(len([k for k in everything if k[0] == p]))]
        assert [v for v in in_order if v.startswith(b"before")] == [
            acked_before[(p, o)] for o in range(100)
        ]
        assert all(v.startswith(b"after") for v in in_order[100:])
        assert len(in_order) == 120


def test_restart_on_the_same_address_ends_the_dead_brokers_session_at_once(
    broker_cluster: BrokerCluster,
) -> None:
    """A broker restarted after SIGKILL takes over at once, not a session TTL later, and clients
    no longer see the dead broker's node id at its (now our) address."""
    long_ttl = {"KAFSCALE_ETCD__SESSION_TTL_S": "60"}  # its expiry would take a minute
    broker = broker_cluster.start(**long_ttl)
    topic, partitions = "restarted", 3
    create_topic(broker.bootstrap, topic, partitions)
    producer = AckingProducer(broker.bootstrap, **{"message.timeout.ms": 20_000})
    produce_batch(producer, topic, "before", 30, partitions)

    broker.kill()
    new = broker_cluster.start(port=broker.port, **long_ttl)
    assert new.node_id != broker.node_id
    admin = AdminClient({"bootstrap.servers": new.bootstrap})
    deadline = time.monotonic() + 15
    while set(admin.list_topics(timeout=10).brokers) != {new.node_id}:
        assert time.monotonic() < deadline, "the dead broker is still listed"
        time.sleep(0.2)
    produce_batch(producer, topic, "after", 30, partitions)  # within 20 s, not 60
    assert read_everything(new.bootstrap, topic, partitions) == producer.acked
    assert "gone; ending its session" in new.tail(200)


def test_sigterm_restart_keeps_every_acked_record(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start()
    topic, partitions = "graceful", 2
    create_topic(broker.bootstrap, topic, partitions)
    producer = AckingProducer(broker.bootstrap)
    produce_batch(producer, topic, "before", 100, partitions)

    returncodes = []
    new = restart(broker_cluster, broker, lambda: returncodes.append(broker.stop()))
    assert returncodes == [0], broker.tail()
    assert read_everything(new.bootstrap, topic, partitions) == producer.acked

    produce_batch(producer, topic, "after", 40, partitions)
    assert read_everything(new.bootstrap, topic, partitions) == producer.acked
    assert len(producer.acked) == 140


def test_sigterm_with_an_idle_client_connected_does_not_wait_for_the_grace_period(
    broker_cluster: BrokerCluster,
) -> None:
    """An idle connection has nothing in flight: the handoff should not sit out the grace
    period for it (generous bound: half of it), and shutdown leaves no traceback."""
    broker = broker_cluster.start(KAFSCALE_LIMITS__SHUTDOWN_GRACE_S="12")
    with KafkaWire(broker.bootstrap) as idle:
        assert int(idle.request(API_VERSIONS, 3, {}).error_code) == 0
        began = time.monotonic()
        assert broker.stop(timeout_s=60) == 0
        took_s = time.monotonic() - began
    assert "Traceback" not in broker.tail(200), broker.tail(40)
    assert took_s < 6, f"SIGTERM took {took_s:.1f}s with one idle client connected"


def test_sigkill_while_producing_loses_no_acked_record(broker_cluster: BrokerCluster) -> None:
    """Records acked up to the kill, and those the producer retried after it, are all there,
    at the offsets they were acked with; the idempotent producer stores none twice."""
    broker = broker_cluster.start()
    topic, partitions, total = "busy", 2, 2000
    create_topic(broker.bootstrap, topic, partitions)
    producer = AckingProducer(broker.bootstrap, **{"enable.idempotence": True})
    new = produce_while(
        lambda: restart(broker_cluster, broker, broker.kill), producer, topic, total, partitions
    )
    assert_stored_once_in_order(new.bootstrap, topic, producer, total, partitions)


def _pattern(partition: int, index: int) -> bytes:
    """4 KiB that differ from record to record, so a stale byte from an earlier segment shows."""
    return hashlib.blake2b(b"%d-%d" % (partition, index)).digest() * 64


def test_segments_built_in_reused_buffers_hold_what_was_acked(
    broker_cluster: BrokerCluster,
) -> None:
    """With a cache small enough to evict, the broker builds new segments in the buffers of
    evicted ones (``broker/buffer_pool.py``) while a consumer tails the topic, reading
    slices of segments as they are evicted, and receives the producer's requests into reused
    frame buffers. Every acked record reads back intact, both while producing (from the cache)
    and afterwards (mostly from S3, uploaded from reused buffers)."""
    broker = broker_cluster.start(
        KAFSCALE_LOG__CACHE_BYTES=str(8 << 20), KAFSCALE_LOG__SEGMENT_BYTES=str(2 << 20)
    )
    topic, partitions, per_partition = "reused-buffers", 2, 6000  # 47 MiB in ~2 MiB segments
    create_topic(broker.bootstrap, topic, partitions)
    tailed: Acked = {}
    stop = threading.Event()

    def tail() -> None:
        consumer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "tail", "fetch.wait.max.ms": 50}
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        try:
            while not stop.is_set():
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    tailed[(message.partition(), message.offset())] = message.value()
        finally:
            consumer.close()

    tailer = threading.Thread(target=tail)
    tailer.start()
    try:
        producer = AckingProducer(broker.bootstrap)
        for index in range(per_partition):
            for partition in range(partitions):
                producer.send(topic, _pattern(partition, index), partition)
            producer.producer.poll(0)
        producer.flush()
        assert not producer.failed, producer.failed[:3]
        deadline = time.monotonic() + 60
        while len(tailed) < len(producer.acked) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        tailer.join(30)
    status = broker.status()
    assert status["segment_cache"]["buffers_reused"] > 0
    assert status["request_frames"]["buffers_reused"] > 0
    assert tailed == producer.acked
    assert read_everything(broker.bootstrap, topic, partitions) == producer.acked
    expected = {_pattern(p, i) for p in range(partitions) for i in range(per_partition)}
    assert set(producer.acked.values()) == expected


# --- outages of etcd and of the object store while producing ----------------------------------


T = TypeVar("T")


def produce_while(
    action: Callable[[], T], producer: AckingProducer, topic: str, total: int, partitions: int
) -> T:
    """Produce ``total`` records steadily, round robin over the partitions; after the first 200
    acks run ``action`` (a kill, an outage); return its result once every record is delivered."""

    def produce_steadily() -> None:
        for i in range(total):
            producer.send(topic, f"r-{i}".encode(), i % partitions)
            producer.producer.poll(0)
            time.sleep(0.002)
        producer.flush(180)

    thread = threading.Thread(target=produce_steadily)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(producer.acked) < 200 and time.monotonic() < deadline:
            time.sleep(0.01)
        acked_before = len(producer.acked)
        result = action()
    finally:
        thread.join(240)
    assert not thread.is_alive()
    assert 200 <= acked_before < total, "the action did not happen while producing"
    return result


def assert_stored_once_in_order(
    bootstrap: str, topic: str, producer: AckingProducer, total: int, partitions: int
) -> None:
    """Every record acked, at the offset it was acked with, none twice, in send order."""
    assert not producer.failed, producer.failed[:5]
    assert len(producer.acked) == total
    stored = read_everything(bootstrap, topic, partitions)
    assert stored == producer.acked
    assert sorted(stored.values()) == sorted(f"r-{i}".encode() for i in range(total))
    for p in range(partitions):  # one producer, one partition: order is the send order
        values = [stored[(p, o)] for o in range(total // partitions)]
        assert values == [f"r-{i}".encode() for i in range(p, total, partitions)]


def test_etcd_paused_past_the_session_ttl_loses_no_acked_record(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """etcd stops answering (SIGSTOP) for 6 s, past the broker's 4-s session TTL: the broker
    gives its partitions up, its session ends, and once etcd is back it registers again and takes
    them back. Nothing acked is lost, the idempotent producer's retries are stored once."""
    cluster = new_cluster(
        etcd_server_private.client_url, s3_server, tmp_path, "o", name=cluster_name
    )
    try:
        broker = cluster.start(KAFSCALE_ETCD__TIMEOUT_S="2")
        create_topic(broker.bootstrap, "through-etcd", 2)
        producer = AckingProducer(broker.bootstrap, **{"enable.idempotence": True})
        etcd_pid = etcd_server_private.pid
        assert etcd_pid is not None

        def pause_etcd() -> None:
            children.freeze(etcd_pid)  # 6 s from when it stopped answering, not from the signal
            try:
                time.sleep(6)
            finally:
                os.kill(etcd_pid, signal.SIGCONT)

        produce_while(pause_etcd, producer, "through-etcd", 2000, 2)
        assert broker.process is not None and broker.process.poll() is None, broker.tail()
        assert "etcd session lost" in broker.log_path.read_text(errors="replace")
        assert_stored_once_in_order(broker.bootstrap, "through-etcd", producer, 2000, 2)
    finally:
        cluster.stop_all()


def test_a_commit_etcd_answers_late_is_acked_once_and_stored_once(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> None:
    """etcd applies a flush commit but its answer comes after the broker's 1-s deadline (a
    broker frozen, a slow link). The record is stored, so the producer must hear success at its
    offset, not REQUEST_TIMED_OUT: a producer told "timed out" sends it again (a duplicate),
    and an idempotent one that then meets a sequence gap sends it again as new."""
    with relayed_cluster(
        etcd_server, s3_server, tmp_path, cluster_name, "late", KAFSCALE_ETCD__SESSION_TTL_S="10"
    ) as held:
        broker = held.broker
        create_topic(broker.bootstrap, "late-answers", 1)
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0)
        try:
            assert producer.send("late-answers", b"before").get(30).offset == 0
            with held.relay.holding_replies():
                late = producer.send("late-answers", b"answered late")
                time.sleep(3)  # the commit's first answer, and the next tries', come too late
                assert not late.is_done
            assert late.get(30).offset == 1
            assert producer.send("late-answers", b"after").get(30).offset == 2
        finally:
            producer.close()
        stored = read_everything(broker.bootstrap, "late-answers", 1)
        assert stored == {(0, 0): b"before", (0, 1): b"answered late", (0, 2): b"after"}
        assert held.log_says("asking again")


def test_object_store_unreachable_for_a_while_loses_no_acked_record(
    broker_cluster: BrokerCluster,
) -> None:
    """Every connection to S3 is refused for 6 s: uploads fail, nothing is acked meanwhile, the
    broker gives up and takes back its partitions, and the producer's retries land once."""
    with s3_proxy(broker_cluster.s3.url) as proxy:
        broker = broker_cluster.start(KAFSCALE_STORAGE__ENDPOINT=proxy.url)
        create_topic(broker.bootstrap, "through-s3", 2)
        producer = AckingProducer(broker.bootstrap, **{"enable.idempotence": True})

        def refuse_s3() -> None:
            proxy.refuse = True
            try:
                time.sleep(6)
            finally:
                proxy.refuse = False

        produce_while(refuse_s3, producer, "through-s3", 2000, 2)
        assert broker.process is not None and broker.process.poll() is None, broker.tail()
        assert "segment upload failed" in broker.log_path.read_text(errors="replace")
        assert_stored_once_in_order(broker.bootstrap, "through-s3", producer, 2000, 2)


# --- idempotence state survives the restart (raw wire, exact sequences) ----------------------

PRODUCER_ID, PRODUCER_EPOCH = 4242, 0


def _idempotent_batch(sequence: int, records: int = 2) -> bytes:
    return make_batch(
        0,
        [f"seq-{sequence + i}".encode() for i in range(records)],
        producer_id=PRODUCER_ID,
        producer_epoch=PRODUCER_EPOCH,
        base_sequence=sequence,
    )


def _high_watermark(wire: KafkaWire, topic: str) -> int:
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    response = wire.request(LIST_OFFSETS, 7, body)
    partition = response.topics[0].partitions[0]
    assert int(partition.error_code) == 0
    return int(partition.offset)


def _produce_until_leader(wire: KafkaWire, topic: str, batch: bytes) -> tuple[int, int]:
    """Retry like a client while the killed broker's lease expires."""
    return while_leader_moves(
        lambda: produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, batch)))
    )


def test_retried_batch_after_restart_is_acked_once_and_stored_once(
    broker_cluster: BrokerCluster,
) -> None:
    """Five in-flight batches of one idempotent producer are committed, the broker dies
    before the producer hears back; the producer retries all five against the new broker.
    Each must be answered with its original offset (Kafka remembers the last five batches per
    producer), and nothing may be stored twice."""
    broker = broker_cluster.start()
    topic = "idempotent"
    create_topic(broker.bootstrap, topic, 1)
    batches = [_idempotent_batch(2 * i) for i in range(5)]
    with KafkaWire(broker.bootstrap) as wire:
        first = [
            produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, b))) for b in batches
        ]
    assert first == [(0, 2 * i) for i in range(5)]

    new = restart(broker_cluster, broker, broker.kill)
    with KafkaWire(new.bootstrap) as wire:
        retried = [_produce_until_leader(wire, topic, b) for b in batches]
        assert _high_watermark(wire, topic) == 10
        # the next sequence continues the log
        assert _produce_until_leader(wire, topic, _idempotent_batch(10)) == (0, 10)
        response = wire.request(FETCH, 12, fetch_body(topic, 0, 0))
    assert retried == first
    stored = batches_in(fetch_partition(response).records)
    assert [(b.base_offset, b.base_sequence) for b in stored] == [(2 * i, 2 * i) for i in range(6)]


def test_last_batch_retried_after_restart_is_a_duplicate(broker_cluster: BrokerCluster) -> None:
    """The newest batch of a producer, retried against the restarted broker, is acked with its
    original offset and not appended again; an out-of-order sequence is refused (45)."""
    broker = broker_cluster.start()
    topic = "idempotent-last"
    create_topic(broker.bootstrap, topic, 1)
    with KafkaWire(broker.bootstrap) as wire:
        assert produce_partition(
            wire.request(PRODUCE, 9, produce_body(topic, 0, _idempotent_batch(0)))
        ) == (0, 0)
        assert produce_partition(
            wire.request(PRODUCE, 9, produce_body(topic, 0, _idempotent_batch(2)))
        ) == (0, 2)

    new = restart(broker_cluster, broker, broker.kill)
    with KafkaWire(new.bootstrap) as wire:
        assert _produce_until_leader(wire, topic, _idempotent_batch(2)) == (0, 2)
        assert _high_watermark(wire, topic) == 4
        code, _ = _produce_until_leader(wire, topic, _idempotent_batch(7))
        assert code == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        assert _produce_until_leader(wire, topic, _idempotent_batch(4)) == (0, 4)
        assert _high_watermark(wire, topic) == 6


def test_retry_of_a_batch_still_uploading_is_acked_once_it_is_durable(
    broker_cluster: BrokerCluster,
) -> None:
    """A produce times out while its segment upload is slow (the proxy holds the PUT for 3 s),
    and the producer retries the batch. The retry must be answered only once the first attempt
    is committed, with its offset and, in a LogAppendTime topic, its append time: an ack sent at
    once would ack data that the upload could still lose."""
    with s3_proxy(broker_cluster.s3.url, delay_s=3.0) as proxy:
        broker = broker_cluster.start(KAFSCALE_STORAGE__ENDPOINT=proxy.url)
        topic = "retried-while-uploading"
        create_topic(broker.bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
        proxy.hold = re.compile(rf"/topics/{topic}/.*\.kfs")
        batch = _idempotent_batch(0)
        with KafkaWire(broker.bootstrap) as wire:
            impatient = produce_body(topic, 0, batch) | {"timeout": 300}
            assert produce_partition(wire.request(PRODUCE, 9, impatient)) == (7, -1)  # timed out
            assert proxy.held, "the segment upload had not started"
            retried = wire.request(PRODUCE, 9, produce_body(topic, 0, batch))
            high_watermark = _high_watermark(wire, topic)  # asked right after the ack
            response = wire.request(FETCH, 12, fetch_body(topic, 0, 0))
    assert produce_partition(retried) == (0, 0)
    assert high_watermark == 2, "the retry was acked before the first attempt was committed"
    records = fetch_partition(response).records
    assert [b.base_offset for b in batches_in(records)] == [0]  # stored once
    append_time = retried.responses[0].partition_responses[0].log_append_time
    assert codec.millis(append_time) == read_header(records).max_timestamp


def _padded(offset: int) -> bytes:
    return f"offset-{offset}|".encode() + bytes((offset + n) % 251 for n in range(200))


def test_old_segments_are_read_through_the_index_after_restart(
    broker_cluster: BrokerCluster,
) -> None:
    """More segments than the partition state lists as recent, each with several batches and
    index entries; after a SIGKILL the new broker runs without a cache, so every read is a
    listing plus a ranged GET located through an index. Any offset reads back correctly."""
    broker = broker_cluster.start(
        KAFSCALE_LOG__INDEX_INTERVAL_BYTES="1024", KAFSCALE_LOG__INDEX_MIN_SEGMENT_BYTES="0"
    )
    topic, rounds, batches_per_round, records_per_batch = "old-segments", 40, 5, 2
    create_topic(broker.bootstrap, topic, 1)
    offset = 0
    with KafkaWire(broker.bootstrap) as wire:
        for _ in range(rounds):
            sent = []
            for _ in range(batches_per_round):  # pipelined: one flush, one multi-batch segment
                values = [_padded(offset + i) for i in range(records_per_batch)]
                sent.append(wire.send(PRODUCE, 9, produce_body(topic, 0, make_batch(0, values))))
                offset += records_per_batch
            for correlation_id in sent:
                received, response = wire.recv(PRODUCE, 9)
                assert received == correlation_id
                assert produce_partition(response)[0] == 0
    total = offset

    broker.kill()
    new = broker_cluster.start(port=broker.port, KAFSCALE_LOG__CACHE_BYTES="0")
    consumer = KafkaConsumer(bootstrap_servers=new.bootstrap, group_id=None, max_poll_records=50)
    tp = KpTopicPartition(topic, 0)
    try:
        consumer.assign([tp])
        for start in (0, 1, 7, 133, 250, total - 3):  # batch starts and middles, old and new
            consumer.seek(tp, start)
            got: list[tuple[int, bytes]] = []
            deadline = time.monotonic() + 30
            while len(got) < min(25, total - start) and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=500).values():
                    got += [(r.offset, r.value) for r in records]
            expected = [(o, _padded(o)) for o in range(start, min(start + 25, total))]
            assert got[: len(expected)] == expected, f"reading from {start}"
    finally:
        consumer.close()
    with KafkaWire(new.bootstrap) as wire:  # small fetches walk segment by segment
        position, seen = 0, 0
        while position < total:
            response = wire.request(FETCH, 12, fetch_body(topic, 0, position, max_bytes=700))
            batches = batches_in(fetch_partition(response).records)
            assert batches and batches[0].base_offset <= position, position
            for batch in batches:
                assert batch.base_offset == seen
                seen += batch.record_count
            position = seen
        assert seen == total
        # one large fetch spans segments (each holds 10 records here)
        response = wire.request(FETCH, 12, fetch_body(topic, 0, 0, max_bytes=1 << 20))
        batches = batches_in(fetch_partition(response).records)
        assert sum(b.record_count for b in batches) > records_per_batch * batches_per_round
        assert [b.base_offset for b in batches] == list(range(0, 2 * len(batches), 2))


def test_fetch_beyond_the_high_watermark_after_restart_is_out_of_range(
    broker_cluster: BrokerCluster,
) -> None:
    """After a restart, a fetch past the high watermark answers OFFSET_OUT_OF_RANGE (1)."""
    broker = broker_cluster.start()
    topic = "range"
    create_topic(broker.bootstrap, topic, 1)
    producer = AckingProducer(broker.bootstrap)
    produce_batch(producer, topic, "x", 5, 1)
    new = restart(broker_cluster, broker, broker.kill)
    with KafkaWire(new.bootstrap) as wire:
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 50)))
        assert int(partition.error_code) == 1
        assert int(partition.high_watermark) in (-1, 5)
        partition = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 3)))
        assert int(partition.error_code) == 0
        assert next(b.base_offset for b in batches_in(partition.records)) <= 3


# --- fail closed: no etcd or no bucket is an error, never an in-memory fallback ---------------


def _run_broker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return children.run([KAFSCALE, "broker"], env=env, capture_output=True, text=True, timeout=120)


def test_a_broker_started_just_before_its_etcd_waits_for_it(
    broker_cluster: BrokerCluster, tmp_path: Path
) -> None:
    """A managed etcd and new broker pods start together: a broker that finds etcd not yet
    answering tries again for a few seconds before it gives up."""
    etcd = EmbeddedEtcd(data_dir=tmp_path / "late-etcd", die_with_parent=True)
    port, admin_port = free_ports(2, avoid=(etcd.client_port, etcd.peer_port))
    log = tmp_path / "broker.log"
    env = broker_cluster.env(
        port,
        admin_port,
        KAFSCALE_ETCD__ENDPOINTS=json.dumps([etcd.client_url]),
        KAFSCALE_ETCD__TIMEOUT_S="2",
    )
    with log.open("wb") as out:
        broker = children.spawn([KAFSCALE, "broker"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while "etcd not reachable yet" not in log.read_text(errors="replace"):
            assert broker.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "no failed attempt seen"
            time.sleep(0.1)
        etcd.start()  # after the broker's first attempt failed
        while True:
            assert broker.poll() is None, log.read_text(errors="replace")[-2000:]
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the broker never listened"
            time.sleep(0.2)
    finally:
        broker.terminate()
        broker.wait(30)
        etcd.stop()


@pytest.mark.parametrize(
    ("what", "overrides", "words"),
    [
        (
            "unreachable etcd",
            {"KAFSCALE_ETCD__ENDPOINTS": "UNREACHABLE_ETCD", "KAFSCALE_ETCD__TIMEOUT_S": "2"},
            ("etcd",),
        ),
        ("missing bucket", {"KAFSCALE_STORAGE__BUCKET": "MISSING_BUCKET"}, ("MISSING_BUCKET",)),
        (
            "unreachable object store",
            {"KAFSCALE_STORAGE__ENDPOINT": "UNREACHABLE_S3", "KAFSCALE_STORAGE__TIMEOUT_S": "3"},
            ("object storage",),
        ),
    ],
    ids=["unreachable-etcd", "missing-bucket", "unreachable-s3"],
)
def test_broker_refuses_to_start_without_its_dependencies(
    broker_cluster: BrokerCluster, what: str, overrides: dict[str, str], words: tuple[str, ...]
) -> None:
    missing_bucket = unique_bucket("missing")
    dead_port = closed_port()  # on purpose: nothing listens there
    substitutions = {
        "UNREACHABLE_ETCD": json.dumps([f"http://127.0.0.1:{dead_port}"]),
        "MISSING_BUCKET": missing_bucket,
        "UNREACHABLE_S3": f"http://127.0.0.1:{dead_port}",
    }
    resolved = {k: substitutions.get(v, v) for k, v in overrides.items()}
    words = tuple(substitutions.get(w, w) for w in words)
    port, admin_port = free_ports(2)
    result = _run_broker(broker_cluster.env(port, admin_port, **resolved))
    assert result.returncode != 0, f"{what}: the broker started anyway"
    message = result.stderr
    assert "cannot start" in message, message[-2000:]
    for word in words:
        assert word in message, f"{what}: {word!r} not in:\n{message[-2000:]}"
    assert "Traceback" not in message, f"{what}: a traceback instead of a message"
    with socket.socket() as sock:  # and it never listened
        assert sock.connect_ex(("127.0.0.1", port)) != 0
