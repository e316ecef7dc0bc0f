"""Incremental fetch sessions (KIP-227) on the wire and with kafka-python, which uses them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from harness.batches import make_batch
from harness.kafka_wire import FETCH, PRODUCE, KafkaWire, batch_offsets, fetch_body, produce_body
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration


def session_fetch(
    session_id: int,
    epoch: int,
    positions: dict[int, int],
    forgotten: list[int] | None = None,
    max_wait_ms: int = 0,
) -> dict[str, Any]:
    body = fetch_body("s", 0, 0, max_wait_ms=max_wait_ms)
    template = body["topics"][0]["partitions"][0]
    body["session_id"], body["session_epoch"] = session_id, epoch
    body["topics"] = [
        {
            "topic": "s",
            "partitions": [
                template | {"partition": p, "fetch_offset": o} for p, o in positions.items()
            ],
        }
    ]
    body["forgotten_topics_data"] = [{"topic": "s", "partitions": forgotten}] if forgotten else []
    return body


def partitions_in(response: Any) -> dict[int, Any]:
    return {int(p.partition_index): p for t in response.responses for p in t.partitions}


def test_a_session_answers_only_what_changed(broker: BrokerProcess) -> None:
    """A full request opens a session and is told of every partition; incremental requests
    name only new positions, and are told only of partitions with records or a moved high
    watermark; a stale epoch or an unknown session is a top-level error."""
    create_topics(broker.bootstrap, ["s"], partitions=3)
    with KafkaWire(broker.bootstrap) as wire:
        wire.request(PRODUCE, 9, produce_body("s", 0, make_batch(0, [b"a", b"b"])))
        full = wire.request(FETCH, 12, session_fetch(0, 0, {0: 0, 1: 0, 2: 0}))
        assert full.error_code == ErrorCode.NONE and full.session_id != 0
        assert sorted(partitions_in(full)) == [0, 1, 2]
        assert partitions_in(full)[0].records  # the two records
        session = full.session_id

        nothing_new = wire.request(FETCH, 12, session_fetch(session, 1, {0: 2}))
        assert nothing_new.session_id == session and partitions_in(nothing_new) == {}

        wire.request(PRODUCE, 9, produce_body("s", 1, make_batch(0, [b"c"])))
        # Long-polling on the session's partitions, though the request names none of them.
        news = wire.request(FETCH, 12, session_fetch(session, 2, {}, max_wait_ms=5000))
        assert list(partitions_in(news)) == [1]
        assert partitions_in(news)[1].high_watermark == 1 and partitions_in(news)[1].records

        wire.request(PRODUCE, 9, produce_body("s", 1, make_batch(0, [b"d"])))
        forgot = wire.request(FETCH, 12, session_fetch(session, 3, {}, forgotten=[1]))
        assert partitions_in(forgot) == {}  # partition 1 has a record, but is no longer asked

        stale = wire.request(FETCH, 12, session_fetch(session, 3, {}))
        assert stale.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
        unknown = wire.request(FETCH, 12, session_fetch(session + 1, 1, {}))
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND

        closed = wire.request(FETCH, 12, session_fetch(session, -1, {0: 0}))
        assert closed.session_id == 0 and list(partitions_in(closed)) == [0]
        gone = wire.request(FETCH, 12, session_fetch(session, 5, {}))
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_kafka_python_consumes_everything_through_a_session(broker: BrokerProcess) -> None:
    """kafka-python opens a fetch session and then fetches incrementally: records produced in
    rounds to some partitions at a time all arrive, in order, once."""
    from kafka import KafkaConsumer, KafkaProducer

    create_topics(broker.bootstrap, ["sessions"], partitions=4)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    consumer = KafkaConsumer(
        "sessions",
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=200,
    )
    sent: dict[int, list[bytes]] = {p: [] for p in range(4)}
    received: dict[int, list[bytes]] = {p: [] for p in range(4)}
    sessions_seen = 0
    try:
        for round_number in range(6):
            for partition in (round_number % 4, (round_number + 1) % 4):
                for n in range(5):
                    value = f"{round_number}-{partition}-{n}".encode()
                    producer.send("sessions", value=value, partition=partition)
                    sent[partition].append(value)
            producer.flush(10)
            deadline = time.monotonic() + 15
            while sum(map(len, received.values())) < sum(map(len, sent.values())):
                assert time.monotonic() < deadline, f"received {received}, sent {sent}"
                for tp, records in consumer.poll(timeout_ms=200).items():
                    received[tp.partition] += [r.value for r in records]
            sessions_seen = max(sessions_seen, broker.status()["fetch_sessions"])
    finally:
        consumer.close()
        producer.close()
    assert received == sent
    assert sessions_seen >= 1


def test_a_long_poll_overtaken_by_the_sessions_next_request_is_an_epoch_error(
    broker: BrokerProcess,
) -> None:
    create_topics(broker.bootstrap, ["s"], partitions=1)
    with KafkaWire(broker.bootstrap) as first, KafkaWire(broker.bootstrap) as second:
        session = first.request(FETCH, 12, session_fetch(0, 0, {0: 0})).session_id
        first.send(FETCH, 12, session_fetch(session, 1, {}, max_wait_ms=3000))
        time.sleep(0.5)  # the first is taken in and waiting for data
        assert second.request(FETCH, 12, session_fetch(session, 2, {})).error_code == 0
        _, overtaken = first.recv(FETCH, 12)
        assert overtaken.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH


def test_a_small_fetch_max_bytes_rotates_through_the_sessions_partitions(
    broker: BrokerProcess,
) -> None:
    """Issue 29: with a response limit below one batch, each response carries one batch of the
    first partition with data, and the session moves that partition to the end of its order,
    so every partition is served in turn (the first response included)."""
    from harness.kafka_wire import batch_offsets

    create_topics(broker.bootstrap, ["s"], partitions=3)
    with KafkaWire(broker.bootstrap) as wire:
        for partition in (1, 2):  # partition 0 stays empty
            for n in range(3):
                wire.request(PRODUCE, 9, produce_body("s", partition, make_batch(0, [b"x%d" % n])))
        body = session_fetch(0, 0, {0: 0, 1: 0, 2: 0})
        body["max_bytes"] = 10
        full = wire.request(FETCH, 12, body)
        served = [
            (p, batch_offsets(part.records))
            for p, part in partitions_in(full).items()
            if part.records
        ]
        assert served == [(1, [(0, 1)])]
        positions = {0: 0, 1: 1, 2: 0}
        order = []
        for epoch in range(1, 6):
            body = session_fetch(full.session_id, epoch, dict(positions))
            body["max_bytes"] = 10
            response = wire.request(FETCH, 12, body)
            with_records = {
                p: batch_offsets(part.records)
                for p, part in partitions_in(response).items()
                if part.records
            }
            assert len(with_records) == 1, with_records
            ((partition, batches),) = with_records.items()
            assert batches == [(positions[partition], 1)]
            positions[partition] += 1
            order.append(partition)
        assert order == [1, 2, 1, 2, 2]  # a full response does not rotate (as in Kafka)
        assert positions == {0: 0, 1: 3, 2: 3}


def test_kafka_python_with_a_tiny_fetch_max_bytes_reads_every_partition(
    broker: BrokerProcess,
) -> None:
    """kafka-python fetches through a session; with ``fetch_max_bytes`` below one batch it
    still receives every partition's records (one batch per response, in turn)."""
    from kafka import KafkaConsumer, KafkaProducer

    create_topics(broker.bootstrap, ["tiny"], partitions=3)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    sent = {p: [b"%d-%d" % (p, n) for n in range(4)] for p in range(3)}
    for partition, values in sent.items():
        for value in values:
            producer.send("tiny", value=value, partition=partition).get(10)
    producer.close()
    consumer = KafkaConsumer(
        "tiny",
        bootstrap_servers=broker.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_wait_ms=100,
        fetch_max_bytes=10,
    )
    received: dict[int, list[bytes]] = {p: [] for p in range(3)}
    deadline = time.monotonic() + 30
    try:
        while received != sent and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                received[tp.partition] += [r.value for r in records]
    finally:
        consumer.close()
    assert received == sent


