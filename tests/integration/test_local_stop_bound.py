"""Ctrl-C ends ``kafscale local`` by its bound even when its embedded etcd is frozen.

``kafscale local`` (brokers, a proxy and an etcd child in one process) promises what
``kafscale broker`` does: it exits within ``stop_bound_s(limits.shutdown_grace_s)`` of SIGINT
or SIGTERM (the watchdog thread acts ``THREAD_SLACK_S`` later still), whatever a part waits on.
A real ``kafscale local`` run as a terminal's job; its etcd child, found through ``/proc``, is
SIGSTOPped before the Ctrl-C. Before the bound, its stop waited for each etcd call's own
timeout in turn (30 s here) and then for etcd's own stop: well over a minute.

The graceful path (everything answers: exit 0, data kept across restarts) is
``test_local_mode.py``'s; here only its bound: the proxy and every broker share the one grace
from the Ctrl-C (``test_ctrl_c_stops_the_proxy_and_brokers_within_one_grace``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.children import freeze
from harness.kafka_wire import API_VERSIONS, FETCH, KafkaWire, fetch_body
from harness.local_mode import consume, launch_local, wait_running
from harness.ports import free_port_run
from harness.topics import create_topics

from kafscale.broker.metadata.embedded_etcd import etcd_pids_on
from kafscale.broker.protocol import codec
from kafscale.broker.stop_deadline import EXIT_STOP_DEADLINE, THREAD_SLACK_S, stop_bound_s

pytestmark = pytest.mark.integration

GRACE_S = 1.0  # what is waited out with etcd frozen, with CLOSE_MARGIN_S: not the point
ETCD_TIMEOUT_S = 30.0  # each etcd call would wait this long for the frozen etcd
SCHEDULING_SLACK_S = 15.0
"""Beyond the promised bound, for a loaded machine to run the exit and reap the process: a
margin on the wait, not a speed."""


def etcd_pids(data_dir: Path) -> list[int]:
    return etcd_pids_on(data_dir.resolve() / "etcd" / "etcd")


def wait_gone(data_dir: Path, timeout_s: float = 60.0) -> bool:
    """Whether no etcd runs on ``data_dir`` within ``timeout_s`` (a bound, not a speed)."""
    deadline = time.monotonic() + timeout_s
    while etcd_pids(data_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def frozen() -> Iterator[list[int]]:
    """Pids the test SIGSTOPs: continued at the end whatever happens (SIGKILL needs no
    SIGCONT, but one that outlived its parent must not stay frozen)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def start(
    data_dir: Path, port: int, brokers: int, proxy: bool, log: Path, grace_s: float = GRACE_S
) -> subprocess.Popen[bytes]:
    process = launch_local(
        [
            *("--data-dir", str(data_dir), "--port", str(port), "--brokers", str(brokers)),
            *(["--proxy"] if proxy else []),
            *("--limits-shutdown-grace-s", str(grace_s)),
            *("--etcd-timeout-s", str(ETCD_TIMEOUT_S)),
        ],
        log,
    )
    wait_running(process, log)
    return process


