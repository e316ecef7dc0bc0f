"""kafka-python, aiokafka, confluent-kafka and kcat behind one shape: create a topic, produce
``Record``s (returning each record's acked partition and offset), consume ``Consumed`` ones
from offset 0. ``CLIENTS``, ``PRODUCERS`` and ``CONSUMERS`` name them for parametrized tests.

Every producer runs with the idempotent producer on, acks=all and the given codec; every
consumer reads without a group's committed offsets until it has the expected count or
``CONSUME_TIMEOUT_S`` passes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as CkNewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KpNewTopic

from harness.kcat import kcat_consume, kcat_headers, kcat_produce
from harness.round_trip import (
    CONSUME_TIMEOUT_S,
    PARTITIONS,
    RECORDS,
    Consumed,
    Record,
    make_records,
)

# --- kafka-python and aiokafka take the same settings and give the same records -------------

# No group: read from offset 0 of assigned partitions, with short fetch waits.
CONSUMER_SETTINGS: dict[str, Any] = {
    "group_id": None,
    "enable_auto_commit": False,
    "fetch_max_wait_ms": 100,
}


def producer_settings(bootstrap: str, codec: str) -> dict[str, Any]:
    """The idempotent producer, acks=all, ``codec``, a short linger."""
    return {
        "bootstrap_servers": bootstrap,
        "compression_type": None if codec == "none" else codec,
        "enable_idempotence": True,
        "acks": "all",
        "linger_ms": 20,
    }


def send_arguments(record: Record) -> dict[str, Any]:
    """``send()``'s keyword arguments for ``record``: its own partition and timestamp."""
    return {
        "key": record.key,
        "value": record.value,
        "headers": list(record.headers),
        "partition": record.partition,
        "timestamp_ms": record.timestamp,
    }


def assign_from_start(consumer: Any, partitions: list[Any]) -> None:
    """Assign ``partitions`` (the client's own ``TopicPartition``s) and read each from 0."""
    consumer.assign(partitions)
    for tp in partitions:
        consumer.seek(tp, 0)


def consumed_of(message: Any) -> Consumed:
    """A kafka-python or aiokafka ``ConsumerRecord`` (the two share attribute names)."""
    return Consumed(
        message.partition,
        message.offset,
        message.key,
        message.value,
        tuple((name, bytes(value)) for name, value in message.headers),
        message.timestamp,
    )


# --- kafka-python ---------------------------------------------------------------------------


def kp_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([KpNewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def kp_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    producer = KafkaProducer(**producer_settings(bootstrap, codec))
    try:
        futures = [producer.send(topic, **send_arguments(r)) for r in records]
        producer.flush(30)
        metadata = [f.get(timeout=30) for f in futures]
    finally:
        producer.close(10)
    return [(m.partition, m.offset) for m in metadata]


def kp_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    consumer = KafkaConsumer(**CONSUMER_SETTINGS, bootstrap_servers=bootstrap)
    try:
        assign_from_start(consumer, [KpTopicPartition(topic, p) for p in range(partitions)])
        result: list[Consumed] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(result) < expected and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                result += [consumed_of(m) for m in messages]
        return result
    finally:
        consumer.close()


# --- aiokafka ---------------------------------------------------------------------------------


def aio_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic(topic, partitions, 1)])
        finally:
            await admin.close()

    asyncio.run(create())


def aio_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    async def produce() -> list[tuple[int, int]]:
        producer = AIOKafkaProducer(**producer_settings(bootstrap, codec))
        await producer.start()
        try:
            futures = [await producer.send(topic, **send_arguments(r)) for r in records]
            metadata = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return [(m.partition, m.offset) for m in metadata]

    return asyncio.run(produce())