def test_a_session_outliving_its_topic_reads_the_topic_created_again(
    broker: BrokerProcess,
) -> None:
    """A session keeps positions, never data: once its topic is deleted it is told the topic
    is unknown; once a topic of that name is created again, a position past its end is out
    of range, and what it reads is the new topic's records, never the old ones (issue 29: the
    caches a running broker keeps must not go stale across a re-creation)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topics(broker.bootstrap, ["s"], partitions=1)
    with KafkaWire(broker.bootstrap) as wire:
        wire.request(PRODUCE, 9, produce_body("s", 0, make_batch(0, [b"old"] * 5)))
        full = wire.request(FETCH, 12, session_fetch(0, 0, {0: 0}))
        assert batch_offsets(partitions_in(full)[0].records) == [(0, 5)]
        session = full.session_id
        at_end = wire.request(FETCH, 12, session_fetch(session, 1, {0: 5}))
        assert partitions_in(at_end) == {}

        admin.delete_topics(["s"])["s"].result(10)
        gone = wire.request(FETCH, 12, session_fetch(session, 2, {}))
        assert partitions_in(gone)[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

        create_topics(broker.bootstrap, ["s"], partitions=1)
        wire.request(PRODUCE, 9, produce_body("s", 0, make_batch(0, [b"new"] * 3)))
        past_end = partitions_in(wire.request(FETCH, 12, session_fetch(session, 3, {})))[0]
        assert past_end.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert past_end.high_watermark == 3

        reset = partitions_in(wire.request(FETCH, 12, session_fetch(session, 4, {0: 0})))[0]
        assert reset.error_code == ErrorCode.NONE
        assert batch_offsets(reset.records) == [(0, 3)]  # the old topic had (0, 5)
        wire.request(PRODUCE, 9, produce_body("s", 0, make_batch(0, [b"new"] * 4)))
        more = partitions_in(wire.request(FETCH, 12, session_fetch(session, 5, {0: 3})))[0]
        assert batch_offsets(more.records) == [(3, 4)]
