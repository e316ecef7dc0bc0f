"""The proxy follows its upstream client certificate's files: on Kubernetes the operator (or
cert-manager) renews ``<name>-proxy-client-tls`` before it expires, and the proxy must present
the renewed certificate without a restart.

One broker with an ``INTERNAL`` SSL listener requiring client certificates and the authorizer
on; the proxy connects to it with ``CN=proxy-old`` and does not forward principals, so the
broker authorizes each request as the proxy's certificate. ``proxy-old`` may write topic OLD,
``proxy-new`` topic NEW. After the files are replaced by a ``proxy-new`` certificate from the
same CA, a new client connection (so a new upstream connection) writes NEW and is refused OLD,
while a client connected before keeps its upstream connection and its old certificate.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from cryptography.x509.oid import NameOID
from harness.brokers import BrokerCluster, _create_bucket
from harness.proxy import proxy_env
from harness.s3 import S3Endpoint, unique_bucket
from harness.tls import Pair, TestPki, issue, make_pki

from kafscale.broker.child_process import KAFSCALE, BrokerProcess
from kafscale.broker.metadata import topics
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, free_port
from kafscale.broker.metadata.etcd import Etcd

pytestmark = pytest.mark.integration

RELOAD_WAIT_S = 30.0


def _grant_write(etcd_url: str, cluster: str, topic: str, principal: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    env.update({"KAFSCALE_CLUSTER": cluster, "KAFSCALE_ETCD__ENDPOINTS": json.dumps([etcd_url])})
    done = subprocess.run(
        [sys.executable, "-m", "kafscale.broker.cli", "acls", "add", "--topic", topic,
         "--principal", principal, "--operation", "WRITE"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _make_topics(etcd_url: str, cluster: str, *names: str) -> None:
    async def run() -> None:
        etcd = await Etcd.connect([etcd_url], timeout_s=5)
        try:
            for name in names:
                await topics.create_topic(etcd, cluster, name, 1, {})
        finally:
            await etcd.close()

    asyncio.run(run())


@dataclass
class Rotating:
    proxy: BrokerProcess
    pki: TestPki
    proxy_cert: Pair
    topic_old: str
    topic_new: str

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


@pytest.fixture
def rotating(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> Iterator[Rotating]:
    pki = make_pki(tmp_path / "pki")
    proxy_cert = issue(pki.ca, tmp_path / "pki", "proxy", [(NameOID.COMMON_NAME, "proxy-old")])
    bucket = unique_bucket("prot")
    _create_bucket(s3_server, bucket)
    name = f"prot-{uuid.uuid4().hex[:8]}"
    etcd_url = etcd_server.client_url
    cluster = BrokerCluster(etcd_url, s3_server, bucket, name, tmp_path)
    topic_old, topic_new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    _make_topics(etcd_url, name, topic_old, topic_new)
    for topic, principal in ((topic_old, "User:CN=proxy-old"), (topic_new, "User:CN=proxy-new")):
        _grant_write(etcd_url, name, topic, principal)
    internal, admin = free_port(), free_port()
    broker = BrokerProcess(
        env=cluster.env(
            internal,
            admin,
            KAFSCALE_LISTENERS=f"INTERNAL://127.0.0.1:{internal}",
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:SSL",
            KAFSCALE_TLS__CLIENT_AUTH="required",
            KAFSCALE_TLS__CERT_FILE=str(pki.server.cert),
            KAFSCALE_TLS__KEY_FILE=str(pki.server.key),
            KAFSCALE_TLS__CA_FILE=str(pki.ca.cert_path),
            KAFSCALE_AUTHORIZER__ENABLED="true",
        ),
        log_path=tmp_path / "broker.log",
        port=internal,
        admin_port=admin,
    )
    cluster.brokers.append(broker)
    proxy_port, proxy_admin = free_port(), free_port()
    proxy = BrokerProcess(
        env=proxy_env(
            cluster,
            proxy_port,
            proxy_admin,
            KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SSL",
            KAFSCALE_UPSTREAM__CA_FILE=str(pki.ca.cert_path),
            KAFSCALE_UPSTREAM__CERT_FILE=str(proxy_cert.cert),
            KAFSCALE_UPSTREAM__KEY_FILE=str(proxy_cert.key),
            KAFSCALE_UPSTREAM__FORWARD_PRINCIPALS="false",
            KAFSCALE_TLS__RELOAD_INTERVAL_S="0.2",
        ),
        log_path=tmp_path / "proxy.log",
        port=proxy_port,
        admin_port=proxy_admin,
        command=[KAFSCALE, "proxy"],
    )
    cluster.brokers.append(proxy)
    try:
        broker.start()
        proxy.start()
        yield Rotating(proxy, pki, proxy_cert, topic_old, topic_new)
    finally:
        cluster.stop_all()


def _produce(producer: Producer, topic: str) -> KafkaError | None:
    outcomes: list[KafkaError | None] = []
    producer.produce(topic, value=b"v", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(30)
    assert len(outcomes) == 1, "no delivery report within 30 s"
    return outcomes[0]


def _producer(rotating: Rotating) -> Producer:
    return Producer({"bootstrap.servers": rotating.bootstrap, "message.timeout.ms": 20_000})


def _renew(pair: Pair, pki: TestPki, directory: Path) -> None:
    """Replace the proxy's files the way a Secret update lands: new files moved into place."""
    renewed = issue(pki.ca, directory, "renewed", [(NameOID.COMMON_NAME, "proxy-new")])
    os.replace(renewed.key, pair.key)
    os.replace(renewed.cert, pair.cert)


def test_new_upstream_connections_present_the_renewed_certificate(
    rotating: Rotating, tmp_path: Path
) -> None:
    before = _producer(rotating)
    assert _produce(before, rotating.topic_old) is None
    refused = _produce(before, rotating.topic_new)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    _renew(rotating.proxy_cert, rotating.pki, tmp_path)
    deadline = time.monotonic() + RELOAD_WAIT_S
    while "TLS certificate reloaded" not in rotating.proxy.log_path.read_text():
        assert time.monotonic() < deadline, "the proxy did not reload its client certificate"
        time.sleep(0.2)

    after = _producer(rotating)
    assert _produce(after, rotating.topic_new) is None  # presented as CN=proxy-new
    refused = _produce(after, rotating.topic_old)
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # The client connected before keeps its upstream connection, made with the old certificate.
    assert _produce(before, rotating.topic_old) is None