def aio_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    async def consume() -> list[Consumed]:
        consumer = AIOKafkaConsumer(**CONSUMER_SETTINGS, bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            assign_from_start(consumer, [AioTopicPartition(topic, p) for p in range(partitions)])
            result: list[Consumed] = []
            deadline = time.monotonic() + CONSUME_TIMEOUT_S
            while len(result) < expected and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    result += [consumed_of(m) for m in messages]
            return result
        finally:
            await consumer.stop()

    return asyncio.run(consume())


# --- confluent-kafka --------------------------------------------------------------------------


def ck_create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([CkNewTopic(topic, partitions, 1)], operation_timeout=20)
    for future in futures.values():
        future.result(30)


def ck_produce(
    bootstrap: str, topic: str, records: list[Record], codec: str
) -> list[tuple[int, int]]:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
        }
    )
    reports: list[tuple[int, int] | None] = [None] * len(records)
    errors = []

    def on_delivery(index: int) -> Callable[[object, object], None]:
        def report(err: object, msg: object) -> None:
            if err is not None:
                errors.append(err)
            else:
                reports[index] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

        return report

    for i, r in enumerate(records):
        producer.produce(
            topic,
            key=r.key,
            value=r.value,
            headers=list(r.headers),
            partition=r.partition,
            timestamp=r.timestamp or 0,
            on_delivery=on_delivery(i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    return [r for r in reports if r is not None]


def ck_consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[Consumed]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"unused-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.assign([CkTopicPartition(topic, p, 0) for p in range(partitions)])
        result: list[Consumed] = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(result) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            result.append(
                Consumed(
                    message.partition(),
                    message.offset(),
                    message.key(),
                    message.value(),
                    tuple((name, bytes(value)) for name, value in message.headers() or []),
                    message.timestamp()[1],
                )
            )
        return result
    finally:
        consumer.close()


# --- kcat -------------------------------------------------------------------------------------


def kcat_config(codec: str) -> dict[str, str]:
    return {"compression.codec": codec, "enable.idempotence": "true", "linger.ms": "20"}


def kcat_produce_records(bootstrap: str, topic: str, records: list[Record], codec: str) -> None:
    """kcat gives every record of a run the same headers and cannot set timestamps."""
    for partition in sorted({r.partition for r in records}):
        mine = [r for r in records if r.partition == partition]
        headers = mine[0].headers
        assert all(r.headers == headers and r.timestamp is None for r in mine)
        kcat_produce(
            bootstrap,
            topic,
            [(r.key.decode(), r.value.decode()) for r in mine],
            partition=partition,
            headers=[(name, value.decode()) for name, value in headers],
            config=kcat_config(codec),
        )


def kcat_records(tag: str, count: int = RECORDS) -> list[Record]:
    headers = (("trace", b"kcat"), ("source", tag.encode()))
    return [Record(r.partition, r.key, r.value, headers, None) for r in make_records(tag, count)]


def kcat_consume_records(
    bootstrap: str, topic: str, partitions: int, expected: int
) -> list[Consumed]:
    envelopes = kcat_consume(bootstrap, topic, count=expected)
    return [
        Consumed(
            e["partition"],
            e["offset"],
            None if e["key"] is None else e["key"].encode(),
            None if e["payload"] is None else e["payload"].encode(),
            tuple((name, value.encode()) for name, value in kcat_headers(e)),
            e["ts"],
        )
        for e in envelopes
    ]


# --- by name: one client, every codec ----------------------------------------------------------


CLIENTS = {
    "kafka-python": (kp_create_topic, kp_produce, kp_consume),
    "aiokafka": (aio_create_topic, aio_produce, aio_consume),
    "confluent": (ck_create_topic, ck_produce, ck_consume),
}


# --- by name: across clients -------------------------------------------------------------------

PRODUCERS = {
    "kafka-python": kp_produce,
    "aiokafka": aio_produce,
    "confluent": ck_produce,
    "kcat": None,
}
CONSUMERS = {
    "kafka-python": kp_consume,
    "aiokafka": aio_consume,
    "confluent": ck_consume,
    "kcat": kcat_consume_records,
}
