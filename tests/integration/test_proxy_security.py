"""The proxy as the secured front door: TLS and SASL end there, ACLs apply to the client.

One broker process with the authorizer on and two listeners:

- ``INTERNAL`` SSL requiring a client certificate (the registered main address, the proxy's way
  in); the proxy presents ``CN=kafscale-proxy``, which holds CLUSTER_ACTION on the cluster,
- ``PLAIN`` PLAINTEXT (``User:ANONYMOUS``, no CLUSTER_ACTION: a connection that may not
  forward principals),
- ``SASLIN`` SASL_PLAINTEXT, where a second proxy logs in as the SCRAM user ``proxy-user``
  (CLUSTER_ACTION too) instead of presenting a certificate.

One proxy process in front of it with a ``SASL_SSL`` client listener (SCRAM-SHA-256/512, PLAIN),
an ``SSL`` one requiring client certificates, and the brokers' authorizer settings. ``alice``
may read and write topic A and use groups ``g-*``; nobody may touch topic B. Real clients
(confluent-kafka, kafka-python) log in at the proxy; what the broker allows is what alice may
do, not what the proxy may.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicCollection
from confluent_kafka.admin import AdminClient
from cryptography.x509.oid import NameOID
from harness.brokers import BrokerCluster, _create_bucket
from harness.kafka_wire import API_VERSIONS, METADATA, KafkaWire, metadata_body
from harness.proxy import proxy_env
from harness.s3 import S3Endpoint, unique_bucket
from harness.tls import Pair, TestPki, issue, make_pki
from kafka import KafkaConsumer, KafkaProducer

from kafscale.broker.child_process import KAFSCALE, BrokerProcess
from kafscale.broker.metadata import topics
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, free_port
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

ALICE, ALICE_PASSWORD = "alice", "alice-proxy-secret"
PROXY_PRINCIPAL = "User:CN=kafscale-proxy"
ALICE_CERT_PRINCIPAL = "User:CN=alice,O=KafScale Test"
PROXY_USER, PROXY_PASSWORD = "proxy-user", "proxy-user-secret"
SASL_HANDSHAKE, SASL_AUTHENTICATE, ENVELOPE = 17, 36, 58
SASL_AUTHENTICATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST = 58, 31, 42
CONSUME_TIMEOUT_S = 30.0


@dataclass
class SecuredProxy:
    broker: BrokerProcess
    broker_ports: dict[str, int]
    proxy: BrokerProcess
    proxy_port: int
    mtls_port: int
    sasl_proxy_port: int
    untrusted_proxy_port: int
    pki: TestPki
    proxy_cert: Pair
    topic_a: str
    topic_b: str
    untrusted_proxy_log: Path

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.proxy_port}"


def _cli(etcd_url: str, cluster: str, *args: str, stdin: str = "") -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFSCALE_")}
    env.update({"KAFSCALE_CLUSTER": cluster, "KAFSCALE_ETCD__ENDPOINTS": json.dumps([etcd_url])})
    done = subprocess.run(
        [sys.executable, "-m", "kafscale.broker.cli", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _make_topics(etcd_url: str, cluster: str, *names: str) -> None:
    async def run() -> None:
        etcd = await Etcd.connect([etcd_url], timeout_s=5)
        try:
            for name in names:
                await topics.create_topic(etcd, cluster, name, 2, {})
        finally:
            await etcd.close()

    asyncio.run(run())


@pytest.fixture(scope="module")
def secured(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredProxy]:
    workdir = tmp_path_factory.mktemp("proxy-security")
    pki = make_pki(workdir / "pki")
    proxy_cert = issue(pki.ca, workdir / "pki", "proxy", [(NameOID.COMMON_NAME, "kafscale-proxy")])
    bucket = unique_bucket("psec")
    _create_bucket(s3_server, bucket)
    name = f"psec-{uuid.uuid4().hex[:8]}"
    etcd_url = etcd_server.client_url
    cluster = BrokerCluster(etcd_url, s3_server, bucket, name, workdir)
    topic_a, topic_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    _make_topics(etcd_url, name, topic_a, topic_b)
    _cli(etcd_url, name, "users", "create", ALICE, "--password-stdin", stdin=ALICE_PASSWORD)
    _cli(etcd_url, name, "users", "create", PROXY_USER, "--password-stdin", stdin=PROXY_PASSWORD)
    grants = [
        ("--cluster-resource", "--principal", PROXY_PRINCIPAL, "--operation", "CLUSTER_ACTION"),
        (
            "--cluster-resource",
            "--principal",
            f"User:{PROXY_USER}",
            "--operation",
            "CLUSTER_ACTION",
        ),
        ("--topic", topic_a, "--principal", f"User:{ALICE}", "--operation", "READ"),
        ("--topic", topic_a, "--principal", f"User:{ALICE}", "--operation", "WRITE"),
        ("--group", "g-", "--prefixed", "--principal", f"User:{ALICE}", "--operation", "READ"),
        ("--topic", topic_a, "--principal", ALICE_CERT_PRINCIPAL, "--operation", "WRITE"),
        ("--topic", topic_a, "--principal", "User:ANONYMOUS", "--operation", "WRITE"),
    ]
    for grant in grants:
        _cli(etcd_url, name, "acls", "add", *grant)
    tls = {
        "KAFSCALE_TLS__CERT_FILE": str(pki.server.cert),
        "KAFSCALE_TLS__KEY_FILE": str(pki.server.key),
        "KAFSCALE_TLS__CA_FILE": str(pki.ca.cert_path),
    }
    authorizer = {
        "KAFSCALE_AUTHORIZER__ENABLED": "true",
        "KAFSCALE_AUTHORIZER__SUPER_USERS": '["User:admin"]',
    }
    broker_ports = {"INTERNAL": free_port(), "PLAIN": free_port(), "SASLIN": free_port()}
    broker_admin = free_port()
    broker = BrokerProcess(
        env=cluster.env(
            broker_ports["INTERNAL"],
            broker_admin,
            KAFSCALE_LISTENERS=",".join(f"{n}://127.0.0.1:{p}" for n, p in broker_ports.items()),
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP=(
                "INTERNAL:SSL,PLAIN:PLAINTEXT,SASLIN:SASL_PLAINTEXT"
            ),
            KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES="INTERNAL:required",
            **tls,
            **authorizer,
        ),
        log_path=workdir / "broker.log",
        port=broker_ports["PLAIN"],
        admin_port=broker_admin,
    )
    cluster.brokers.append(broker)
    proxy_port, mtls_port, proxy_admin = free_port(), free_port(), free_port()
    proxy = BrokerProcess(
        env=proxy_env(
            cluster,
            proxy_port,
            proxy_admin,
            KAFSCALE_LISTENERS=f"EXTERNAL://127.0.0.1:{proxy_port},MTLS://127.0.0.1:{mtls_port}",
            KAFSCALE_ADVERTISED_LISTENERS=f"EXTERNAL://localhost:{proxy_port},"
            f"MTLS://localhost:{mtls_port}",
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="EXTERNAL:SASL_SSL,MTLS:SSL",
            KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES="MTLS:required",
            KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SSL",
            KAFSCALE_UPSTREAM__CA_FILE=str(pki.ca.cert_path),
            KAFSCALE_UPSTREAM__CERT_FILE=str(proxy_cert.cert),
            KAFSCALE_UPSTREAM__KEY_FILE=str(proxy_cert.key),
            **tls,
            **authorizer,
        ),
        log_path=workdir / "proxy.log",
        port=proxy_port,
        admin_port=proxy_admin,
        command=[KAFSCALE, "proxy"],
    )
    cluster.brokers.append(proxy)
    sasl_port, sasl_admin = free_port(), free_port()
    sasl_proxy = BrokerProcess(
        env=proxy_env(
            cluster,
            sasl_port,
            sasl_admin,
            KAFSCALE_LISTENERS=f"CLIENTS://127.0.0.1:{sasl_port}",
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="CLIENTS:SASL_PLAINTEXT",
            KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SASL_PLAINTEXT",
            KAFSCALE_UPSTREAM__LISTENER="SASLIN",
            KAFSCALE_UPSTREAM__SASL_MECHANISM="SCRAM-SHA-256",
            KAFSCALE_UPSTREAM__SASL_USERNAME=PROXY_USER,
            KAFSCALE_UPSTREAM__SASL_PASSWORD=PROXY_PASSWORD,
            **authorizer,
        ),
        log_path=workdir / "sasl-proxy.log",
        port=sasl_port,
        admin_port=sasl_admin,
        command=[KAFSCALE, "proxy"],
    )
    cluster.brokers.append(sasl_proxy)
    untrusted_port, untrusted_admin = free_port(), free_port()
    untrusted_proxy = BrokerProcess(  # reaches the brokers' PLAINTEXT listener: not trusted
        env=proxy_env(
            cluster,
            untrusted_port,
            untrusted_admin,
            KAFSCALE_UPSTREAM__LISTENER="PLAIN",
            **authorizer,
        ),
        log_path=workdir / "untrusted-proxy.log",
        port=untrusted_port,
        admin_port=untrusted_admin,
        command=[KAFSCALE, "proxy"],
    )
    cluster.brokers.append(untrusted_proxy)
    try:
        broker.start()
        proxy.start()
        sasl_proxy.start()
        untrusted_proxy.start()
        yield SecuredProxy(
            broker,
            broker_ports,
            proxy,
            proxy_port,
            mtls_port,
            sasl_port,
            untrusted_port,
            pki,
            proxy_cert,
            topic_a,
            topic_b,
            untrusted_proxy.log_path,
        )
    finally:
        cluster.stop_all()


def confluent_config(
    secured: SecuredProxy, password: str = ALICE_PASSWORD, mechanism: str = "SCRAM-SHA-256"
) -> dict[str, Any]:
    return {
        "bootstrap.servers": secured.bootstrap,
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": mechanism,
        "sasl.username": ALICE,
        "sasl.password": password,
        "ssl.ca.location": str(secured.pki.ca.cert_path),
    }


def _produce(config: dict[str, Any], topic: str, values: list[bytes]) -> list[KafkaError | None]:
    outcomes: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 20_000})
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(30)
    return outcomes


def _consume(config: dict[str, Any], topic: str, count: int) -> list[bytes]:
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


def _consume_error(config: dict[str, Any], topic: str) -> int:
    consumer = Consumer(
        {**config, "group.id": f"g-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error():
                return int(message.error().code())
            assert message is None, "a record from a topic the principal may not read"
        raise AssertionError("no authorization error")
    finally:
        consumer.close()


# --- real clients log in at the proxy -----------------------------------------------------------


def test_scram_sha_256_client_produces_and_consumes_its_topic_through_the_proxy(
    secured: SecuredProxy,
) -> None:
    config = confluent_config(secured)
    values = [f"a-{i}".encode() for i in range(5)]
    assert _produce(config, secured.topic_a, values) == [None] * len(values)
    assert sorted(_consume(config, secured.topic_a, len(values))) == sorted(values)


def test_a_topic_the_client_may_not_use_is_refused_though_the_proxy_may(
    secured: SecuredProxy,
) -> None:
    """The proxy holds CLUSTER_ACTION only: Produce and Fetch on B are refused as alice."""
    config = confluent_config(secured)
    (error,) = _produce(config, secured.topic_b, [b"no"])
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _consume_error(config, secured.topic_b) == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_metadata_from_the_proxy_lists_only_what_the_client_may_describe(
    secured: SecuredProxy,
) -> None:
    admin = AdminClient(confluent_config(secured))
    listed = admin.list_topics(timeout=30)
    assert secured.topic_a in listed.topics
    assert secured.topic_b not in listed.topics
    assert [(b.host, b.port) for b in listed.brokers.values()] == [
        ("localhost", secured.proxy_port)
    ]
    named = admin.list_topics(topic=secured.topic_b, timeout=30).topics[secured.topic_b]
    assert named.error is not None
    assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_authorized_operations_from_the_proxy_are_the_clients(secured: SecuredProxy) -> None:
    """AdminClient.describeTopics(includeAuthorizedOperations) at the proxy: alice may READ
    and WRITE A (and so DESCRIBE it), nothing more."""
    admin = AdminClient(confluent_config(secured))
    topic = admin.describe_topics(
        TopicCollection([secured.topic_a]), include_authorized_operations=True
    )[secured.topic_a].result(30)
    assert {op.name for op in topic.authorized_operations} == {"READ", "WRITE", "DESCRIBE"}


def test_wrong_password_at_the_proxy_gets_sasl_authentication_failed(
    secured: SecuredProxy,
) -> None:
    errors: list[KafkaError] = []
    config = confluent_config(secured, password="not-the-password")
    producer = Producer({**config, "error_cb": errors.append})
    producer.produce(secured.topic_a, value=b"x")
    deadline = time.monotonic() + 20
    while (
        not any(e.code() == KafkaError._AUTHENTICATION for e in errors)
        and time.monotonic() < deadline
    ):
        producer.poll(0.2)
    producer.purge()
    producer.flush(1)
    failed = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert failed, errors
    assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in failed[0].str()
    # On the wire: Kafka's error code, then the proxy closes the connection.
    with _tls_wire(secured, f"127.0.0.1:{secured.proxy_port}") as wire:
        assert wire.request(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        answer = wire.request(SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{ALICE}\0wrong".encode()})
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        assert _closed(wire)


def test_requests_before_logging_in_at_the_proxy_close_the_connection(
    secured: SecuredProxy,
) -> None:
    with _tls_wire(secured, f"127.0.0.1:{secured.proxy_port}") as wire:
        versions = wire.request(
            API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        assert {SASL_HANDSHAKE, SASL_AUTHENTICATE} <= {k.api_key for k in versions.api_keys}
        wire.send(METADATA, 9, metadata_body(None))
        assert _closed(wire)


def test_kafka_python_scram_sha_512_through_the_proxy(secured: SecuredProxy) -> None:
    config: dict[str, Any] = {
        "bootstrap_servers": secured.bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": ALICE,
        "sasl_plain_password": ALICE_PASSWORD,
        "ssl_cafile": str(secured.pki.ca.cert_path),
    }
    producer = KafkaProducer(**config)
    try:
        producer.send(secured.topic_a, b"from-kafka-python").get(30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        secured.topic_a,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=20_000,
        **config,
    )
    try:  # stops at the record; iterating to the end would wait out the whole timeout
        assert any(message.value == b"from-kafka-python" for message in consumer)
    finally:
        consumer.close()


def test_a_client_certificate_at_the_proxy_is_the_principal_the_brokers_check(
    secured: SecuredProxy,
) -> None:
    """The proxy's SSL listener requires a client certificate; its subject is the principal
    forwarded, and the brokers authorize that principal (WRITE on A only)."""
    config = {
        "bootstrap.servers": f"localhost:{secured.mtls_port}",
        "security.protocol": "SSL",
        "ssl.ca.location": str(secured.pki.ca.cert_path),
        "ssl.certificate.location": str(secured.pki.alice.cert),
        "ssl.key.location": str(secured.pki.alice.key),
    }
    assert _produce(config, secured.topic_a, [b"by-certificate"]) == [None]
    (error,) = _produce(config, secured.topic_b, [b"no"])
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    brokers = AdminClient(config).list_topics(timeout=30).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("localhost", secured.mtls_port)]


def test_a_proxy_that_logs_in_to_the_brokers_with_scram_forwards_as_well(
    secured: SecuredProxy,
) -> None:
    """The second proxy reaches the brokers' SASL listener as ``proxy-user`` (SCRAM-SHA-256)
    and its clients on SASL_PLAINTEXT: alice's rights, not the proxy user's, apply."""
    config = {
        "bootstrap.servers": f"127.0.0.1:{secured.sasl_proxy_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": ALICE,
        "sasl.password": ALICE_PASSWORD,
    }
    assert _produce(config, secured.topic_a, [b"via-sasl-proxy"]) == [None]
    (error,) = _produce(config, secured.topic_b, [b"no"])
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


# --- the broker's side of forwarding ------------------------------------------------------------


def test_a_proxy_the_brokers_do_not_trust_gets_cluster_authorization_failed(
    secured: SecuredProxy,
) -> None:
    """A proxy reaching the brokers as User:ANONYMOUS (no CLUSTER_ACTION) forwards nothing,
    though its (anonymous) client may write A: it gets CLUSTER_AUTHORIZATION_FAILED at once."""
    config = {"bootstrap.servers": f"127.0.0.1:{secured.untrusted_proxy_port}"}
    (error,) = _produce({**config, "message.timeout.ms": 10_000}, secured.topic_a, [b"no"])
    assert error is not None and error.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    log = secured.untrusted_proxy_log.read_text()
    assert "refused the forwarded request: CLUSTER_AUTHORIZATION_FAILED" in log


def _envelope(principal: str, inner: bytes) -> dict[str, Any]:
    return {
        "request_data": inner,
        "request_principal": codec.encode_principal(principal),
        "client_host_address": bytes([127, 0, 0, 1]),
    }


def _inner_metadata() -> bytes:
    return codec.encode_request(METADATA, 9, 7, metadata_body(None), "t")[4:]


def test_a_broker_refuses_a_forwarded_principal_from_a_connection_it_does_not_trust(
    secured: SecuredProxy,
) -> None:
    """An anonymous connection claiming to forward for a super user gets
    CLUSTER_AUTHORIZATION_FAILED, and nothing it carried runs."""
    with KafkaWire(f"127.0.0.1:{secured.broker_ports['PLAIN']}") as wire:
        answer = wire.request(ENVELOPE, 0, _envelope("User:admin", _inner_metadata()))
    assert answer.error_code == CLUSTER_AUTHORIZATION_FAILED
    assert answer.response_data is None


def test_a_broker_runs_an_envelope_from_the_proxy_as_the_client(secured: SecuredProxy) -> None:
    """With the proxy's certificate, the same Envelope runs, and as alice: Metadata of every
    topic lists A (hers) and not B."""
    address = f"127.0.0.1:{secured.broker_ports['INTERNAL']}"
    with _tls_wire(secured, address, secured.proxy_cert) as wire:
        answer = wire.request(ENVELOPE, 0, _envelope(f"User:{ALICE}", _inner_metadata()))
    assert answer.error_code == 0
    inner = codec.decode_response(answer.response_data, METADATA, 9)
    names = {topic.name for topic in inner.topics}
    assert secured.topic_a in names and secured.topic_b not in names


def test_an_envelope_may_not_carry_a_login(secured: SecuredProxy) -> None:
    handshake = codec.encode_request(SASL_HANDSHAKE, 1, 3, {"mechanism": "PLAIN"}, "t")[4:]
    address = f"127.0.0.1:{secured.broker_ports['INTERNAL']}"
    with _tls_wire(secured, address, secured.proxy_cert) as wire:
        answer = wire.request(ENVELOPE, 0, _envelope(f"User:{ALICE}", handshake))
    assert answer.error_code == INVALID_REQUEST


def _tls_wire(secured: SecuredProxy, address: str, client: Pair | None = None) -> KafkaWire:
    context = ssl.create_default_context(cafile=str(secured.pki.ca.cert_path))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    wire = KafkaWire(address)
    wire.sock = context.wrap_socket(wire.sock, server_hostname="127.0.0.1")
    return wire


def _closed(wire: KafkaWire) -> bool:
    """Whether the peer closed the TLS connection (a TLS close may arrive as an SSL error)."""
    try:
        return wire.is_closed_by_peer()
    except ssl.SSLError:
        return True
