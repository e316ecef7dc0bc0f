"""The Spark source reads a compacted topic after a pass: each key's latest value below the
cleaned offset, at its original offset, and everything after it, with no data-loss error for
the offsets compaction removed (on the old main nothing is cleaned: every value comes back)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from harness.brokers import BrokerCluster
from harness.spark import source_options

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState

pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]
TOPIC = "compacted-source"


def cleaned_upto(cluster: BrokerCluster, wanted: int) -> int:
    import asyncio

    from kafscale.broker.metadata.etcd import Etcd

    async def read() -> int:
        etcd = await Etcd.connect([cluster.etcd_url], timeout_s=5)
        try:
            entry = await etcd.get(keys.partition_state_key(cluster.cluster, TOPIC, 0))
            cleaned = PartitionState.from_json(entry.value).cleaned if entry else None
            return cleaned.upto if cleaned is not None else 0
        finally:
            await etcd.close()

    deadline = time.monotonic() + 90  # as test_log_cleaner: a loaded CI run saw no pass in 30 s
    while (upto := asyncio.run(read())) < wanted and time.monotonic() < deadline:
        time.sleep(0.2)
    return upto


def test_spark_reads_a_cleaned_topic(spark: Any, broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(
        KAFSCALE_LOG__CLEANER_INTERVAL_S="0.3", KAFSCALE_LOG__CLEANER_DELETE_DELAY_S="1"
    )
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(10)
    written: list[tuple[int, bytes, bytes]] = []
    for r in range(6):
        producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "zstd"})
        for k in range(3):
            producer.produce(TOPIC, key=b"k%d" % k, value=b"v%d" % r, partition=0)
            written.append((len(written), b"k%d" % k, b"v%d" % r))
        assert producer.flush(10) == 0
        time.sleep(0.1)
    upto = cleaned_upto(broker_cluster, len(written) - 3)
    assert upto == len(written) - 3  # all but the newest segment (the last round)
    latest = {key: (offset, key, value) for offset, key, value in written if offset < upto}
    expected = sorted(latest.values()) + [r for r in written if r[0] >= upto]
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
