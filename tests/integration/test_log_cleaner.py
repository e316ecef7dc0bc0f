"""Log compaction end to end: real brokers on moto S3 and etcd, real clients.

A compacted topic keeps each key's latest record (Kafka's log cleaner): after a pass, a consumer
from the beginning gets exactly that, at the records' original offsets, and never stalls on the
offsets cleaned away; a consumer that was part-way through keeps going. On the old main nothing
is ever cleaned, so every one of these fails there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
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

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.partition_state import PartitionState

pytestmark = pytest.mark.integration

CLEANER_ENV = {
    "KAFSCALE_LOG__CLEANER_INTERVAL_S": "0.3",
    "KAFSCALE_LOG__CLEANER_DELETE_DELAY_S": "1",
    "KAFSCALE_LOG__RETENTION_CHECK_INTERVAL_S": "0.5",
}
CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
Record = tuple[int, bytes, bytes | None]  # offset, key, value


def partition_state(cluster: BrokerCluster, topic: str) -> PartitionState:
    async def read() -> PartitionState:
        etcd = await Etcd.connect([cluster.etcd_url], timeout_s=5)
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
    raise AssertionError(f"timed out waiting for {what}")


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


def first_offset_at_or_after(bootstrap: str, topic: str, timestamp_ms: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    try:
        (found,) = consumer.offsets_for_times([ConfluentTP(topic, 0, timestamp_ms)], timeout=10)
        return int(found.offset)
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


def test_a_consumer_gets_each_keys_latest_value_at_its_original_offset(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "compacted"
    create_compacted(broker.bootstrap, topic, **{"min.cleanable.dirty.ratio": "1.5"})
    rounds = keyed_rounds(10)
    produce_rounds(broker.bootstrap, topic, rounds)
    written = produced_log(rounds)
    hw = len(written)
    # A consumer reads part-way before anything is cleaned (a ratio over 1 never cleans) ...
    early = consume(broker.bootstrap, topic, 0, hw, limit=12)
    assert early == written[:12]
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    state = cleaned_up_to(broker_cluster, topic, hw - 1)
    upto = state.upto
    # ... and goes on from there after the pass: no error, the latest values from there on.
    rest = consume(broker.bootstrap, topic, early[-1][0] + 1, hw)
    expected = latest_per_key(written, upto, drop_tombstones=False)
    assert rest == [r for r in expected if r[0] > early[-1][0]]
    # From the beginning: each key once below upto, at its original offset.
    assert consume(broker.bootstrap, topic, 0, hw) == expected
    # ListOffsets by timestamp: the first record at or after it was cleaned away; the answer is
    # the next kept record, as Kafka answers.
    assert first_offset_at_or_after(broker.bootstrap, topic, 0) == expected[0][0] > 0
    keys_below = [r[1] for r in expected if r[0] < upto]
    assert len(keys_below) == len(set(keys_below))
    # k3's tombstone stays though delete.retention.ms (0) has passed since its write: its
    # clock starts at this first pass (KIP-534), which gave its batch a delete horizon.
    assert (b"k3", None) in [r[1:] for r in expected if r[0] < upto]
    # The superseded plain segments go after the delay; readers keep working.
    plain = f"{broker_cluster.cluster}/topics/{topic}/"

    def superseded_gone() -> bool:
        listed = broker_cluster.object_keys(plain)
        return all("/0.cleaned/" in k or _base(k) >= upto for k in listed if k.endswith(".kfs"))

    eventually(superseded_gone, "superseded segments deleted")
    assert consume(broker.bootstrap, topic, 0, hw) == expected


def _base(key: str) -> int:
    return int(key.rsplit("/", 1)[-1].split("-", 1)[0])


def test_kafka_python_reads_a_cleaned_topic_and_tombstones_stay_within_delete_retention(
    broker_cluster: BrokerCluster,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaTP

    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "kept-tombstones"
    create_compacted(
        broker.bootstrap,
        topic,
        **{"min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "3600000"},
    )
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    written: list[Record] = []
    offset = 0
    for r in range(6):
        for k in range(3):
            value = None if (k == 1 and r == 4) else b"v%d" % r
            producer.send(topic, key=b"k%d" % k, value=value, partition=0)
            written.append((offset, b"k%d" % k, value))
            offset += 1
        producer.flush(10)
        time.sleep(0.1)
    producer.close(5)
    state = cleaned_up_to(broker_cluster, topic, offset - 3)
    expected = latest_per_key(written, state.upto, drop_tombstones=False)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    consumer.assign([KafkaTP(topic, 0)])
    consumer.seek_to_beginning()
    got: list[Record] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not got or got[-1][0] < offset - 1):
        for batch in consumer.poll(500).values():
            got += [(m.offset, m.key, m.value) for m in batch]
    consumer.close()
    assert got == expected
    assert (b"k1", None) in [(r[1], r[2]) for r in got if r[0] < state.upto]  # young tombstone


def test_null_keys_are_refused_by_a_compacted_topic(broker_cluster: BrokerCluster) -> None:
    """Kafka refuses a keyless record on a compacted topic with INVALID_RECORD (87): the batch
    holding it is not appended; keyed batches are."""
    broker = broker_cluster.start(**CLEANER_ENV)
    create_compacted(broker.bootstrap, "needs-keys")
    outcomes: list[Any] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.send.max.retries": 0})
    producer.produce(
        "needs-keys",
        value=b"no key",
        partition=0,
        on_delivery=lambda error, _: outcomes.append(error),
    )
    producer.flush(10)
    producer.produce("needs-keys", key=b"k", value=b"keyed", partition=0)
    assert producer.flush(10) == 0
    assert len(outcomes) == 1 and outcomes[0] is not None
    assert outcomes[0].code() == 87  # INVALID_RECORD
    assert consume(broker.bootstrap, "needs-keys", 0, 1) == [(0, b"k", b"keyed")]


def test_a_crashed_pass_loses_nothing_and_its_orphans_are_deleted(
    broker_cluster: BrokerCluster,
) -> None:
    """A pass that uploaded its objects and died before its commit (planted here: a pass prefix
    under the killed owner's epoch with one garbage object) changes nothing: after a SIGKILL the
    new owner serves the committed generation, its own pass succeeds and the orphans go."""
    first = broker_cluster.start(**CLEANER_ENV)
    topic = "crash"
    # Tombstones stay (a long delete.retention.ms): which pass removes one would depend on how
    # passes fall between the rounds.
    create_compacted(
        first.bootstrap,
        topic,
        **{"min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "3600000"},
    )
    rounds = keyed_rounds(6)
    produce_rounds(first.bootstrap, topic, rounds)
    written = produced_log(rounds)
    cleaned_up_to(broker_cluster, topic, len(written) - 1)
    first.kill()
    info = partition_state(broker_cluster, topic)
    state = info.cleaned
    assert state is not None
    topic_id = _topic_id(broker_cluster, topic)
    orphan_prefix = keys.cleaned_pass_prefix(
        broker_cluster.cluster, topic, topic_id, 0, state.generation + 1, info.leader_epoch
    )
    orphan = keys.cleaned_object_key(orphan_prefix, 0)
    broker_cluster.s3.client().put_object(Bucket=broker_cluster.bucket, Key=orphan, Body=b"junk")
    second = broker_cluster.start(**CLEANER_ENV)
    assert consume(second.bootstrap, topic, 0, len(written)) == latest_per_key(
        written, state.upto, drop_tombstones=False
    )
    more = keyed_rounds(3)
    produce_rounds(second.bootstrap, topic, more)
    everything = written + [(len(written) + o, k, v) for o, k, v in produced_log(more)]

    later = cleaned_up_to(broker_cluster, topic, len(everything) - 1)
    assert later.generation > state.generation
    assert later.epoch > info.leader_epoch
    assert consume(second.bootstrap, topic, 0, len(everything)) == latest_per_key(
        everything, later.upto, drop_tombstones=False
    )
    eventually(lambda: orphan not in broker_cluster.object_keys(orphan_prefix), "orphan deleted")


def test_what_an_owner_killed_right_after_its_commit_left_is_deleted_by_the_next_owner(
    broker_cluster: BrokerCluster,
) -> None:
    """Fails on the old main: only the pass that superseded objects deleted them, after
    ``log.cleaner_delete_delay_s``; an owner SIGKILLed within that delay left the superseded
    plain segments (and older generations) in the bucket for good. The next owner finds them
    and deletes them after the delay, and readers keep getting each key's latest."""
    first = broker_cluster.start(
        **{**CLEANER_ENV, "KAFSCALE_LOG__CLEANER_DELETE_DELAY_S": "3600"}  # never before the kill
    )
    topic = "leftovers"
    create_compacted(first.bootstrap, topic, **{"min.cleanable.dirty.ratio": "0.01"})
    rounds = keyed_rounds(6)
    produce_rounds(first.bootstrap, topic, rounds)
    written = produced_log(rounds)
    cleaned_up_to(broker_cluster, topic, len(written) - 1)
    first.kill()
    prefix = f"{broker_cluster.cluster}/topics/{topic}/"

    def leftovers() -> list[str]:
        cleaned = partition_state(broker_cluster, topic).cleaned
        assert cleaned is not None
        committed = f"/0.cleaned/g{cleaned.generation:010d}-e{cleaned.epoch}/"
        return [
            k
            for k in broker_cluster.object_keys(prefix)
            if committed not in k and ("/0.cleaned/" in k or _base(k) < cleaned.upto)
        ]

    assert leftovers()  # the superseded plain segments at least
    second = broker_cluster.start(**CLEANER_ENV)
    eventually(lambda: not leftovers(), "leftovers deleted by the next owner", timeout_s=120.0)
    state = partition_state(broker_cluster, topic).cleaned
    assert state is not None
    assert consume(second.bootstrap, topic, 0, len(written)) == latest_per_key(
        written, state.upto, drop_tombstones=True
    )


def _topic_id(cluster: BrokerCluster, topic: str) -> str:
    listed = cluster.object_keys(f"{cluster.cluster}/topics/{topic}/")
    return listed[0].split("/")[3]


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


def test_many_updates_to_few_keys_stop_growing_the_stored_bytes(
    broker_cluster: BrokerCluster,
) -> None:
    """The point of compaction: a topic of few keys updated often (Connect's offsets topic, a
    changelog) is bounded by its keys, not its history; DescribeLogDirs reports the shrink."""
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "few-keys"
    create_compacted(broker.bootstrap, topic, **{"min.cleanable.dirty.ratio": "1.5"})
    rounds = [[(b"k%d" % k, b"%d" % r * 300) for k in range(4)] for r in range(20)]
    produce_rounds(broker.bootstrap, topic, rounds)
    # Waits as generous as the pass's: one run at load average ~19 failed here within 30 s.
    before = eventually(lambda: log_dir_size(broker.bootstrap, topic), "a size", timeout_s=90)
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    cleaned_up_to(broker_cluster, topic, 76)
    after = eventually(
        lambda: (size := log_dir_size(broker.bootstrap, topic)) < before / 4 and size,
        "the reported size to shrink",
        timeout_s=90,
    )
    assert 0 < after < before / 4, (before, after)


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


def poll_all(bootstrap: str, topic: str, isolation: str, quiet_s: float = 3.0) -> list[Record]:
    """Every record a consumer gets from offset 0 until ``quiet_s`` pass without one."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([ConfluentTP(topic, 0, 0)])
    found: list[Record] = []
    try:
        last = time.monotonic()
        while time.monotonic() - last < quiet_s:
            message = consumer.poll(0.3)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            found.append((message.offset(), message.key(), message.value()))
            last = time.monotonic()
    finally:
        consumer.close()
    return found


def test_aborted_records_go_and_open_transactions_are_left_alone(
    broker_cluster: BrokerCluster,
) -> None:
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "txn-compacted"
    create_compacted(broker.bootstrap, topic, **{"min.cleanable.dirty.ratio": "1.5"})
    committer = txn_producer(broker.bootstrap, "committer")
    in_transaction(committer, topic, [(b"k0", b"c0"), (b"k1", b"c0")], commit=True)
    in_transaction(committer, topic, [(b"k0", b"c1")], commit=True)
    in_transaction(committer, topic, [(b"k0", b"aborted"), (b"k1", b"aborted")], commit=False)
    opener = txn_producer(broker.bootstrap, "opener")
    opener.begin_transaction()
    opener.produce(topic, key=b"k1", value=b"open", partition=0)
    opener.flush(15)
    time.sleep(0.1)
    in_transaction(committer, topic, [(b"k0", b"after-open")], commit=True)
    state = partition_state(broker_cluster, topic)
    (last_stable,) = state.open_txns.values()
    before = poll_all(broker.bootstrap, topic, "read_uncommitted")
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    cleaned = cleaned_up_to(broker_cluster, topic, last_stable)
    assert cleaned.upto == last_stable  # never past the open transaction's first offset
    after = poll_all(broker.bootstrap, topic, "read_uncommitted")
    assert b"aborted" not in [value for _, _, value in after]
    assert [r for r in after if r[0] >= last_stable] == [r for r in before if r[0] >= last_stable]
    below = [(key, value) for offset, key, value in after if offset < last_stable]
    assert sorted(below) == [(b"k0", b"c1"), (b"k1", b"c0")]
    # read_committed stops at the open transaction and sees the committed latest values.
    committed = poll_all(broker.bootstrap, topic, "read_committed")
    assert [(k, v) for _, k, v in committed] == [(b"k1", b"c0"), (b"k0", b"c1")]
    opener.abort_transaction(15)
