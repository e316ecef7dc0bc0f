"""The log cleaner under failure: real etcd, moto S3, broker processes and clients.

* A deterministic test for a race the fault campaign found: a pass that wrote objects and then
  failed (an upload or its commit went unanswered) must not stop the owner's later passes.
* The fault campaign (``test_a_fault_campaign_keeps_every_keys_latest_acked_value``): keyed
  idempotent producers write updates and tombstones to a compacted topic cleaned all the time,
  while brokers are SIGKILLed and restarted, SIGSTOPped and resumed, etcd is paused and the
  object store holds its replies. Then, after a final pass, a consumer from the beginning, the
  consumers that read throughout, and the store against the state are checked
  (``harness.compaction_faults``). ``KAFSCALE_FAULT_ROUNDS`` (default 6) makes it longer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
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
}


def read_etcd(cluster: BrokerCluster, key: str) -> bytes | None:
    async def read() -> bytes | None:
        etcd = await Etcd.connect([cluster.etcd_url], timeout_s=5)
        try:
            entry = await etcd.get(key)
            return None if entry is None else bytes(entry.value)
        finally:
            await etcd.close()

    return asyncio.run(read())


def partition_state(cluster: BrokerCluster, topic: str, partition: int) -> PartitionState:
    value = read_etcd(cluster, keys.partition_state_key(cluster.cluster, topic, partition))
    assert value is not None
    return PartitionState.from_json(value)


def topic_id(cluster: BrokerCluster, topic: str) -> str:
    value = read_etcd(cluster, keys.topic_key(cluster.cluster, topic))
    assert value is not None
    return str(json.loads(value)["topic_id"])


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def create_compacted(bootstrap: str, topic: str, partitions: int, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"cleanup.policy": "compact", **configs}
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(30)


def produce_segments(bootstrap: str, topic: str, rounds: int, keys_per_round: int) -> int:
    """``rounds`` flushed rounds of updates to the same keys on partition 0 (a segment each);
    returns the high watermark."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for r in range(rounds):
        for k in range(keys_per_round):
            producer.produce(topic, key=b"k%d" % k, value=b"v%d" % r, partition=0)
        assert producer.flush(15) == 0
        time.sleep(0.15)  # the next round lands in a segment of its own
    return rounds * keys_per_round


def test_leftovers_of_a_failed_pass_at_the_owners_epoch_do_not_stop_its_later_passes(
    broker_cluster: BrokerCluster,
) -> None:
    """A pass uploads generation g+1 under its owner's epoch, then fails before its commit
    lands (the store or etcd did not answer in time, the owner lives on). Its objects stay:
    nothing may delete them while the commit's outcome is unknown. Before the fix the owner's
    next pass wrote the same generation at the same epoch, the conditional PUT of its first
    object met the leftover (ObjectAlreadyExists), the pass was skipped, and so was every pass
    after it: the partition was never cleaned again while that broker owned it. The leftover
    is planted here (the first object of generation 0 at the owner's epoch), deterministically,
    before the first pass can run."""
    broker = broker_cluster.start(**CLEANER_ENV)
    topic = "leftovers"
    create_compacted(broker.bootstrap, topic, 1, **{"min.cleanable.dirty.ratio": "1.5"})
    hw = produce_segments(broker.bootstrap, topic, rounds=6, keys_per_round=3)
    state = partition_state(broker_cluster, topic, 0)
    assert state.cleaned is None
    prefix = keys.cleaned_pass_prefix(
        broker_cluster.cluster, topic, topic_id(broker_cluster, topic), 0, 0, state.leader_epoch
    )
    leftover = keys.cleaned_object_key(prefix, 0)
    broker_cluster.s3.client().put_object(Bucket=broker_cluster.bucket, Key=leftover, Body=b"x")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    entry = ConfigEntry(
        "min.cleanable.dirty.ratio", "0.01", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)

    def cleaned() -> PartitionState | None:
        found = partition_state(broker_cluster, topic, 0)
        return found if found.cleaned is not None and found.cleaned.upto >= hw - 3 else None

    after = eventually(cleaned, "a pass by the same owner", timeout_s=60)
    assert after.cleaned is not None
    assert after.leader_epoch == state.leader_epoch  # the same owner: no handoff helped
    # The leftover's generation is older than the committed one: the pass's delete takes it.
    eventually(lambda: leftover not in broker_cluster.object_keys(prefix), "the leftover deleted")
