"""Log compaction end to end: real brokers on moto S3 and etcd, real clients.

A compacted topic keeps each key's latest record (Kafka's log cleaner): after a pass, a consumer
from the beginning gets exactly that, at the records' original offsets, and never stalls on the
offsets cleaned away; a consumer that was part-way through keeps going. On the old main nothing
is ever cleaned, so every one of these fails there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentTP
from harness.brokers import BrokerCluster, running_cluster
from harness.log_cleaner import (
    CLEANER_ENV,
    Record,
    alter_topic,
    cleaned_up_to,
    consume,
    create_compacted,
    eventually,
    in_transaction,
    keyed_rounds,
    latest_per_key,
    log_dir_size,
    partition_state,
    poll_all,
    produce_rounds,
    produced_log,
    txn_producer,
)
from harness.s3 import S3Endpoint

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cleaner_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    """One broker (cleaning often) for the tests that neither kill nor add brokers, each on a
    compacted topic of its own: a broker started for each cost ~1.5 s of the suite's time."""
    with running_cluster(
        etcd_server, s3_server, tmp_path_factory, "cleaner", extra_env=CLEANER_ENV
    ) as cluster:
        yield cluster


def first_offset_at_or_after(bootstrap: str, topic: str, timestamp_ms: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "times"})
    try:
        (found,) = consumer.offsets_for_times([ConfluentTP(topic, 0, timestamp_ms)], timeout=10)
        return int(found.offset)
    finally:
        consumer.close()


def test_a_consumer_gets_each_keys_latest_value_at_its_original_offset(
    cleaner_cluster: BrokerCluster,
) -> None:
    broker = cleaner_cluster.brokers[0]
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
    state = cleaned_up_to(cleaner_cluster, topic, hw - 1)
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
    plain = f"{cleaner_cluster.cluster}/topics/{topic}/"

    def superseded_gone() -> bool:
        listed = cleaner_cluster.object_keys(plain)
        return all("/0.cleaned/" in k or _base(k) >= upto for k in listed if k.endswith(".kfs"))

    eventually(superseded_gone, "superseded segments deleted")
    assert consume(broker.bootstrap, topic, 0, hw) == expected


def _base(key: str) -> int:
    return int(key.rsplit("/", 1)[-1].split("-", 1)[0])


def test_kafka_python_reads_a_cleaned_topic_and_tombstones_stay_within_delete_retention(
    cleaner_cluster: BrokerCluster,
) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaTP

    broker = cleaner_cluster.brokers[0]
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
    state = cleaned_up_to(cleaner_cluster, topic, offset - 3)
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


def test_null_keys_are_refused_by_a_compacted_topic(cleaner_cluster: BrokerCluster) -> None:
    """Kafka refuses a keyless record on a compacted topic with INVALID_RECORD (87): the batch
    holding it is not appended; keyed batches are."""
    broker = cleaner_cluster.brokers[0]
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


def test_many_updates_to_few_keys_stop_growing_the_stored_bytes(
    cleaner_cluster: BrokerCluster,
) -> None:
    """The point of compaction: a topic of few keys updated often (Connect's offsets topic, a
    changelog) is bounded by its keys, not its history; DescribeLogDirs reports the shrink."""
    broker = cleaner_cluster.brokers[0]
    topic = "few-keys"
    create_compacted(broker.bootstrap, topic, **{"min.cleanable.dirty.ratio": "1.5"})
    rounds = [[(b"k%d" % k, b"%d" % r * 300) for k in range(4)] for r in range(20)]
    produce_rounds(broker.bootstrap, topic, rounds)
    # Waits as generous as the pass's: one run at load average ~19 failed here within 30 s.
    before = eventually(lambda: log_dir_size(broker.bootstrap, topic), "a size", timeout_s=90)
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    cleaned_up_to(cleaner_cluster, topic, 76)
    after = eventually(
        lambda: (size := log_dir_size(broker.bootstrap, topic)) < before / 4 and size,
        "the reported size to shrink",
        timeout_s=90,
    )
    assert 0 < after < before / 4, (before, after)


def test_aborted_records_go_and_open_transactions_are_left_alone(
    cleaner_cluster: BrokerCluster,
) -> None:
    broker = cleaner_cluster.brokers[0]
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
    state = partition_state(cleaner_cluster, topic)
    (last_stable,) = state.open_txns.values()
    before = poll_all(broker.bootstrap, topic, "read_uncommitted")
    alter_topic(broker.bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    cleaned = cleaned_up_to(cleaner_cluster, topic, last_stable)
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
