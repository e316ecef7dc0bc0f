"""Share groups (KIP-932) in tests: group configs, librdkafka share consumers, polling helpers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin import ResourceType as CkResourceType

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd


def set_group_configs(bootstrap: str, group: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs on the GROUP resource (``kafka-configs --entity-type groups``)."""
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in configs.items()
    ]
    resource = ConfigResource(CkResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(15)


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def produce_partitions(bootstrap: str, topic: str, batches: dict[int, list[bytes]]) -> None:
    """Each partition's values produced to it, in order, by one producer (one client start and
    one flush for them all, not one per partition)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, values in batches.items():
        for value in values:
            producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def share_consumer(bootstrap: str, group: str, topic: str, **config: Any) -> ShareConsumer:
    """A librdkafka share consumer acknowledging explicitly, subscribed to ``topic``."""
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            **config,
        }
    )
    consumer.subscribe([topic])
    return consumer


@dataclass
class Received:
    """What one consumer got: (value, offset, delivery count) in order."""

    records: list[tuple[bytes, int, int]] = field(default_factory=list)

    @property
    def values(self) -> list[bytes]:
        return [v for v, _, _ in self.records]


def poll_some(
    consumer: ShareConsumer,
    received: Received,
    ack: AcknowledgeType | None = AcknowledgeType.ACCEPT,
    timeout_s: float = 0.5,
) -> int:
    """One poll: the records got are noted and acknowledged with ``ack`` (None: left
    acquired) and the acknowledgements committed; how many came."""
    messages = consumer.poll(timeout_s)
    count = 0
    for message in messages:
        if message.error() is not None:
            continue
        received.records.append((message.value(), message.offset(), message.delivery_count()))
        if ack is not None:
            consumer.acknowledge(message, ack)
        count += 1
    if count and ack is not None:
        consumer.commit_sync(30)
    return count


def poll_until(
    consumer: ShareConsumer,
    received: Received,
    done: Callable[[], bool],
    timeout_s: float = 30,
    ack: AcknowledgeType | None = AcknowledgeType.ACCEPT,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out; received {received.records[-20:]}"
        poll_some(consumer, received, ack)


def stored_share_state(
    etcd_url: str, cluster: str, group: str, topic: str, partition: int
) -> dict[str, Any] | None:
    """The share-partition's state as its owner last wrote it to etcd (None: not yet)."""

    async def read() -> dict[str, Any] | None:
        etcd = await Etcd.connect([etcd_url], timeout_s=30)  # a loaded machine connects slowly
        try:
            kv = await etcd.get(keys.share_state_key(cluster, group, topic, partition))
            return None if kv is None else dict(json.loads(kv.value))
        finally:
            await etcd.close()

    return asyncio.run(read())


def wait_stored(
    read: Callable[[], dict[str, Any] | None],
    done: Callable[[dict[str, Any]], bool],
    timeout_s: float = 60,
) -> dict[str, Any]:
    """Poll the stored state until ``done`` holds: a flush round's time is not a fixed sleep
    on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = read()
        if state is not None and done(state):
            return state
        assert time.monotonic() < deadline, f"share state never got there: {state}"
        time.sleep(0.1)
