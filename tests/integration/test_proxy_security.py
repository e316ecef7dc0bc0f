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

import ssl
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer, TopicCollection
from confluent_kafka.admin import AdminClient
from cryptography.x509.oid import NameOID
from harness.kafka_wire import API_VERSIONS, METADATA, KafkaWire, metadata_body
from harness.ports import free_port_run, free_ports, listener_ports
from harness.proxy import add_proxy
from harness.s3 import S3Endpoint
from harness.secured import (
    add_broker,
    confluent_mtls,
    confluent_sasl_ssl,
    consume_error,
    consume_values,
    create_user,
    kafka_python_sasl_ssl,
    kafscale_cli,
    make_topics,
    secured_cluster,
    tls_env,
    upstream_tls_env,
)
from harness.tls import Pair, TestPki, issue
from kafka import KafkaConsumer, KafkaProducer

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

ALICE, ALICE_PASSWORD = "alice", "alice-proxy-secret"
PROXY_PRINCIPAL = "User:CN=kafscale-proxy"
ALICE_CERT_PRINCIPAL = "User:CN=alice,O=KafScale Test"
PROXY_USER, PROXY_PASSWORD = "proxy-user", "proxy-user-secret"
SASL_HANDSHAKE, SASL_AUTHENTICATE, ENVELOPE = 17, 36, 58
SASL_AUTHENTICATION_FAILED, CLUSTER_AUTHORIZATION_FAILED, INVALID_REQUEST = 58, 31, 42


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


def _grants(topic_a: str) -> list[tuple[str, ...]]:
    """Both proxies may forward; alice (by password or certificate) and anyone may use A."""
    proxy_user = f"User:{PROXY_USER}"
    return [
        ("--cluster-resource", "--principal", PROXY_PRINCIPAL, "--operation", "CLUSTER_ACTION"),
        ("--cluster-resource", "--principal", proxy_user, "--operation", "CLUSTER_ACTION"),
        ("--topic", topic_a, "--principal", f"User:{ALICE}", "--operation", "READ"),
        ("--topic", topic_a, "--principal", f"User:{ALICE}", "--operation", "WRITE"),
        ("--group", "g-", "--prefixed", "--principal", f"User:{ALICE}", "--operation", "READ"),
        ("--topic", topic_a, "--principal", ALICE_CERT_PRINCIPAL, "--operation", "WRITE"),
        ("--topic", topic_a, "--principal", "User:ANONYMOUS", "--operation", "WRITE"),
    ]  # fmt: skip


AUTHORIZER = {
    "KAFSCALE_AUTHORIZER__ENABLED": "true",
    "KAFSCALE_AUTHORIZER__SUPER_USERS": '["User:admin"]',
}


@pytest.fixture(scope="module")
def secured(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecuredProxy]:
    workdir = tmp_path_factory.mktemp("proxy-security")
    etcd_url = etcd_server.client_url
    cluster, pki = secured_cluster(etcd_url, s3_server, workdir, "psec")
    name = cluster.cluster
    proxy_cert = issue(pki.ca, workdir / "pki", "proxy", [(NameOID.COMMON_NAME, "kafscale-proxy")])
    topic_a, topic_b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    make_topics(etcd_url, name, 2, topic_a, topic_b)
    create_user(etcd_url, name, ALICE, ALICE_PASSWORD)
    create_user(etcd_url, name, PROXY_USER, PROXY_PASSWORD)
    for grant in _grants(topic_a):
        kafscale_cli(etcd_url, name, "acls", "add", *grant)
    broker_ports = listener_ports("INTERNAL", "PLAIN", "SASLIN")
    broker = add_broker(
        cluster,
        broker_ports,
        "PLAIN",
        "broker.log",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="INTERNAL:SSL,PLAIN:PLAINTEXT,SASLIN:SASL_PLAINTEXT",
        KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES="INTERNAL:required",
        **tls_env(pki),
        **AUTHORIZER,
    )
    proxy_port, mtls_port = free_ports(2)
    proxy = add_proxy(
        cluster,
        proxy_port,
        "proxy.log",
        KAFSCALE_LISTENERS=f"EXTERNAL://127.0.0.1:{proxy_port},MTLS://127.0.0.1:{mtls_port}",
        KAFSCALE_ADVERTISED_LISTENERS=f"EXTERNAL://localhost:{proxy_port},"
        f"MTLS://localhost:{mtls_port}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="EXTERNAL:SASL_SSL,MTLS:SSL",
        KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES="MTLS:required",
        **upstream_tls_env(pki, proxy_cert),
        **tls_env(pki),
        **AUTHORIZER,
    )
    sasl_port = free_port_run()
    sasl_proxy = add_proxy(
        cluster,
        sasl_port,
        "sasl-proxy.log",
        KAFSCALE_LISTENERS=f"CLIENTS://127.0.0.1:{sasl_port}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="CLIENTS:SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__LISTENER="SASLIN",
        KAFSCALE_UPSTREAM__SASL_MECHANISM="SCRAM-SHA-256",
        KAFSCALE_UPSTREAM__SASL_USERNAME=PROXY_USER,
        KAFSCALE_UPSTREAM__SASL_PASSWORD=PROXY_PASSWORD,
        **AUTHORIZER,
    )
    # reaches the brokers' PLAINTEXT listener: not trusted
    untrusted_proxy = add_proxy(
        cluster, None, "untrusted-proxy.log", KAFSCALE_UPSTREAM__LISTENER="PLAIN", **AUTHORIZER
    )
    try:
        for process in (broker, proxy, sasl_proxy, untrusted_proxy):
            process.start()
        yield SecuredProxy(
            broker,
            broker_ports,
            proxy,
            proxy_port,
            mtls_port,
            sasl_port,
            untrusted_proxy.port,
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
    return confluent_sasl_ssl(
        secured.bootstrap, ALICE, password, secured.pki.ca.cert_path, mechanism
    )


def _produce(config: dict[str, Any], topic: str, values: list[bytes]) -> list[KafkaError | None]:
    outcomes: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 20_000})
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(30)
    return outcomes


# --- real clients log in at the proxy -----------------------------------------------------------


def test_scram_sha_256_client_produces_and_consumes_its_topic_through_the_proxy(
    secured: SecuredProxy,
) -> None:
    config = confluent_config(secured)
    values = [f"a-{i}".encode() for i in range(5)]
    assert _produce(config, secured.topic_a, values) == [None] * len(values)
    assert sorted(consume_values(config, secured.topic_a, len(values))) == sorted(values)


def test_a_topic_the_client_may_not_use_is_refused_though_the_proxy_may(
    secured: SecuredProxy,
) -> None:
    """The proxy holds CLUSTER_ACTION only: Produce and Fetch on B are refused as alice."""
    config = confluent_config(secured)
    (error,) = _produce(config, secured.topic_b, [b"no"])
    assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert consume_error(config, secured.topic_b) == KafkaError.TOPIC_AUTHORIZATION_FAILED


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
    config = kafka_python_sasl_ssl(
        secured.bootstrap, ALICE, ALICE_PASSWORD, secured.pki.ca.cert_path, "SCRAM-SHA-512"
    )
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
    config = confluent_mtls(f"localhost:{secured.mtls_port}", secured.pki)
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
