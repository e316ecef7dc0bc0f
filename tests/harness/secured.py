"""Secured test clusters: certificates, SASL users, ACLs and topics made the way an operator
makes them (the ``kafscale`` CLI straight to etcd), and brokers with several listeners on free
loopback ports.

The secured-broker, secured-proxy and secured-transaction tests all build their clusters from
these pieces, so a change to how a secured broker is configured is made once.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from harness import children
from harness.brokers import BrokerCluster, new_cluster
from harness.children import settings_free_env
from harness.etcd import harness_etcd
from harness.s3 import S3Endpoint
from harness.tls import Pair, TestPki, make_pki
from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.metadata import topics

CONSUME_TIMEOUT_S = 30.0
ANONYMOUS = "User:ANONYMOUS"
AUTHORIZER_ON = {"KAFSCALE_AUTHORIZER__ENABLED": "true"}


def secured_cluster(
    etcd_url: str, s3: S3Endpoint, workdir: Path, label: str
) -> tuple[BrokerCluster, TestPki]:
    """A cluster of its own (fresh name and bucket, no brokers yet) and a test PKI whose
    server certificate names 127.0.0.1 and localhost."""
    return new_cluster(etcd_url, s3, workdir, label), make_pki(workdir / "pki")


@contextmanager
def authorizing_cluster(
    etcd_url: str,
    s3: S3Endpoint,
    workdir: Path,
    label: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[BrokerCluster]:
    """A cluster of its own with one started broker that checks every request against the
    ACLs in etcd (none yet: a plaintext client is ANONYMOUS and may do nothing)."""
    cluster = new_cluster(
        etcd_url, s3, workdir, label, extra_env={**AUTHORIZER_ON, **(extra_env or {})}
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def grant_cluster(cluster: BrokerCluster, *operations: str, principal: str = ANONYMOUS) -> None:
    """ACLs allowing ``principal`` each of ``operations`` on the cluster, as an operator adds
    them (``kafscale acls add --cluster-resource``)."""
    for operation in operations:
        kafscale_cli(
            cluster.etcd_url,
            cluster.cluster,
            "acls",
            "add",
            "--cluster-resource",
            "--principal",
            principal,
            "--operation",
            operation,
        )


def _cli_env(etcd_url: str, cluster: str) -> dict[str, str]:
    """The environment of a ``kafscale`` command run against the cluster's etcd."""
    env = settings_free_env()
    env.update({"KAFSCALE_CLUSTER": cluster, "KAFSCALE_ETCD__ENDPOINTS": json.dumps([etcd_url])})
    return env


