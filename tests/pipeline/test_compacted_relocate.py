"""A Spark read of a compacted topic planned before a compaction pass, whose tasks run after the
pass committed and deleted the objects they planned (``log.cleaner_delete_delay_s`` 1 s here):
the tasks re-locate their offset ranges from the partition's current state and return each
key's latest record as a consumer reading after the pass gets it, never beyond the planned end.
On the old code every one of these fails with "superseded by a compaction pass ... run the
query again" (Spark's retries reuse the plan, so the query fails)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from harness.brokers import BrokerCluster
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
    partition_state,
    produce_rounds,
    produced_log,
    txn_producer,
)
from harness.spark import plan_as_spark_does, run_as_executors_do, source_options
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable

from kafscale.broker.metadata import keys
from kafscale.pipeline.source import KafScaleDataSource

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]
SHARED_BROKER_ENV = CLEANER_ENV  # the module's broker (conftest's shared_cluster)
NO_PASS_YET = {"min.cleanable.dirty.ratio": "1.5"}  # dirty share never reaches it


def read_committed(bootstrap: str, topic: str) -> list[Record]:
    """Every record a read_committed consumer gets from offset 0 to the end of partition 0
    (its last stable offset, reported by the fetch: no quiet period to wait out)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[Record] = []
    try:
        deadline = time.monotonic() + 120  # only against a hang
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return found
                raise KafkaException(message.error())
            found.append((message.offset(), message.key(), message.value()))
        raise AssertionError(f"no end of partition after {found[-1:] or 'nothing'}")
    finally:
        consumer.close()


def plain_bases(cluster: BrokerCluster, topic: str) -> list[int]:
    """Base offsets of the partition's plain segment objects in the store."""
    listed = cluster.object_keys(f"{cluster.cluster}/topics/{topic}/")
    parsed = [keys.parse_object_name(key) for key in listed if ".cleaned/" not in key]
    return [found[0] for found in parsed if found is not None and found[2] == "kfs"]


def clean_and_delete(cluster: BrokerCluster, bootstrap: str, topic: str, upto: int) -> int:
    """Let a pass run up to ``upto`` and wait until the plain segments it superseded are
    deleted; the cleaned range's end."""
    alter_topic(bootstrap, topic, "min.cleanable.dirty.ratio", "0.01")
    cleaned = cleaned_up_to(cluster, topic, upto).upto
    eventually(
        lambda: min(plain_bases(cluster, topic)) >= cleaned,
        "the superseded plain segments deleted",
        timeout_s=90.0,
    )
    return int(cleaned)


def assert_latest_per_key(rows: list[Record], written: list[Record], upto: int) -> None:
    """Below ``upto`` each key's latest record, as written. A tombstone (``delete.retention.ms``
    0 here) may still be there: the pass that cleaned the range gives it a delete horizon, and
    only a later pass, if one ran before the read, drops it (KIP-534)."""
    kept = latest_per_key(written, upto, drop_tombstones=False)
    assert set(rows) <= set(kept)
    live = [r for r in rows if r[0] >= upto or r[2] is not None]
    assert live == latest_per_key(written, upto, drop_tombstones=True)


