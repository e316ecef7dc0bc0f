"""``kafscale local --brokers 3 --proxy``: the README's proxy command, end to end.

The proxy takes the given port and the brokers the next three; the banner says so; a client
given only the proxy's address produces and reads back, and sees the proxy as the only broker.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from integration.test_local_mode import consume, stop_with_ctrl_c

from kafscale.broker.child_process import KAFSCALE
from kafscale.broker.metadata.embedded_etcd import free_port

pytestmark = pytest.mark.integration


def free_ports(count: int) -> int:
    """A port p with p + 1 ... p + count - 1 free too."""
    for _ in range(50):
        port = free_port()
        try:
            for offset in range(1, count):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} consecutive free ports")


def test_local_with_proxy_serves_clients_through_one_port(tmp_path: Path) -> None:
    port = free_ports(4)
    log = tmp_path / "local.log"
    process = subprocess.Popen(
        [
            *(KAFSCALE, "local", "--brokers", "3", "--proxy", "--port", str(port)),
            *("--data-dir", str(tmp_path / "data"), "--log-flush-interval-ms", "50"),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while "KafScale is running" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        banner = log.read_text()
        assert f"bootstrap.servers = localhost:{port}\n" in banner
        assert f"behind the proxy, on ports {port + 1}, {port + 2}, {port + 3}" in banner
        bootstrap = f"localhost:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("local-proxied", 3, 1)])["local-proxied"].result(30)
        assert set(admin.list_topics(timeout=10).brokers) == {1000}
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        for i in range(30):
            producer.produce("local-proxied", value=f"v{i}".encode(), partition=i % 3)
        assert producer.flush(30) == 0
        values = consume(bootstrap, "local-proxied", 3, 30)
        assert sorted(values) == sorted(f"v{i}".encode() for i in range(30))
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")
