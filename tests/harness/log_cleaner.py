"""Shared helpers of the log compaction tests (broker, proxy and Spark): compacted topics,
producing and consuming keyed rounds, waiting for a pass, and the records a cleaned log holds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentTP
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from harness.brokers import BrokerCluster
from harness.etcd import harness_etcd
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.protocol.batch_filter import iter_stored_batches
from kafscale.broker.storage.segments import decode_segment

CLEANER_ENV = {
    "KAFSCALE_LOG__CLEANER_INTERVAL_S": "0.3",
    "KAFSCALE_LOG__CLEANER_DELETE_DELAY_S": "1",
    "KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S": "0.5",
}
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
Record = tuple[int, bytes, bytes | None]  # offset, key, value


def partition_state(cluster: BrokerCluster, topic: str) -> PartitionState:
    async def read() -> PartitionState:
        etcd = await harness_etcd(cluster.etcd_url)
        try:
            entry = await etcd.get(keys.partition_state_key(cluster.cluster, topic, 0))
            assert entry is not None
            return PartitionState.from_json(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def cleaned_up_to(cluster: BrokerCluster, topic: str, upto: int) -> Any:
    """The state's ``cleaned`` once a pass reached ``upto`` (everything but the newest segment,
    once the produced rounds are all in)."""

    def reached() -> Any:
        cleaned = partition_state(cluster, topic).cleaned
        return cleaned if cleaned is not None and cleaned.upto >= upto else None

    # Generous: on a loaded machine (load average 10+) one run took over 30 s to see the pass.
    return eventually(reached, f"a pass up to {upto}", timeout_s=90.0)


def create_compacted(bootstrap: str, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact", "delete.retention.ms": "0", **configs}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def alter_topic(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def produce_rounds(
    bootstrap: str, topic: str, rounds: list[list[tuple[bytes, bytes | None]]]
) -> None:
    """Each round through its own producer (codecs in turn) and flushed alone: a segment each."""
    for index, records in enumerate(rounds):
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "compression.type": CODECS[index % len(CODECS)],
            }
        )
        for key, value in records:
            producer.produce(topic, key=key, value=value, partition=0)
        assert producer.flush(15) == 0
        time.sleep(0.1)  # the next round lands in a segment of its own


def consume(
    bootstrap: str, topic: str, start: int, end: int, limit: int | None = None
) -> list[Record]:
    """Records from ``start`` until the offset before ``end`` (or ``limit`` records)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([ConfluentTP(topic, 0, start)])
    found: list[Record] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            found.append((message.offset(), message.key(), message.value()))
            if message.offset() >= end - 1 or (limit is not None and len(found) >= limit):
                return found
        raise AssertionError(f"consumer stalled after {found[-1:] or 'nothing'} (end {end})")
    finally:
        consumer.close()


def latest_per_key(records: list[Record], upto: int, drop_tombstones: bool) -> list[Record]:
    """What a cleaned log holds: below ``upto`` each key's latest record there (tombstones gone
    if dropped), at and above it everything as written."""
    latest: dict[bytes, Record] = {}
    for record in records:
        if record[0] < upto:
            latest[record[1]] = record
    below = [r for r in latest.values() if not (drop_tombstones and r[2] is None)]
    return sorted(below) + [r for r in records if r[0] >= upto]


def produced_log(rounds: list[list[tuple[bytes, bytes | None]]]) -> list[Record]:
    records, offset = [], 0
    for round_ in rounds:
        for key, value in round_:
            records.append((offset, key, value))
            offset += 1
    return records


def keyed_rounds(count: int) -> list[list[tuple[bytes, bytes | None]]]:
    """Five keys updated every round; k3 deleted in round 2 for good, k2 deleted in round 1
    and written again; the last round (never cleaned: it is the newest segment) has k0 only."""
    rounds: list[list[tuple[bytes, bytes | None]]] = []
    for r in range(count):
        records: list[tuple[bytes, bytes | None]] = []
        for k in range(5):
            key = b"k%d" % k
            if k == 3 and r >= 2:
                if r == 2:
                    records.append((key, None))
                continue
            value = None if (k == 2 and r == 1) else b"%s-v%d" % (key, r)
            records.append((key, value))
        rounds.append(records)
    rounds.append([(b"k0", b"k0-last")])
    return rounds


def log_dir_size(bootstrap: str, topic: str) -> int:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        answer = admin.describe_log_dirs()
    finally:
        admin.close()
    return sum(
        p["partition_size"]
        for broker in answer
        for log_dir in broker["log_dirs"]
        for t in log_dir["topics"]
        if t["name"] == topic
        for p in t["partitions"]
    )


def txn_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(15)
    return producer


def in_transaction(
    producer: Producer, topic: str, records: list[tuple[bytes, bytes]], commit: bool
) -> None:
    producer.begin_transaction()
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    producer.flush(15)
    if commit:
        producer.commit_transaction(15)
    else:
        producer.abort_transaction(15)
    time.sleep(0.1)


def poll_all(bootstrap: str, topic: str, isolation: str, timeout_s: float = 60.0) -> list[Record]:
    """Every record a consumer gets from offset 0 to the partition's end: the high watermark,
    or the last stable offset under ``read_committed`` (``enable.partition.eof``). The records
    of a test are acknowledged before it reads, so the end covers them all; waiting for a
    quiet spell instead cost seconds per call."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([ConfluentTP(topic, 0, 0)])
    found: list[Record] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of {topic} in {timeout_s:g} s: {found}"
            message = consumer.poll(0.3)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return found
                raise KafkaException(message.error())
            found.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()


def stored_horizons(cluster: BrokerCluster, topic: str) -> list[int | None]:
    """The delete horizons of the batches in the current generation's cleaned objects."""
    state = partition_state(cluster, topic).cleaned
    assert state is not None
    marker = f"/0.cleaned/g{state.generation:010d}-e{state.epoch}/"
    s3 = cluster.s3.client()
    horizons: list[int | None] = []
    for key in sorted(
        k for k in cluster.object_keys(f"{cluster.cluster}/topics/{topic}/") if marker in k
    ):
        body = s3.get_object(Bucket=cluster.bucket, Key=key)["Body"].read()
        horizons += [
            b.header.delete_horizon_ms for b in iter_stored_batches(decode_segment(body).body)
        ]
    return horizons