def ctrl_c_exit_code(process: subprocess.Popen[bytes], wait_s: float, log: Path) -> int:
    """Ctrl-C to the process group; the exit code, or a failure (with the log) if it is still
    running ``wait_s`` later (then killed: never left running)."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        return process.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        raise AssertionError(
            f"kafscale local still running {wait_s:g} s after Ctrl-C:\n{log.read_text()[-6000:]}"
        ) from None


def produce_acked(bootstrap: str, topic: str, count: int) -> list[bytes]:
    acked: list[bytes] = []

    def on_delivery(error: object, message: Any) -> None:
        if error is None:
            acked.append(message.value())

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, value=b"f%d" % i, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    return acked


# Two brokers without the proxy stop as the two behind it do (``_stop_all``: the proxy only
# adds a part to the same deadline), so (2, True) covers them too.
@pytest.mark.parametrize(("brokers", "proxy"), [(1, False), (2, True)])
def test_ctrl_c_ends_local_by_its_bound_while_its_etcd_is_frozen(
    tmp_path: Path, frozen: list[int], brokers: int, proxy: bool
) -> None:
    """etcd frozen for the whole stop: the handoff cannot happen and the process still ends by
    its bound, saying what it waited on; its etcd goes with it, and a restart serves every
    record acked before."""
    data_dir, log = tmp_path / "data", tmp_path / "local.log"
    port = free_port_run(brokers + 1 if proxy else brokers)
    process = start(data_dir, port, brokers, proxy, log)
    try:
        acked = produce_acked(f"localhost:{port}", "frozen-stop", 200)
        assert len(acked) == 200
        [etcd_pid] = etcd_pids(data_dir)
        frozen.append(etcd_pid)
        freeze(etcd_pid)  # stopped before the Ctrl-C: the stop must find it silent
        bound_s = stop_bound_s(GRACE_S) + THREAD_SLACK_S
        code = ctrl_c_exit_code(process, bound_s + SCHEDULING_SLACK_S, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    text = log.read_text()
    assert code == EXIT_STOP_DEADLINE, text[-6000:]
    assert "stopping took over" in text or "still running" in text, text[-6000:]
    # The kernel sends the etcd SIGTERM when kafscale local dies (a SIGKILL could lose answered
    # writes: test_etcd_parent_death.py); woken first, it stops by itself, a moment later.
    assert wait_gone(data_dir), "the frozen etcd outlived kafscale local"

    restart_log = tmp_path / "restart.log"
    again = ["--data-dir", str(data_dir), "--port", str(port), *(["--proxy"] if proxy else [])]
    restarted = launch_local(again, restart_log)
    try:
        wait_running(restarted, restart_log)
        values = consume(f"localhost:{port}", "frozen-stop", 3, len(acked))
        assert sorted(values) == sorted(acked)
    finally:
        code = ctrl_c_exit_code(restarted, 60, restart_log)
    assert code == 0, restart_log.read_text()


LONG_POLL_GRACE_S = 8.0
"""Over ``CLOSE_MARGIN_S``: two graces in turn (the proxy's, then the brokers') outlive the
bound of one grace + 5 s."""


def long_poll(bootstrap: str, topic: str, partition: int) -> KafkaWire:
    """A connection with a consumer's long poll in flight (an empty partition, 60 s of
    max wait): ApiVersions and the Fetch go in one write, and ApiVersions' answer says the
    server has read them, so the Fetch is in flight, not still in the socket."""
    wire = KafkaWire(bootstrap)
    fetch = fetch_body(topic, partition, 0, max_wait_ms=60_000)
    wire.send_raw(
        codec.encode_request(API_VERSIONS, 3, wire.next_correlation_id(), {})
        + codec.encode_request(FETCH, 12, wire.next_correlation_id(), fetch)
    )
    wire.recv(API_VERSIONS, 3)
    return wire


def test_ctrl_c_stops_the_proxy_and_brokers_within_one_grace(tmp_path: Path) -> None:
    """Long polls in flight on the proxy and on each of three brokers (a client that reached
    the brokers' own ports): each part waits for its requests until the one grace after the
    Ctrl-C, together, and the stop is the graceful one (exit 0). The proxy used to get a whole
    grace of its own and the brokers a second one after it: past grace + 5 s the stop was cut
    (exit 124, "stopping took over")."""
    data_dir, log = tmp_path / "data", tmp_path / "local.log"
    brokers = 3
    port = free_port_run(brokers + 1)
    process = start(data_dir, port, brokers, True, log, LONG_POLL_GRACE_S)
    wires: list[KafkaWire] = []
    try:
        create_topics(f"localhost:{port}", ["idle"], brokers)
        wires.append(long_poll(f"localhost:{port}", "idle", 0))
        wires += [long_poll(f"localhost:{port + 1 + i}", "idle", i) for i in range(brokers)]
        bound_s = stop_bound_s(LONG_POLL_GRACE_S) + THREAD_SLACK_S
        code = ctrl_c_exit_code(process, bound_s + SCHEDULING_SLACK_S, log)
    finally:
        for wire in wires:
            wire.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
    text = log.read_text()
    assert code == 0, f"the stop was cut short by its bound:\n{text[-6000:]}"
    assert text.count("broker stopped") == brokers and "proxy stopped" in text, text[-6000:]