def rows_of(frame: Any) -> list[Record]:
    return sorted(
        (r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
        for r in frame.select("offset", "key", "value").collect()
    )


def test_a_batch_read_planned_before_a_pass_returns_each_keys_latest(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    broker = shared_cluster.brokers[0]
    topic = "relocate-batch"
    create_compacted(broker.bootstrap, topic, **NO_PASS_YET)
    rounds = keyed_rounds(6)
    produce_rounds(broker.bootstrap, topic, rounds)
    written = produced_log(rounds)
    planned_end = len(written)
    frame = (
        spark.read.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", topic)
        .load()
    )
    assert frame.count() == planned_end  # planned now (once per DataFrame): plain segments
    # Past the plan: not read. It also makes the plan's last segment cleanable.
    produce_rounds(broker.bootstrap, topic, [[(b"k1", b"after the plan")]])
    upto = clean_and_delete(shared_cluster, broker.bootstrap, topic, planned_end)
    assert upto == planned_end

    rows = rows_of(frame)  # the same DataFrame: the same plan, its objects gone

    after_pass = consume(broker.bootstrap, topic, 0, planned_end)
    assert rows == after_pass
    assert_latest_per_key(rows, written, upto)
    assert len(rows) < len(written)  # the pass removed records: a real re-location


def test_a_stream_micro_batch_planned_before_a_pass_returns_each_keys_latest(
    shared_cluster: BrokerCluster,
) -> None:
    """A micro-batch's tasks as Spark runs them (pyspark's own pickled read function and
    partitions) after the pass: the batch's offsets, those of the checkpoint, stay the plan's."""
    broker = shared_cluster.brokers[0]
    topic = "relocate-stream"
    create_compacted(broker.bootstrap, topic, **NO_PASS_YET)
    rounds = keyed_rounds(6)
    produce_rounds(broker.bootstrap, topic, rounds)
    written = produced_log(rounds)
    options = {
        **source_options(shared_cluster),
        "subscribe": topic,
        "startingOffsets": "earliest",
    }
    driver = KafScaleDataSource(CaseInsensitiveDict(options))
    reader = driver.streamReader(driver.schema())
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert (start, end) == ({topic: {"0": 0}}, {topic: {"0": len(written)}})
    partitions = reader.partitions(start, end)
    payload = plan_as_spark_does(KafScaleDataSource(CaseInsensitiveDict(options)), True)
    produce_rounds(broker.bootstrap, topic, [[(b"k1", b"after the plan")]])
    upto = clean_and_delete(shared_cluster, broker.bootstrap, topic, len(written))

    batches = run_as_executors_do(payload, list(partitions))

    rows = sorted(
        (row["offset"], row["key"], row["value"]) for b in batches for row in b.to_pylist()
    )
    assert rows == consume(broker.bootstrap, topic, 0, len(written))
    assert_latest_per_key(rows, written, upto)
    assert len(rows) < len(written)


def test_read_committed_rows_survive_a_pass_that_drops_aborted_transactions(
    spark: Any, shared_cluster: BrokerCluster
) -> None:
    """The plan lists aborted transactions; the pass drops their records and their entries in
    the state. The re-located tasks return the committed records a read_committed consumer
    gets after the pass, and nothing aborted."""
    broker = shared_cluster.brokers[0]
    topic = "relocate-txn"
    create_compacted(broker.bootstrap, topic, **NO_PASS_YET)
    producer = txn_producer(broker.bootstrap, "relocate-changelog")
    for n in range(15):
        records = [(b"k%d" % ((n + i) % 3), b"txn %d" % n) for i in range(2)]
        in_transaction(producer, topic, records, commit=n % 4 != 1)
    produce_rounds(broker.bootstrap, topic, [[(b"tail", b"last")]])
    committed = read_committed(broker.bootstrap, topic)
    assert partition_state(shared_cluster, topic).aborted_txns  # planned with them
    frame = (
        spark.read.format("kafscale")
        .options(**source_options(shared_cluster))
        .option("subscribe", topic)
        .load()
    )
    assert frame.count() == len(committed)
    tail = committed[-1][0]

    upto = clean_and_delete(shared_cluster, broker.bootstrap, topic, tail)
    assert not partition_state(shared_cluster, topic).aborted_txns  # dropped by the pass
    rows = rows_of(frame)

    assert rows == read_committed(broker.bootstrap, topic)
    latest = {key: (offset, key, value) for offset, key, value in committed if offset < upto}
    assert rows == sorted([*latest.values(), *(r for r in committed if r[0] >= upto)])
    assert b"txn 1" not in {value for _, _, value in rows}  # an aborted transaction's value
