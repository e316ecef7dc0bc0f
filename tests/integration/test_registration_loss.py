"""A broker woken from a freeze learns at once that etcd ended its session: from its cluster
view's watch deleting its own registration (``broker/metadata/registration_loss.py``), not at
its next keepalive.

Two brokers, A and B. A owns the topic's one partition; it is frozen (SIGSTOP) for a few
seconds, far less than its session's TTL, while its session lease is revoked in etcd (as
another broker starting at A's address does, or an expiry on etcd's clock), B claims the
partition and a record is produced there. By its own clock A's session is still valid when
it wakes. Before: A learnt of the revoke only at its next keepalive, up to TTL/3 later, and
meanwhile went on serving the partition from its memory: a Fetch there was answered with
the high watermark from before the freeze (1, while etcd and B said 2) and no error, so a
consumer reading at A missed the record. Now A gives the partition up as it wakes, as the
keepalive's "lease not found" would make it do, and registers on a new session; its own
revoke at a graceful stop, which deletes its registration too, is no loss.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from harness.batches import make_batch
from harness.brokers import STEADY_SESSION_TTL_S, BrokerCluster
from harness.children import freeze
from harness.etcd import harness_etcd, lease_remaining_s
from harness.kafka_wire import (
    FETCH,
    PRODUCE,
    KafkaWire,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
    while_leader_moves,
)
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOPIC = "woken"
WAIT_S = 120.0  # bound of the waits that are not the point (a loaded machine); none is a speed

REGISTRATION_DELETED = "etcd deleted this broker's registration"

TTL_S = 120
"""A's session: a keepalive every 40 s. The old code learnt of the revoke only from one, so
until A's next keepalive (computed from etcd's view of the lease, ``quiet_until``) it provably
went on as owner; that window is the bound of the one wait below that is the point."""

WINDOW_S = 25.0
"""The least time from the revoke to A's next keepalive that the test starts with: the
freeze, B's claim and produce (seconds on a loaded machine), then A's reaction, must fit."""


def in_etcd(url: str, work: Callable[[Etcd], Any]) -> Any:
    """``work`` done by a client of the test's own."""

    async def run() -> Any:
        client = await harness_etcd(url)
        try:
            return await work(client)
        finally:
            await client.close()

    return asyncio.run(run())


def registration_lease(url: str, cluster: str, node_id: int) -> int | None:
    async def read(client: Etcd) -> int | None:
        kv = await client.get(keys.broker_key(cluster, node_id))
        return None if kv is None else kv.lease

    return in_etcd(url, read)  # type: ignore[no-any-return]


def holder(url: str, cluster: str) -> int | None:
    """The broker holding partition 0's lease in etcd (None: nobody)."""

    async def read(client: Etcd) -> int | None:
        kv = await client.get(keys.partition_lease_key(cluster, TOPIC, 0))
        return None if kv is None else int(kv.value)

    return in_etcd(url, read)  # type: ignore[no-any-return]


def wait_for(condition: Callable[[], bool], what: str, broker: BrokerProcess) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}\n{broker.tail()}"
        time.sleep(0.2)


def quiet_until(url: str, lease: int) -> float:
    """A monotonic time before which A sends no keepalive, at least ``WINDOW_S`` from now.

    etcd's remaining TTL (whole seconds, so up to 1 s off) tells when it last renewed the
    lease; A's next keepalive goes out TTL/3 after that renewal's answer, not sooner
    (``SessionLease._keep_alive``). Waits for a fresh renewal if the next one is too near."""
    while True:
        now = time.monotonic()
        since_renewal_s = TTL_S - lease_remaining_s(url, lease) + 1
        until = now - since_renewal_s + TTL_S / 3
        if until - time.monotonic() >= WINDOW_S:
            return until
        time.sleep(1.0)


def produce(wire: KafkaWire, value: bytes) -> int:
    """The error code of one produce to partition 0, retried while its leader moves."""
    body = produce_body(TOPIC, 0, make_batch(0, [value]))
    return while_leader_moves(lambda: produce_partition(wire.request(PRODUCE, 9, body)))[0]


def fetched(wire: KafkaWire) -> tuple[int, int]:
    """(error code, high watermark) of a Fetch of partition 0 from offset 0."""
    answer = fetch_partition(wire.request(FETCH, 11, fetch_body(TOPIC, 0, 0)))
    return int(answer.error_code), int(answer.high_watermark)


def test_a_broker_woken_from_a_freeze_gives_up_what_etcd_took_at_once(
    broker_cluster: BrokerCluster,
) -> None:
    cluster, url = broker_cluster.cluster, broker_cluster.etcd_url
    # No assignment written: a partition is claimed by the produce that reaches a broker, and
    # nothing but the session's end makes A let go of its partition.
    a = broker_cluster.start(
        KAFSCALE_ETCD__SESSION_TTL_S=str(TTL_S), KAFSCALE_ASSIGNMENT__SELF_ASSIGN="false"
    )
    b = broker_cluster.start(
        KAFSCALE_ETCD__SESSION_TTL_S=STEADY_SESSION_TTL_S, KAFSCALE_ASSIGNMENT__SELF_ASSIGN="false"
    )
    create_topics(a.bootstrap, [TOPIC], partitions=1)
    with (
        KafkaWire(a.bootstrap, timeout_s=WAIT_S) as at_a,
        KafkaWire(b.bootstrap, timeout_s=WAIT_S) as at_b,
    ):
        assert produce(at_a, b"one") == ErrorCode.NONE  # A claims the partition
        assert holder(url, cluster) == a.node_id
        assert fetched(at_a) == (ErrorCode.NONE, 1)
        lease = registration_lease(url, cluster, a.node_id)
        assert lease
        deadline = quiet_until(url, lease)
        freeze(a.pid)
        try:
            in_etcd(url, lambda client: client.revoke_lease(lease))
            wait_for(lambda: holder(url, cluster) is None, "etcd deleted A's partition lease", b)
            assert produce(at_b, b"two") == ErrorCode.NONE  # B claims it on demand
            assert holder(url, cluster) == b.node_id
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert time.monotonic() < deadline, "the set-up outlasted the window it computed"

        # The one bounded wait that is the point: A must stop answering from its memory before
        # its next keepalive could have told it (old code: (0, 1) until then).
        answers = [fetched(at_a)]
        while answers[-1] == (ErrorCode.NONE, 1) and time.monotonic() < deadline:
            time.sleep(0.1)
            answers.append(fetched(at_a))
        code, high_watermark = answers[-1]
        assert (code, high_watermark) != (ErrorCode.NONE, 1), (
            f"A still serves the partition from its memory: {answers[-3:]}\n{a.tail()}"
        )
        # what it answers instead: etcd's high watermark, or a retriable error
        assert high_watermark == 2 or code == ErrorCode.NOT_LEADER_OR_FOLLOWER, answers[-3:]
        log = a.log_path.read_text(errors="replace")
        assert REGISTRATION_DELETED in log, a.tail()

        # and it comes back on a new session, serving every acked record
        wait_for(
            lambda: registration_lease(url, cluster, a.node_id) not in (None, lease),
            "A registered on a new session",
            a,
        )
        assert fetched(at_a) == (ErrorCode.NONE, 2)
    # Its own revoke at a graceful stop deletes its registration too: no loss, no new session.
    assert a.stop(timeout_s=WAIT_S) == 0
    log = a.log_path.read_text(errors="replace")
    assert log.count(REGISTRATION_DELETED) == 1, a.tail()
    assert log.count("etcd session lost") == 1, a.tail()
