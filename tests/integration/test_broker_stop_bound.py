"""A broker told to stop exits by its bound, whatever etcd does; with etcd answering, gracefully.

``kafscale broker`` promises to exit within ``stop_bound_s(limits.shutdown_grace_s)`` of
SIGTERM (grace + 5 s; the watchdog thread acts ``THREAD_SLACK_S`` later still): a supervisor
outside Kubernetes, ``kafscale local`` or a test harness waits for the process, and inside it a
pod that outlives its grace period is killed mid-way. Real broker processes on a real etcd of
the test's own, which the test freezes with SIGSTOP or restarts.

Before the bound, a broker stopped while etcd was frozen waited for each etcd call's own
timeout in turn (the session revoke twice, the clients' close: over a minute with a 30-s etcd
timeout), and one stopped right after an etcd restart could wait forever in its cluster view's
close (test_proxy_routes in CI; ``tests/unit/test_view_close.py`` has the mechanism).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from harness.brokers import BrokerCluster, new_cluster
from harness.children import freeze
from harness.etcd import running_etcd
from harness.kafka_wire import FETCH, KafkaWire, fetch_body
from harness.s3 import S3Endpoint
from harness.s3_proxy import s3_proxy
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.stop_deadline import EXIT_STOP_DEADLINE, THREAD_SLACK_S, stop_bound_s

pytestmark = pytest.mark.integration

GRACE_S = 1.0  # what is waited out with etcd frozen, with CLOSE_MARGIN_S: not the point
RESTART_GRACE_S = 5.0  # the harness's own: enough for a handoff on a loaded machine
SCHEDULING_SLACK_S = 15.0
"""Beyond the promised bound, for a loaded machine to run the exit and reap the process: a
margin on the wait, not a speed."""


@pytest.fixture
def etcd_of_its_own() -> Iterator[EmbeddedEtcd]:
    """An etcd this test freezes and restarts (no other test's processes use it)."""
    with running_etcd() as server:
        yield server


@pytest.fixture
def cluster(
    etcd_of_its_own: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[BrokerCluster]:
    brokers = new_cluster(etcd_of_its_own.client_url, s3_server, tmp_path, "stop")
    try:
        yield brokers
    finally:
        brokers.stop_all()


def stopped_within(broker: BrokerProcess, bound_s: float) -> int:
    """SIGTERM, then the exit code; fails (with the log's tail) if the process outlives
    ``bound_s`` + the scheduling slack."""
    broker.signal(signal.SIGTERM)
    try:
        return broker.wait(bound_s + SCHEDULING_SLACK_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"broker still running {bound_s + SCHEDULING_SLACK_S:g} s after SIGTERM "
            f"(promised: {bound_s:g} s):\n{broker.tail()}"
        ) from None


def test_a_broker_exits_by_its_bound_while_etcd_is_frozen(
    cluster: BrokerCluster, etcd_of_its_own: EmbeddedEtcd
) -> None:
    """etcd frozen for the whole stop, calls that would each wait 30 s for it: the handoff
    cannot happen (the leases expire with the session TTL, as after a crash), and the
    process still ends by its bound."""
    env = {"KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": str(GRACE_S), "KAFSCALE_ETCD__TIMEOUT_S": "30"}
    broker = cluster.start(**env)
    create_topics(broker.bootstrap, ["stop-frozen"], 4)
    pid = etcd_of_its_own.pid
    assert pid is not None
    freeze(pid)  # stopped before the SIGTERM: the stop must find it silent
    try:
        code = stopped_within(broker, stop_bound_s(GRACE_S) + THREAD_SLACK_S)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert code in (0, EXIT_STOP_DEADLINE), broker.tail()
    assert "stopping took over" in broker.tail(200)  # it says what it was waiting on


def test_a_broker_stopped_as_etcd_comes_back_hands_off_gracefully(
    cluster: BrokerCluster, etcd_of_its_own: EmbeddedEtcd
) -> None:
    """etcd killed, restarted and frozen for a moment, then SIGTERM (what test_proxy_routes
    does): every watch is being re-created as etcd answers again. The stop is the graceful
    one (exit 0, not cut short by the bound), each of several times."""
    env = {"KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": str(RESTART_GRACE_S)}
    brokers = [cluster.start(**env), cluster.start(**env)]
    create_topics(brokers[0].bootstrap, ["stop-restart"], 6)
    for freeze_s in (1.0, 1.8, 1.0, 1.8):
        etcd_of_its_own.kill()
        etcd_of_its_own.start()
        pid = etcd_of_its_own.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        time.sleep(freeze_s)  # how long etcd stays frozen: the scenario, not a wait
        os.kill(pid, signal.SIGCONT)
        code = stopped_within(brokers[1], stop_bound_s(RESTART_GRACE_S) + THREAD_SLACK_S)
        assert code == 0, f"the stop was cut short by its bound:\n{brokers[1].tail(120)}"
        assert "broker stopped" in brokers[1].tail()
        brokers[1] = cluster.start(port=brokers[1].port, **env)


SLOW_GRACE_S = 12.0
HELD_UPLOAD_S = 6.0
"""How long the S3 proxy holds the hand-off's upload: under the hand-off's share of the grace
(``HANDOFF_SHARE`` x 12 = 9 s), so the hand-off completes; and with the grace that the long
poll then took as well (each step used to get the whole grace), over the stop bound."""


def test_a_stop_still_making_progress_ends_by_its_grace_not_its_bound(
    broker_cluster: BrokerCluster,
) -> None:
    """A hand-off whose upload takes 6 s (S3 slow, but answering), then a long poll still in
    flight: both steps progress, and the stop is the graceful one (exit 0) with the produce
    the hand-off flushed acknowledged. Each step used to get the whole grace in turn, 6 s of
    hand-off then 12 s of waiting for the long poll: past grace + 5 s the stop was cut (124)."""
    with s3_proxy(broker_cluster.s3.url, HELD_UPLOAD_S) as s3:
        broker = broker_cluster.start(
            KAFSCALE_STORAGE__ENDPOINT=s3.url,
            KAFSCALE_LIMITS__SHUTDOWN_GRACE_S=str(SLOW_GRACE_S),
        )
        create_topics(broker.bootstrap, ["slow-handoff", "long-poll"], 1)
        s3.hold = re.compile(r"/topics/slow-handoff/.*\.kfs")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "1"})
        acked: list[KafkaError | None] = []
        producer.produce("slow-handoff", b"flushed by the hand-off", on_delivery=acked_into(acked))
        producer.poll(0)
        wait_for(lambda: bool(s3.held), "the upload is held (the hand-off will wait for it)")
        with KafkaWire(broker.bootstrap) as wire:
            # A consumer's long poll on an empty partition: in flight until its 60 s are up.
            wire.send(FETCH, 12, fetch_body("long-poll", 0, 0, max_wait_ms=60_000))
            code = stopped_within(broker, stop_bound_s(SLOW_GRACE_S) + THREAD_SLACK_S)
        assert code == 0, f"the stop was cut short by its bound:\n{broker.tail(120)}"
        assert "broker stopped" in broker.tail()
        assert "handoff at shutdown did not complete" not in broker.log_path.read_text()
        producer.flush(30)
        assert acked == [None], acked  # the hand-off committed the held upload, then acked it


def acked_into(outcomes: list[KafkaError | None]) -> Callable[[KafkaError | None, Message], None]:
    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        outcomes.append(error)

    return on_delivery


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.05)
