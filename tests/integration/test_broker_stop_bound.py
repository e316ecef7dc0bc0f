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
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import running_etcd
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.stop_deadline import EXIT_STOP_DEADLINE, THREAD_SLACK_S, stop_bound_s

pytestmark = pytest.mark.integration

GRACE_S = 2.0
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
    os.kill(pid, signal.SIGSTOP)
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
