"""``kafscale local --brokers 3 --proxy``: the README's proxy command, end to end.

The proxy takes the given port and the brokers the next three; the banner says so; a client
given only the proxy's address produces and reads back, and sees the proxy as the only broker.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from harness import children
from harness.children import settings_free_env
from harness.kafka_wire import API_VERSIONS, KafkaWire
from harness.local_mode import consume, launch_local, stop_with_ctrl_c, wait_running
from harness.ports import free_port_run
from harness.tls import make_pki
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

pytestmark = pytest.mark.integration


def test_local_with_proxy_serves_clients_through_one_port(tmp_path: Path) -> None:
    port = free_port_run(4)
    log = tmp_path / "local.log"
    process = launch_local(
        [
            *("--brokers", "3", "--proxy", "--port", str(port)),
            *("--data-dir", str(tmp_path / "data"), "--log-flush-interval-ms", "50"),
        ],
        log,
    )
    try:
        banner = wait_running(process, log)
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


def test_clients_coming_and_going_leave_no_warnings_in_the_log(tmp_path: Path) -> None:
    """With the authorizer on, the proxy opens upstream connections (TLS, its certificate)
    per client connection and closes them with it: the brokers log no warning per closed
    connection (asyncio's "returning true from eof_received() has no effect when using ssl"
    filled the log, once per client), and nothing logs a traceback."""
    port = free_port_run(2)
    log = tmp_path / "local.log"
    process = launch_local(
        [
            *("--brokers", "1", "--proxy", "--port", str(port)),
            *("--data-dir", str(tmp_path / "data")),
            *(
                "--authorizer-enabled",
                "true",
                "--authorizer-allow-everyone-if-no-acl-found",
                "true",
            ),
        ],
        log,
    )
    try:
        wait_running(process, log)
        bootstrap = f"localhost:{port}"
        creator = AdminClient({"bootstrap.servers": bootstrap})
        creator.create_topics([NewTopic("comings", 1, 1)])["comings"].result(30)
        for _ in range(3):
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                described = admin.describe_configs(
                    [ConfigResource(ConfigResourceType.TOPIC, "comings")]
                )
                assert len(described) == 1
            finally:
                admin.close()
        time.sleep(1)  # the brokers see the upstream connections close
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")
    text = log.read_text(errors="replace")
    assert "eof_received" not in text and "Traceback" not in text, text


def test_local_proxy_with_sasl_ssl_and_acls_guards_the_brokers_behind_it(tmp_path: Path) -> None:
    """``kafscale local --proxy`` with a SASL_SSL listener and the authorizer on: clients log
    in at the proxy and get their own ACLs; the broker behind it takes only the proxy's
    certificate (made at start-up), so no one else may reach it, let alone forward."""
    port = free_port_run(2)
    pki = make_pki(tmp_path / "pki")
    log = tmp_path / "local.log"
    process = launch_local(
        [
            *("--proxy", "--port", str(port)),
            *("--data-dir", str(tmp_path / "data"), "--log-flush-interval-ms", "50"),
            *("--listeners", f"EXTERNAL://127.0.0.1:{port}"),
            *("--advertised-listeners", f"EXTERNAL://localhost:{port}"),
            *("--listener-security-protocol-map", "EXTERNAL:SASL_SSL"),
            *("--tls-cert-file", str(pki.server.cert), "--tls-key-file", str(pki.server.key)),
            *("--authorizer-enabled", "true"),
        ],
        log,
    )
    try:
        banner = wait_running(process, log)
        assert f"bootstrap.servers = localhost:{port}\n" in banner
        assert "security.protocol = SASL_SSL" in banner
        etcd_url = re.search(r"etcd\s+= (\S+)", banner)
        assert etcd_url is not None
        env = settings_free_env()
        env["KAFSCALE_ETCD__ENDPOINTS"] = json.dumps([etcd_url[1]])
        cli = [sys.executable, "-m", "kafscale.broker.cli"]
        children.run(
            [*cli, "users", "create", "alice", "--password-stdin"],
            input="alice-local-secret",
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        grant = ["acls", "add", "--topic", "mine", "--principal", "User:alice", "--operation"]
        for operation in ("CREATE", "WRITE", "READ"):
            children.run(
                [*cli, *grant, operation],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
        config = {
            "bootstrap.servers": f"localhost:{port}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-local-secret",
            "ssl.ca.location": str(pki.ca.cert_path),
        }
        outcomes: list[Any] = []
        producer = Producer({**config, "message.timeout.ms": 20_000})
        for topic in ("mine", "theirs"):
            producer.produce(topic, value=b"v", on_delivery=lambda e, _m: outcomes.append(e))
            producer.flush(30)
        mine, theirs = outcomes
        assert mine is None
        assert theirs is not None and theirs.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        with KafkaWire(f"127.0.0.1:{port + 1}") as wire:  # the broker: TLS, certificate only
            wire.send(API_VERSIONS, 3, {"client_software_name": "t"})
            assert wire.is_closed_by_peer()
    finally:
        if process.poll() is None:
            assert stop_with_ctrl_c(process) == 0, log.read_text(errors="replace")