def kafscale_cli(etcd_url: str, cluster: str, *args: str, stdin: str = "") -> str:
    """Run ``kafscale <args>`` (users, acls...) against the cluster's etcd, as an operator
    runs it; its standard output, or a failed test when it fails."""
    done = children.run(
        [sys.executable, "-m", "kafscale.broker.cli", *args],
        input=stdin,
        env=_cli_env(etcd_url, cluster),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


_RUN_CALLS = """
import io, json, sys
from kafscale.broker.cli import main
for argv, stdin in json.load(sys.stdin):
    sys.stdin = io.StringIO(stdin)
    code = main(argv)
    if code:
        sys.exit(f"kafscale {' '.join(argv)}: exit {code}")
"""


def kafscale_cli_calls(
    etcd_url: str, cluster: str, calls: Sequence[tuple[Sequence[str], str]]
) -> None:
    """Several ``kafscale`` commands (``(args, stdin)`` each) run one after the other through
    the CLI's own ``main`` in one Python process: the same code and settings as
    ``kafscale_cli``, without a Python start-up (~1.5 s of CPU) per command, for fixtures
    that set up many users and ACLs."""
    done = children.run(
        [sys.executable, "-c", _RUN_CALLS],
        input=json.dumps([[list(args), stdin] for args, stdin in calls]),
        env=_cli_env(etcd_url, cluster),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def create_user(etcd_url: str, cluster: str, user: str, password: str) -> None:
    """A SCRAM user (both mechanisms), made with ``kafscale users create``."""
    kafscale_cli(etcd_url, cluster, "users", "create", user, "--password-stdin", stdin=password)


def make_topics(etcd_url: str, cluster: str, partitions: int, *names: str) -> None:
    """Topics written straight to etcd: no client needs the rights to create them."""

    async def run() -> None:
        etcd = await harness_etcd(etcd_url)
        try:
            for name in names:
                await topics.create_topic(etcd, cluster, name, partitions, {})
        finally:
            await etcd.close()

    asyncio.run(run())


def tls_env(pki: TestPki) -> dict[str, str]:
    """The server certificate of TLS listeners, and the CA client certificates chain to."""
    return {
        "KAFSCALE_TLS__CERT_FILE": str(pki.server.cert),
        "KAFSCALE_TLS__KEY_FILE": str(pki.server.key),
        "KAFSCALE_TLS__CA_FILE": str(pki.ca.cert_path),
    }


def upstream_tls_env(pki: TestPki, client: Pair) -> dict[str, str]:
    """A proxy reaching the brokers over SSL, presenting ``client``."""
    return {
        "KAFSCALE_UPSTREAM__SECURITY_PROTOCOL": "SSL",
        "KAFSCALE_UPSTREAM__CA_FILE": str(pki.ca.cert_path),
        "KAFSCALE_UPSTREAM__CERT_FILE": str(client.cert),
        "KAFSCALE_UPSTREAM__KEY_FILE": str(client.key),
    }


def listeners_env(ports: Mapping[str, int]) -> str:
    """``KAFSCALE_LISTENERS`` for listeners named in ``ports``, all on 127.0.0.1."""
    return ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())


def add_broker(
    cluster: BrokerCluster,
    ports: Mapping[str, int],
    main: str,
    log_name: str,
    admin_token: str | None = None,
    **env: str,
) -> BrokerProcess:
    """A broker (not started yet) with a listener per entry of ``ports``; ``main`` is the one
    its readiness and ``bootstrap`` use. It is killed with the cluster at teardown."""
    admin_port = free_port_run(avoid=ports.values())
    broker = BrokerProcess(
        env=cluster.env(ports[main], admin_port, KAFSCALE_LISTENERS=listeners_env(ports), **env),
        log_path=cluster.workdir / log_name,
        port=ports[main],
        admin_port=admin_port,
        admin_token=admin_token,
    )
    cluster.brokers.append(broker)
    return broker


def confluent_sasl_ssl(
    bootstrap: str, user: str, password: str, ca: Path, mechanism: str
) -> dict[str, Any]:
    """confluent-kafka's settings for a SASL_SSL login."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca),
    }


_KAFKA_PYTHON_NAMES = {
    "bootstrap.servers": "bootstrap_servers",
    "security.protocol": "security_protocol",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
}


def kafka_python_sasl_ssl(
    bootstrap: str, user: str, password: str, ca: Path, mechanism: str
) -> dict[str, Any]:
    """The same SASL_SSL login in kafka-python's names."""
    config = confluent_sasl_ssl(bootstrap, user, password, ca, mechanism)
    return {_KAFKA_PYTHON_NAMES[name]: value for name, value in config.items()}


def confluent_mtls(bootstrap: str, pki: TestPki) -> dict[str, Any]:
    """confluent-kafka's settings for an SSL listener that requires a client certificate:
    alice's (``User:CN=alice,O=KafScale Test``)."""
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca.cert_path),
        "ssl.certificate.location": str(pki.alice.cert),
        "ssl.key.location": str(pki.alice.key),
    }


def consume_values(config: dict[str, Any], topic: str, count: int) -> list[bytes]:
    """Up to ``count`` values of ``topic`` from the start, read in a new group (whose offsets
    are committed); fewer if they do not come within ``CONSUME_TIMEOUT_S``."""
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return values


def consume_error(config: dict[str, Any], topic: str, group: str | None = None) -> int:
    """The error code a consumer of ``topic`` (in ``group``, else a new one) is answered with;
    a failed test if it reads a record or gets no error within ``CONSUME_TIMEOUT_S``."""
    group = group or f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error():
                return int(message.error().code())
            assert message is None, "a record from a topic the principal may not read"
        raise AssertionError("no authorization error")
    finally:
        consumer.close()
