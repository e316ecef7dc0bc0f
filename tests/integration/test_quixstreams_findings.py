"""What Quix Streams' own suite (docs/client-suites.md, "Quix Streams") relies on a broker for,
done with plain confluent-kafka (the client Quix Streams is built on) against real brokers.

* Its TopicAdmin reports a refused topic by Kafka's message, and its suite matches it: an
  unknown topic config is INVALID_CONFIG with "Unknown topic config name: <name>" (we said
  "unknown ..."), on CreateTopics and on IncrementalAlterConfigs alike.
* The hardest path its suite runs: exactly-once processing (a transactional producer, offsets
  sent to the transaction, read_committed) whose state lives in a compacted changelog topic, and
  a fresh instance that restores it after a crash. The restore reads the changelog from its low
  watermark until the consumer's position reaches the high watermark; that position must step
  over the records of the aborted transaction the crash left and over the transaction markers
  (the "offset gaps" Quix Streams' recovery code is written for), or the restore never ends.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from harness.brokers import BrokerCluster
from harness.kafka_wire import FETCH, LIST_OFFSETS, KafkaWire, fetch_body, fetch_partition
from harness.proxy import start_proxy
from harness.topics import create_topic

pytestmark = pytest.mark.integration

INVALID_CONFIG = 40
OFFSET_OUT_OF_RANGE = 1
TXN_ENV = {"KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS": "200"}
INPUTS = 40  # records: keys k0..k3, partition i % 2 (k0, k2 on 0; k1, k3 on 1)
PARTITIONS = 2
BATCH = 5  # records per transaction (Quix Streams commits a checkpoint's worth)
DEADLINE_S = 60


def test_an_unknown_topic_config_is_refused_in_kafkas_words(
    broker_cluster: BrokerCluster,
) -> None:
    """Quix Streams' ``test_create_topics_invalid_config`` matches "Unknown topic config name"."""
    bootstrap = broker_cluster.start().bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"quix-{uuid.uuid4().hex[:8]}"
    future = admin.create_topics([NewTopic(topic, 1, 1, config={"bad_option": "not_real"})])
    with pytest.raises(KafkaException) as refused:
        future[topic].result(30)
    assert refused.value.args[0].code() == INVALID_CONFIG
    assert refused.value.args[0].str() == "Unknown topic config name: bad_option"

    create_topic(bootstrap, topic, 1)
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("bad_option", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([resource])[resource].result(30)
    assert refused.value.args[0].code() == INVALID_CONFIG
    assert "Unknown topic config name: bad_option" in refused.value.args[0].str()


@dataclass
class Topics:
    source: str
    sink: str
    changelog: str


@dataclass
class CounterApp:
    """A stateful exactly-once app as Quix Streams runs one: count records per key, emit the
    count, write it to the key's changelog partition, commit all of it with the input offsets
    in one transaction per batch."""

    bootstrap: str
    topics: Topics
    group: str
    transactional_id: str
    state: dict[bytes, int] = field(default_factory=dict)
    committed_state: dict[bytes, int] = field(default_factory=dict)
    processed: int = 0

    def __post_init__(self) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "partition.assignment.strategy": "range",
            }
        )
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": 60_000,
                "linger.ms": 5,
            }
        )
        # Fences an earlier instance with the same id and aborts the transaction it left open.
        self.producer.init_transactions(30)

    def next_batch(self) -> list[Message]:
        """Up to BATCH input records, subscribing on first use."""
        if not self.consumer.assignment():
            self.consumer.subscribe([self.topics.source])
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            batch = [m for m in self.consumer.consume(BATCH, 0.5) if not m.error()]
            if batch:
                return batch
        raise AssertionError(f"no input for {DEADLINE_S} s after {self.processed} records")

    def process(self, batch: list[Message]) -> None:
        """Produce the batch's outputs and changelog records inside an open transaction."""
        self.producer.begin_transaction()
        for message in batch:
            key = message.key()
            self.state[key] = self.state.get(key, 0) + 1
            count = b"%d" % self.state[key]
            self.producer.produce(self.topics.sink, count, key, partition=message.partition())
            self.producer.produce(self.topics.changelog, count, key, partition=message.partition())
        self.processed += len(batch)

    def commit(self) -> None:
        self.producer.send_offsets_to_transaction(
            self.consumer.position(self.consumer.assignment()),
            self.consumer.consumer_group_metadata(),
            30,
        )
        self.producer.commit_transaction(30)
        self.committed_state = dict(self.state)

    def run_until(self, processed: int) -> None:
        while self.processed < processed:
            self.process(self.next_batch())
            self.commit()


