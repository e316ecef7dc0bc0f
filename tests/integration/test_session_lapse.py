"""A broker whose etcd session lapsed, seen from its clients.

A broker frozen past its session's TTL (SIGSTOP, a stalled VM) wakes with its registration gone
from etcd, and from its own view of the cluster once the deletes reach it, until it has
registered again on a new session. Meanwhile it answered Metadata with no brokers at all and
every leader -1: librdkafka then dropped the broker from its list (failing what was queued on
it with ``_DESTROY_BROKER``, seen in a CI run of ``test_durability``'s watermark read), other
clients saw LEADER_NOT_AVAILABLE. A Kafka broker never answers Metadata without listing itself;
now neither does this one (``broker/metadata/listed_brokers.py``), and it names itself leader
of nothing while its session is not valid (``leaders.live_leaders``), even before its view has
heard of the deletes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from harness.brokers import BrokerCluster
from harness.kafka_wire import METADATA, KafkaWire, metadata_body

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd

pytestmark = pytest.mark.integration

TOPIC = "lapsed"
METADATA_VERSION = 12  # kafka-python's; librdkafka's v4 has the same brokers and leaders
WAIT_S = 120.0  # bound of each wait below (a loaded machine); none is a speed


def listed_and_leaders(answer: Any) -> tuple[set[tuple[int, str, int]], set[int]]:
    """(the brokers a Metadata answer lists, the leader ids it gives ``TOPIC``'s partitions)."""
    listed = {(int(b.node_id), str(b.host), int(b.port)) for b in answer.brokers}
    (topic,) = [t for t in answer.topics if t.name == TOPIC]
    return listed, {int(p.leader_id) for p in topic.partitions}


def leaders_of(wire: KafkaWire) -> set[int]:
    return listed_and_leaders(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))[1]


async def registration_lease(etcd: Etcd, cluster: str, node_id: int) -> int | None:
    kv = await etcd.get(keys.broker_key(cluster, node_id))
    return None if kv is None else kv.lease


async def until(check: Any, what: str, broker: BrokerProcess) -> None:
    """Wait until ``await check()`` is true (bounded by ``WAIT_S``)."""
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"{what}\n{broker.tail()}"
        await asyncio.sleep(0.05)


async def test_a_broker_woken_past_its_session_lists_itself_in_metadata(
    broker_cluster: BrokerCluster, etcd: Etcd
) -> None:
    broker = broker_cluster.start()
    cluster, me = broker_cluster.cluster, broker.node_id
    itself = (me, "127.0.0.1", broker.port)
    old_lease = await registration_lease(etcd, cluster, me)
    assert old_lease is not None
    with KafkaWire(broker.bootstrap, timeout_s=WAIT_S) as wire:
        leaders_of(wire)  # auto-creates the topic; the broker claims its partitions on demand

        async def owns_all() -> bool:
            return leaders_of(wire) == {me}

        await until(owns_all, "the broker never led its topic", broker)
        os.kill(broker.pid, signal.SIGSTOP)
        try:

            async def registration_gone() -> bool:
                return await registration_lease(etcd, cluster, me) is None

            # The freeze must outlast the session (4 s): etcd deletes what was bound to it.
            await until(registration_gone, "etcd kept the frozen broker's session", broker)
            # Waiting in the socket: answered as soon as the broker runs again.
            wire.send(METADATA, METADATA_VERSION, metadata_body([TOPIC]))
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        answers = [wire.recv(METADATA, METADATA_VERSION)[1]]

        async def registered_again() -> bool:
            answers.append(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))
            return await registration_lease(etcd, cluster, me) not in (None, old_lease)

        await until(registered_again, "the broker never registered again", broker)
        answers.append(wire.request(METADATA, METADATA_VERSION, metadata_body([TOPIC])))
    assert "etcd session lost" in broker.log_path.read_text(errors="replace")
    seen = [listed_and_leaders(answer) for answer in answers]
    # Before: no broker at all and every leader -1 while its registration was missing.
    assert all(itself in listed for listed, _ in seen), seen
    assert all(leaders <= {b[0] for b in listed} | {-1} for listed, leaders in seen), seen
    # Answered on waking, before it could register again: its view may still show the
    # ownership etcd deleted, yet it leads nothing (before: itself, for every partition).
    assert seen[0][1] == {-1}, seen
