"""The Spark source reads a transactionally written compacted topic after a pass that removed
its transaction markers and the aborted-transaction entries below the cleaned range: each key's
latest committed value at its offset, nothing aborted, and no data-loss error for the offsets
the cleaner removed (records, markers)."""

from __future__ import annotations

from typing import Any

import pytest
from harness.brokers import BrokerCluster
from harness.log_cleaner import (
    CLEANER_ENV,
    alter_topic,
    cleaned_up_to,
    create_compacted,
    in_transaction,
    partition_state,
    poll_all,
    produce_rounds,
    txn_producer,
)
from harness.spark import source_options

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]
TOPIC = "compacted-txn-source"


def test_spark_reads_a_cleaned_transactional_topic(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    broker = broker_cluster.start(**CLEANER_ENV)
    create_compacted(
        broker.bootstrap, TOPIC, **{"min.cleanable.dirty.ratio": "1.5", "delete.retention.ms": "0"}
    )
    producer = txn_producer(broker.bootstrap, "spark-changelog")
    for n in range(15):
        records = [(b"k%d" % ((n + i) % 3), b"txn %d" % n) for i in range(2)]
        in_transaction(producer, TOPIC, records, commit=n % 4 != 1)
    produce_rounds(broker.bootstrap, TOPIC, [[(b"tail", b"last")]])
    committed = poll_all(broker.bootstrap, TOPIC, "read_committed")
    tail = committed[-1][0]
    alter_topic(broker.bootstrap, TOPIC, "min.cleanable.dirty.ratio", "0.01")
    upto = cleaned_up_to(broker_cluster, TOPIC, tail).upto
    assert not partition_state(broker_cluster, TOPIC).aborted_txns  # all below upto: dropped
    latest = {key: (offset, key, value) for offset, key, value in committed if offset < upto}
    expected = sorted([*latest.values(), *(r for r in committed if r[0] >= upto)])

    df = (
        spark.read.format("kafscale")
        .options(**source_options(broker_cluster))
        .option("subscribe", TOPIC)
        .load()
    )
    rows = sorted(
        (r.offset, bytes(r.key), bytes(r.value))
        for r in df.select("offset", "key", "value").collect()
    )
    assert rows == expected
    assert b"txn 1" not in {value for _, _, value in rows}  # an aborted transaction's value