def restore(bootstrap: str, changelog: str) -> dict[bytes, int]:
    """Quix Streams' recovery: read each changelog partition read_committed from its low
    watermark until the consumer's position reaches the high watermark; the last value per key
    is the state (compaction would keep only those; KafScale keeps every record)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"restore-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(changelog, p), timeout=10)
            for p in range(PARTITIONS)
        }
        assert all(high > 0 for _, high in marks.values()), marks
        consumer.assign([TopicPartition(changelog, p, low) for p, (low, _) in marks.items()])
        state: dict[bytes, int] = {}
        deadline = time.monotonic() + DEADLINE_S
        positions: dict[int, int] = {}
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                state[message.key()] = int(message.value())
            assigned = [TopicPartition(changelog, p) for p in range(PARTITIONS)]
            positions = {tp.partition: tp.offset for tp in consumer.position(assigned)}
            if all(positions[p] >= high for p, (_, high) in marks.items()):
                return state
        raise AssertionError(f"restore stuck: positions {positions}, watermarks {marks}")
    finally:
        consumer.close()


def read_committed_values(bootstrap: str, topic: str, expect: int) -> list[tuple[bytes, int]]:
    """(key, count) of every committed record of ``topic``, in partition order, until
    ``expect`` arrived and then a quiet second (extra records would be seen too)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen: list[tuple[bytes, int]] = []
    deadline, quiet_until = time.monotonic() + DEADLINE_S, None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and not message.error():
                seen.append((message.key(), int(message.value())))
                if len(seen) >= expect and quiet_until is None:
                    quiet_until = time.monotonic() + 1.0
            elif quiet_until is not None and time.monotonic() > quiet_until:
                break
    finally:
        consumer.close()
    return seen


@pytest.fixture(params=["brokers", "proxy"])
def bootstrap(request: pytest.FixtureRequest, broker_cluster: BrokerCluster) -> Iterator[str]:
    """Two brokers (partitions, group and transaction coordinators spread over them), clients
    at the brokers or at the proxy in front of them."""
    broker_cluster.start(**TXN_ENV), broker_cluster.start(**TXN_ENV)
    if request.param == "proxy":
        yield start_proxy(broker_cluster).bootstrap
    else:
        yield broker_cluster.bootstrap


