"""Ctrl-C stops a ``kafscale local`` cluster as a whole: no broker marks itself draining (the
mark asks the others to take over, and nobody is left to), and no stopping broker takes on
anything a stopping sibling let go: no partition, no group, no transactional id, no assigner
role, no new assignment. Each was an etcd write for nothing; a group claimed by a sibling was
loaded only to be let go again within the same second.

A real ``kafscale local --brokers 3``, with a topic owned across the brokers and a consumer
group whose member stays connected through the Ctrl-C (as a user's does). What the stop wrote
is read back from etcd's own history: after the exit, etcd is started again on the data
directory and watched from the revision taken just before the Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from harness.etcd import harness_etcd
from harness.local_mode import start_local, stop_with_ctrl_c
from harness.ports import free_port_run
from harness.topics import create_topics

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import WatchEvent, WatchEventKind

pytestmark = pytest.mark.integration

BROKERS = 3
PARTITIONS = 6
RECORDS = 60
PREFIX = "/kafscale/"
WATCH_BOUND_S = 120.0
CLOSE_BOUND_S = 60.0

CLAIMS = ("/draining/", "/leases/partitions/", "/leases/groups/", "/leases/transactions/")
"""Keys a stopping broker puts only to hand over or to take on (with ``/leases/assigner`` and
the ``/assignment``, matched at the end of the key)."""


def claimed(key: str) -> bool:
    return any(part in key for part in CLAIMS) or key.endswith(("/leases/assigner", "/assignment"))


async def current_revision(url: str) -> int:
    etcd = await harness_etcd(url)
    try:
        return (await etcd.get_prefix_with_revision(PREFIX))[1]
    finally:
        await etcd.close()


async def changes_since(url: str, revision: int) -> list[WatchEvent]:
    """Every change under ``PREFIX`` after ``revision`` up to etcd's current revision, from its
    history (bounded: a failure to read it fails the test, never hangs it)."""
    etcd = await harness_etcd(url)
    events: list[WatchEvent] = []
    try:
        last = await current_revision(url)
        if last <= revision:
            return events
        async with (
            asyncio.timeout(WATCH_BOUND_S),
            contextlib.aclosing(etcd.watch_prefix(PREFIX, revision + 1)) as watch,
        ):
            async for event in watch:
                assert event.kind is not WatchEventKind.RESYNC, "history compacted"
                events.append(event)
                if event.mod_revision >= last:
                    return events
        return events
    except TimeoutError:
        seen = [(e.kind, e.key, e.mod_revision) for e in events]
        raise AssertionError(f"history to revision {last} not read: {seen}") from None
    finally:
        await etcd.close()


def consume_until_stopped(consumer: Consumer, stop: threading.Event, got: list[bytes]) -> None:
    while not stop.is_set():
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got.append(message.value())


def test_ctrl_c_of_a_local_cluster_writes_no_draining_mark_and_claims_nothing(
    tmp_path: Path,
) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "local.log"
    port = free_port_run(BROKERS)
    process = start_local(data_dir, port, brokers=BROKERS, log=log)
    stop, got = threading.Event(), []
    consumer: Consumer | None = None
    member: threading.Thread | None = None
    try:
        found = re.search(r"etcd\s+= (http://127\.0\.0\.1:\d+)", log.read_text())
        assert found is not None, log.read_text()
        bootstrap = ",".join(f"localhost:{port + i}" for i in range(BROKERS))
        topic = f"stop-{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, [topic], partitions=PARTITIONS)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(RECORDS):
            producer.produce(topic, value=b"r%d" % i, partition=i % PARTITIONS)
        assert producer.flush(60) == 0  # acked: every partition has an owner
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"stop-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,  # no commit at close, to a cluster gone
                # its close, after the cluster is gone, waits out the session (45 s by default)
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
            }
        )
        consumer.subscribe([topic])
        member = threading.Thread(target=consume_until_stopped, args=(consumer, stop, got))
        member.start()
        deadline = time.monotonic() + 120
        while len(got) < RECORDS:  # then the group is coordinated: the member joined
            assert time.monotonic() < deadline, f"consumed {len(got)} of {RECORDS}"
            stop.wait(0.1)
        before = asyncio.run(current_revision(found[1]))
    finally:
        assert stop_with_ctrl_c(process) == 0, log.read_text()
        stop.set()
        if member is not None:
            member.join(60)
        if consumer is not None:  # librdkafka's close may wait for the cluster gone: bounded
            closing = threading.Thread(target=consumer.close, daemon=True)
            closing.start()
            closing.join(CLOSE_BOUND_S)

    etcd = EmbeddedEtcd(data_dir / "etcd", die_with_parent=True).start()
    try:
        changes = asyncio.run(changes_since(etcd.client_url, before))
    finally:
        etcd.stop()
    puts = [e.key for e in changes if e.kind is WatchEventKind.PUT]
    claims = [key for key in puts if claimed(key)]
    assert claims == [], f"put while the whole cluster stopped: {claims}"
    # not vacuous: the stop's own writes are in the history read (each registration's end)
    gone = [e.key for e in changes if e.kind is WatchEventKind.DELETE and "/brokers/" in e.key]
    assert len(gone) == BROKERS, [(e.kind, e.key) for e in changes]
