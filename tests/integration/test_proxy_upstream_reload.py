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

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Producer
from cryptography.x509.oid import NameOID
from harness.ports import free_port_run
from harness.proxy import add_proxy
from harness.s3 import S3Endpoint
from harness.secured import (
    add_broker,
    kafscale_cli,
    make_topics,
    secured_cluster,
    tls_env,
    upstream_tls_env,
)
from harness.tls import Pair, TestPki, issue

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

RELOAD_WAIT_S = 30.0


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
    etcd_url = etcd_server.client_url
    cluster, pki = secured_cluster(etcd_url, s3_server, tmp_path, "prot")
    name = cluster.cluster
    proxy_cert = issue(pki.ca, tmp_path / "pki", "proxy", [(NameOID.COMMON_NAME, "proxy-old")])
    topic_old, topic_new = f"old-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    make_topics(etcd_url, name, 1, topic_old, topic_new)
    for topic, principal in ((topic_old, "User:CN=proxy-old"), (topic_new, "User:CN=proxy-new")):
        kafscale_cli(etcd_url, name, "acls", "add", "--topic", topic, "--principal", principal,
                     "--operation", "WRITE")  # fmt: skip
    broker = add_broker(
        cluster,
        {"INTERNAL": free_port_run()},
        "INTERNAL",
        "broker.log",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:SSL",
        KAFSCALE_TLS__CLIENT_AUTH="required",
        KAFSCALE_AUTHORIZER__ENABLED="true",
        **tls_env(pki),
    )
    proxy = add_proxy(
        cluster,
        None,
        "proxy.log",
        KAFSCALE_UPSTREAM__FORWARD_PRINCIPALS="false",
        KAFSCALE_TLS__RELOAD_INTERVAL_S="0.2",
        **upstream_tls_env(pki, proxy_cert),
    )
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