def test_exactly_once_counts_survive_a_crash_and_a_restore_from_the_changelog(
    bootstrap: str,
) -> None:
    run = uuid.uuid4().hex[:8]
    topics = Topics(f"quix-in-{run}", f"quix-out-{run}", f"changelog__quix-counts-{run}")
    create_topic(bootstrap, topics.source, PARTITIONS)
    create_topic(bootstrap, topics.sink, PARTITIONS)
    create_topic(bootstrap, topics.changelog, PARTITIONS, {"cleanup.policy": "compact"})
    keys = [b"k%d" % (i % 4) for i in range(INPUTS)]
    source = Producer({"bootstrap.servers": bootstrap})
    for i, key in enumerate(keys):
        source.produce(topics.source, b"v%d" % i, key, partition=i % PARTITIONS)
    assert source.flush(30) == 0

    first = CounterApp(bootstrap, topics, f"quix-app-{run}", f"quix-app-{run}")
    first.run_until(INPUTS // 2)
    # The crash: a batch processed, its outputs and changelog records written, never committed.
    first.process(first.next_batch())
    assert first.producer.flush(30) == 0
    first.consumer.close()

    second = CounterApp(bootstrap, topics, f"quix-app-{run}", f"quix-app-{run}")
    second.state = restore(bootstrap, topics.changelog)
    assert second.state == first.committed_state  # the aborted batch's counts are not in it
    second.processed = sum(second.state.values())
    second.run_until(INPUTS)
    second.consumer.close()
    assert second.producer.flush(30) == 0

    totals = Counter(keys)
    assert second.state == dict(totals)
    outputs = read_committed_values(bootstrap, topics.sink, INPUTS)
    for key, total in totals.items():
        # Each key's counts, once each and in order: no output of the aborted batch, none lost.
        assert [count for k, count in outputs if k == key] == list(range(1, total + 1)), key
    assert restore(bootstrap, topics.changelog) == dict(totals)


OFFSET_FETCH = 9


def _answers(bootstrap: str, topic: str, group: str) -> dict[str, object]:
    """What an endpoint answers to the requests a consumer sends when its group's committed
    offset (1) is below the partition's log start (6): the committed offset (OffsetFetch v8,
    require_stable as librdkafka sends it), both watermarks (ListOffsets v7), and a fetch at
    the committed offset (Fetch v12, a long poll)."""
    with KafkaWire(bootstrap) as wire:
        offset_fetch = {
            "groups": [{"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]}],
            "require_stable": True,
        }
        group_answer = wire.request(OFFSET_FETCH, 8, offset_fetch).groups[0]
        committed = group_answer.topics[0].partitions[0]
        watermarks = []
        for timestamp in (-2, -1):
            body = {
                "replica_id": -1,
                "isolation_level": 1,
                "topics": [
                    {"name": topic, "partitions": [{"partition_index": 0, "timestamp": timestamp}]}
                ],
            }
            found = wire.request(LIST_OFFSETS, 7, body).topics[0].partitions[0]
            watermarks.append((int(found.error_code), int(found.offset)))
        fetched = fetch_partition(wire.request(FETCH, 12, fetch_body(topic, 0, 1, max_wait_ms=500)))
    return {
        "group error": int(group_answer.error_code),
        "committed": (int(committed.error_code), int(committed.committed_offset)),
        "earliest, latest": watermarks,
        "fetch at 1": (
            int(fetched.error_code),
            int(fetched.high_watermark),
            int(fetched.last_stable_offset),
            int(fetched.log_start_offset),
            len(fetched.records or b""),
        ),
    }


def test_a_committed_offset_below_the_log_start_is_answered_alike_at_the_proxy_and_the_broker(
    broker_cluster: BrokerCluster,
) -> None:
    """Quix Streams' recovery test (committed offset below the log start after DeleteRecords)
    hung twice behind the proxy under load; the cause is a race inside librdkafka
    (docs/client-suites.md), but a client must not be able to tell the proxy from a broker:
    the same committed offset, watermarks and OFFSET_OUT_OF_RANGE fetch, at once."""
    broker = broker_cluster.start().bootstrap  # one broker: it owns the partition and group
    proxy = start_proxy(broker_cluster).bootstrap
    run = uuid.uuid4().hex[:8]
    topic, group = f"below-start-{run}", f"below-start-{run}"
    create_topic(broker, topic, 1)
    producer = Producer({"bootstrap.servers": broker})
    for i in range(50):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": broker})
    for future in admin.delete_records([TopicPartition(topic, 0, 6)]).values():
        future.result(timeout=30)
    consumer = Consumer({"bootstrap.servers": broker, "group.id": group})
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()

    at_broker = _answers(broker, topic, group)
    assert at_broker == {
        "group error": 0,
        "committed": (0, 1),
        "earliest, latest": [(0, 6), (0, 50)],
        "fetch at 1": (OFFSET_OUT_OF_RANGE, 50, 50, 6, 0),
    }
    assert _answers(proxy, topic, group) == at_broker
