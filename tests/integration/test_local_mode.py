"""``kafscale local``: the README's first command, end to end.

A real etcd from the bundled binary, brokers on consecutive ports and a local-directory object
store under the data dir; Ctrl-C (SIGINT) shuts down cleanly and the data survives a restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from kafscale.broker.child_process import KAFSCALE
from kafscale.broker.metadata.embedded_etcd import free_port

pytestmark = pytest.mark.integration


def free_port_pair() -> int:
    """A port p with p + 1 free too (local brokers listen on consecutive ports)."""
    import socket

    for _ in range(50):
        port = free_port()
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        return port
    raise RuntimeError("no two consecutive free ports")


def start_local(data_dir: Path, port: int, brokers: int, log: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            KAFSCALE,
            "local",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--brokers",
            str(brokers),
            "--log-flush-interval-ms",
            "50",
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal gives it
    )
    deadline = time.monotonic() + 60
    while "KafScale is running" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)
    return process


def stop_with_ctrl_c(process: subprocess.Popen[bytes]) -> int:
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group, children included."""
    os.killpg(process.pid, signal.SIGINT)
    return process.wait(60)


def consume(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "local-test", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    return values


def test_local_cluster_serves_clients_and_keeps_data_across_restarts(tmp_path: Path) -> None:
    data_dir, log = tmp_path / "data", tmp_path / "local.log"
    port = free_port_pair()
    process = start_local(data_dir, port, brokers=2, log=log)
    try:
        banner = log.read_text()
        assert f"bootstrap.servers = localhost:{port},localhost:{port + 1}" in banner
        producer = Producer({"bootstrap.servers": f"localhost:{port}", "linger.ms": 5})
        for i in range(200):
            producer.produce("local-demo", value=b"v%d" % i)
        assert producer.flush(30) == 0
        values = consume(f"localhost:{port + 1}", "local-demo", 3, 200)
        assert sorted(values) == sorted(b"v%d" % i for i in range(200))
    finally:
        exit_code = stop_with_ctrl_c(process)
    assert exit_code == 0, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()
    assert (data_dir / "etcd").is_dir() and (data_dir / "objects").is_dir()

    process = start_local(data_dir, port, brokers=1, log=log)
    try:
        values = consume(f"localhost:{port}", "local-demo", 3, 200)
        assert sorted(values) == sorted(b"v%d" % i for i in range(200))
    finally:
        assert stop_with_ctrl_c(process) == 0
