"""A secured broker with real clients: listeners, TLS, mTLS, SASL PLAIN and SCRAM, users.

One broker process serves the module with four listeners:

- ``INTERNAL`` PLAINTEXT on 127.0.0.1 (the registered main address, what the proxy would use),
- ``SECURE`` SASL_SSL, advertised as ``localhost`` (the server certificate's name),
- ``MTLS`` SSL requiring a client certificate signed by the test CA,
- ``SASL`` SASL_PLAINTEXT (raw-wire tests of the SASL exchange).

Its admin port requires a bearer token. Users are created with ``kafscale users`` (straight to
etcd) and with Kafka's admin API (AlterUserScramCredentials through confluent-kafka).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import socket
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
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from harness import children
from harness.brokers import new_cluster
from harness.children import settings_free_env
from harness.etcd import harness_etcd
from harness.kafka_wire import API_VERSIONS, METADATA, KafkaWire, metadata_body
from harness.kcat import kcat_consume, kcat_produce
from harness.ports import free_port_run, listener_ports
from harness.s3 import S3Endpoint
from harness.secured import (
    CONSUME_TIMEOUT_S,
    add_broker,
    confluent_mtls,
    confluent_sasl_ssl,
    consume_values,
    kafka_python_sasl_ssl,
    secured_cluster,
    tls_env,
)
from harness.tls import TestPki
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic as KpNewTopic

from kafscale.broker.admin_http import admin_request
from kafscale.broker.child_process import KAFSCALE, BrokerProcess
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
ALICE, ALICE_PASSWORD = "alice", "alice-secret-" + "x" * 8


@dataclass
class SecureBroker:
    process: BrokerProcess
    ports: dict[str, int]
    pki: TestPki
    etcd_url: str
    cluster: str
    token: str
    workdir: Path

    @property
    def internal(self) -> str:
        return f"127.0.0.1:{self.ports['INTERNAL']}"

    @property
    def secure(self) -> str:
        return f"localhost:{self.ports['SECURE']}"

    @property
    def mtls(self) -> str:
        return f"localhost:{self.ports['MTLS']}"

    @property
    def sasl(self) -> str:
        return f"127.0.0.1:{self.ports['SASL']}"


def users_cli(
    etcd_url: str, cluster: str, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = settings_free_env()
    return children.run(
        [KAFSCALE, "users", "--etcd-endpoints", etcd_url, "--cluster", cluster, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.fixture(scope="module")
def secured(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureBroker]:
    workdir = tmp_path_factory.mktemp("security")
    cluster, pki = secured_cluster(etcd_server.client_url, s3_server, workdir, "sec")
    cluster_name = cluster.cluster
    created = users_cli(
        etcd_server.client_url,
        cluster_name,
        "create",
        ALICE,
        "--password-stdin",
        stdin=ALICE_PASSWORD + "\n",
    )
    assert created.returncode == 0, created.stderr
    token = secrets.token_hex(16)
    token_file = workdir / "admin-token"
    token_file.write_text(token + "\n")
    ports = listener_ports("INTERNAL", "SECURE", "MTLS", "SASL")
    process = add_broker(
        cluster,
        ports,
        "INTERNAL",
        "broker.log",
        admin_token=token,
        KAFSCALE_ADVERTISED_LISTENERS=f"SECURE://localhost:{ports['SECURE']},"
        f"MTLS://localhost:{ports['MTLS']}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP=(
            "INTERNAL:PLAINTEXT,SECURE:SASL_SSL,MTLS:SSL,SASL:SASL_PLAINTEXT"
        ),
        KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES="MTLS:required",
        KAFSCALE_TLS__RELOAD_INTERVAL_S="0.2",
        KAFSCALE_ADMIN__TOKEN_FILE=str(token_file),
        **tls_env(pki),
    )
    try:
        process.start()
        yield SecureBroker(
            process, ports, pki, etcd_server.client_url, cluster_name, token, workdir
        )
    finally:
        cluster.stop_all()


def sasl_ssl_confluent(
    broker: SecureBroker, user: str = ALICE, password: str = ALICE_PASSWORD
) -> dict[str, Any]:
    return confluent_sasl_ssl(
        broker.secure, user, password, broker.pki.ca.cert_path, "SCRAM-SHA-512"
    )


def new_topic() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


# --- listeners ---------------------------------------------------------------------------------


def test_metadata_answers_with_the_listener_the_client_came_in_on(secured: SecureBroker) -> None:
    with KafkaWire(secured.internal) as wire:
        internal = wire.request(METADATA, 9, metadata_body([]))
    with KafkaWire(secured.sasl) as wire:
        wire.request(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
        _login_plain(wire, ALICE, ALICE_PASSWORD)
        over_sasl = wire.request(METADATA, 9, metadata_body([]))
    assert [(b.host, b.port) for b in internal.brokers] == [
        ("127.0.0.1", secured.ports["INTERNAL"])
    ]
    assert [(b.host, b.port) for b in over_sasl.brokers] == [("127.0.0.1", secured.ports["SASL"])]
    registered = _registration(secured)
    assert (registered["host"], registered["port"]) == ("127.0.0.1", secured.ports["INTERNAL"])
    assert registered["listeners"]["SECURE"] == {
        "host": "localhost",
        "port": secured.ports["SECURE"],
    }
    assert set(registered["listeners"]) == {"INTERNAL", "SECURE", "MTLS", "SASL"}


def _registration(secured: SecureBroker) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        etcd = await harness_etcd(secured.etcd_url)
        try:
            kv = await etcd.get(keys.broker_key(secured.cluster, secured.process.node_id))
            assert kv is not None
            return dict(json.loads(kv.value))
        finally:
            await etcd.close()

    return asyncio.run(read())


# --- SASL_SSL with SCRAM-SHA-512: every client -------------------------------------------------


def test_confluent_kafka_produces_consumes_and_administers_over_sasl_ssl(
    secured: SecureBroker,
) -> None:
    config = sasl_ssl_confluent(secured)
    topic = new_topic()
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30)
    brokers = admin.list_topics(timeout=30).brokers
    assert [(b.host, b.port) for b in brokers.values()] == [("localhost", secured.ports["SECURE"])]
    producer = Producer(config)
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=f"ck-{i}".encode())
    assert producer.flush(30) == 0
    values = consume_values(config, topic, 10)
    assert sorted(values) == sorted(f"ck-{i}".encode() for i in range(10))


def test_kafka_python_produces_and_consumes_in_a_group_over_sasl_ssl(secured: SecureBroker) -> None:
    config = kafka_python_sasl_ssl(
        secured.secure, ALICE, ALICE_PASSWORD, secured.pki.ca.cert_path, "SCRAM-SHA-512"
    )
    topic = new_topic()
    admin = KafkaAdminClient(**config)
    try:
        admin.create_topics([KpNewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(**config)
    for i in range(10):
        producer.send(topic, key=str(i).encode(), value=f"kp-{i}".encode())
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(CONSUME_TIMEOUT_S * 1000),
        **config,
    )
    try:
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == 10:
                break
        consumer.commit()
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"kp-{i}".encode() for i in range(10))


def test_aiokafka_produces_and_consumes_over_sasl_ssl(secured: SecureBroker) -> None:
    topic = new_topic()

    async def run() -> list[bytes]:
        common: dict[str, Any] = {
            "bootstrap_servers": secured.secure,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": ALICE,
            "sasl_plain_password": ALICE_PASSWORD,
            "ssl_context": create_ssl_context(cafile=str(secured.pki.ca.cert_path)),
        }
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait(topic, f"aio-{i}".encode(), key=str(i).encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            **common,
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            async with asyncio.timeout(CONSUME_TIMEOUT_S):
                async for message in consumer:
                    assert message.value is not None
                    values.append(message.value)
                    if len(values) == 10:
                        break
            await consumer.commit()
        finally:
            await consumer.stop()
        return values

    values = asyncio.run(run())
    assert sorted(values) == sorted(f"aio-{i}".encode() for i in range(10))


def test_kcat_produces_and_consumes_over_sasl_ssl(secured: SecureBroker) -> None:
    topic = new_topic()
    config = {k: v for k, v in sasl_ssl_confluent(secured).items() if k != "bootstrap.servers"}
    records = [(str(i), f"kcat-{i}") for i in range(6)]
    kcat_produce(secured.secure, topic, records, config=config)
    consumed = kcat_consume(secured.secure, topic, count=len(records), config=config)
    assert sorted(m["payload"] for m in consumed) == sorted(v for _, v in records)


def test_java_client_produces_and_consumes_over_sasl_ssl_and_mtls(secured: SecureBroker) -> None:
    from harness.java_client import java_consume, java_produce

    ca = secured.pki.ca.cert_path
    sasl = secured.workdir / "java-sasl.properties"
    sasl.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ALICE}" password="{ALICE_PASSWORD}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca}\n"
    )
    topic = new_topic()
    acked = java_produce(secured.secure, topic, 2, 6, "none", properties=sasl)
    assert len(acked) == 6
    group = f"g-{uuid.uuid4().hex[:8]}"
    records = java_consume(secured.secure, topic, group, 6, properties=sasl)
    assert len(records) == 6 and all(value.startswith("java-") for *_, value in records)

    mtls = secured.workdir / "java-mtls.properties"
    key_and_cert = secured.workdir / "alice-keystore.pem"
    key_and_cert.write_text(secured.pki.alice.key.read_text() + secured.pki.alice.cert.read_text())
    mtls.write_text(
        "security.protocol=SSL\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={ca}\n"
        "ssl.keystore.type=PEM\n"
        f"ssl.keystore.location={key_and_cert}\n"
    )
    topic = new_topic()
    assert len(java_produce(secured.mtls, topic, 1, 3, "none", properties=mtls)) == 3


# --- users: Kafka's admin API and the CLI ------------------------------------------------------


def test_users_made_through_the_kafka_admin_api_can_log_in(secured: SecureBroker) -> None:
    admin = AdminClient(sasl_ssl_confluent(secured))
    bob = f"bob-{uuid.uuid4().hex[:6]}"
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(bob, info, b"bob-password", b"0123456789abcdef")]
    )
    futures[bob].result(30)
    described = admin.describe_user_scram_credentials([bob])[bob].result(30)
    infos = described.scram_credential_infos
    assert [(i.mechanism, i.iterations) for i in infos] == [(ScramMechanism.SCRAM_SHA_512, 8192)]
    stored = _credential_json(secured, bob, "SCRAM-SHA-512")
    assert set(stored) == {"salt", "stored_key", "server_key", "iterations"}
    assert b"bob-password" not in json.dumps(stored).encode()
    topic = new_topic()
    producer = Producer(sasl_ssl_confluent(secured, bob, "bob-password"))
    producer.produce(topic, value=b"from bob")
    assert producer.flush(30) == 0

    admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion(bob, ScramMechanism.SCRAM_SHA_512)]
    )[bob].result(30)
    errors = _login_errors(sasl_ssl_confluent(secured, bob, "bob-password"))
    assert KafkaError._AUTHENTICATION in errors
    listed = users_cli(secured.etcd_url, secured.cluster, "list")
    assert listed.returncode == 0 and ALICE in listed.stdout and bob not in listed.stdout


def test_users_cli_creates_changes_and_deletes_users(secured: SecureBroker) -> None:
    carol = f"carol-{uuid.uuid4().hex[:6]}"
    password_file = secured.workdir / "carol-password"
    password_file.write_text("first-password\n")
    cli = (secured.etcd_url, secured.cluster)
    made = users_cli(*cli, "create", carol, "--password-file", str(password_file))
    assert made.returncode == 0, made.stderr
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, carol, "first-password").error_code == 0
    changed = users_cli(*cli, "create", carol, "--password-stdin", stdin="second-password\n")
    assert changed.returncode == 0, changed.stderr
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, carol, "first-password").error_code == 58
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, carol, "second-password").error_code == 0
    assert users_cli(*cli, "delete", carol).returncode == 0
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, carol, "second-password").error_code == 58
    assert users_cli(*cli, "delete", carol).returncode == 1  # nothing left to delete
    too_few = users_cli(
        *cli, "create", carol, "--password-stdin", "--iterations", "10", stdin="x\n"
    )
    assert too_few.returncode == 2 and "iterations" in too_few.stderr


def test_managing_users_needs_the_cluster_permissions_when_authorization_is_on(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    """With the authorizer on, AlterUserScramCredentials needs ALTER and
    DescribeUserScramCredentials DESCRIBE on the cluster: a super user may, others may not."""
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path, "secz")
    cluster_name = cluster.cluster
    for user in ("root", "mallory"):
        made = users_cli(
            etcd_server.client_url,
            cluster_name,
            "create",
            user,
            "--password-stdin",
            stdin=f"{user}-password\n",
        )
        assert made.returncode == 0, made.stderr
    port = free_port_run()
    try:
        cluster.start(
            port,
            KAFSCALE_LISTENERS=f"SASL://127.0.0.1:{port}",
            KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="SASL:SASL_PLAINTEXT",
            KAFSCALE_AUTHORIZER__ENABLED="true",
            KAFSCALE_AUTHORIZER__SUPER_USERS='["User:root"]',
        )

        def admin_as(user: str) -> AdminClient:
            return AdminClient(
                {
                    "bootstrap.servers": f"127.0.0.1:{port}",
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanisms": "SCRAM-SHA-512",
                    "sasl.username": user,
                    "sasl.password": f"{user}-password",
                }
            )

        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
        upsert = [UserScramCredentialUpsertion("eve", info, b"eve-password", b"salt-salt-salt")]
        mallory = admin_as("mallory")
        with pytest.raises(Exception, match="CLUSTER_AUTHORIZATION_FAILED"):
            mallory.alter_user_scram_credentials(upsert)["eve"].result(30)
        with pytest.raises(Exception, match="CLUSTER_AUTHORIZATION_FAILED"):
            mallory.describe_user_scram_credentials(["root"])["root"].result(30)
        root = admin_as("root")
        root.alter_user_scram_credentials(upsert)["eve"].result(30)
        described = root.describe_user_scram_credentials(["eve"])["eve"].result(30)
        assert [i.iterations for i in described.scram_credential_infos] == [4096]
    finally:
        cluster.stop_all()


def test_describe_unknown_user_is_resource_not_found(secured: SecureBroker) -> None:
    admin = AdminClient(sasl_ssl_confluent(secured))
    future = admin.describe_user_scram_credentials(["nobody-here"])["nobody-here"]
    with pytest.raises(Exception, match=r"RESOURCE_NOT_FOUND|not found|No credentials"):
        future.result(30)


def _credential_json(secured: SecureBroker, user: str, mechanism: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        etcd = await harness_etcd(secured.etcd_url)
        try:
            kv = await etcd.get(keys.scram_credential_key(secured.cluster, user, mechanism))
            assert kv is not None
            return dict(json.loads(kv.value))
        finally:
            await etcd.close()

    return asyncio.run(read())


def _login_errors(config: dict[str, Any]) -> list[int]:
    """Error codes librdkafka reports while trying to log in with ``config``."""
    errors: list[int] = []
    producer = Producer({**config, "error_cb": lambda e: errors.append(e.code())})
    producer.produce(new_topic(), value=b"x")
    deadline = time.monotonic() + 20
    while KafkaError._AUTHENTICATION not in errors and time.monotonic() < deadline:
        producer.poll(0.2)
    producer.purge()
    producer.flush(1)
    return errors


def test_wrong_password_gets_authentication_failed(secured: SecureBroker) -> None:
    errors = _login_errors(sasl_ssl_confluent(secured, ALICE, "not-the-password"))
    assert KafkaError._AUTHENTICATION in errors


# --- the SASL exchange on the wire -------------------------------------------------------------


def _handshake(wire: KafkaWire, mechanism: str) -> Any:
    return wire.request(SASL_HANDSHAKE, 1, {"mechanism": mechanism})


def _authenticate(wire: KafkaWire, payload: bytes) -> Any:
    return wire.request(SASL_AUTHENTICATE, 2, {"auth_bytes": payload})


def _login_plain(wire: KafkaWire, user: str, password: str) -> Any:
    assert _handshake(wire, "PLAIN").error_code == 0
    return _authenticate(wire, f"\0{user}\0{password}".encode())


def _scram_final(
    first_bare: str, server_first: str, password: str, digest: str
) -> tuple[str, bytes]:
    """The client-final message (RFC 5802) and the server signature to expect."""
    attributes = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    without_proof = f"c=biws,r={attributes['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, digest)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_key = hmac.digest(salted, b"Server Key", digest)
    expected = hmac.digest(server_key, auth_message, digest)
    return f"{without_proof},p={base64.b64encode(proof).decode()}", expected


@pytest.mark.parametrize(
    ("mechanism", "digest"), [("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")]
)
def test_scram_exchange_on_the_wire(secured: SecureBroker, mechanism: str, digest: str) -> None:
    with KafkaWire(secured.sasl) as wire:
        assert _handshake(wire, mechanism).error_code == 0
        first_bare = f"n={ALICE},r=clientnonce123"
        server_first = _authenticate(wire, f"n,,{first_bare}".encode()).auth_bytes.decode()
        assert server_first.startswith("r=clientnonce123")
        final, expected = _scram_final(first_bare, server_first, ALICE_PASSWORD, digest)
        answer = _authenticate(wire, final.encode())
        assert answer.error_code == 0
        assert answer.auth_bytes == b"v=" + base64.b64encode(expected)
        metadata = wire.request(METADATA, 9, metadata_body([]))
        assert metadata.brokers[0].port == secured.ports["SASL"]


def test_wrong_scram_proof_is_refused_and_the_connection_closed(secured: SecureBroker) -> None:
    with KafkaWire(secured.sasl) as wire:
        assert _handshake(wire, "SCRAM-SHA-512").error_code == 0
        first_bare = f"n={ALICE},r=abc"
        server_first = _authenticate(wire, f"n,,{first_bare}".encode()).auth_bytes.decode()
        final, _ = _scram_final(first_bare, server_first, "wrong-password", "sha512")
        answer = _authenticate(wire, final.encode())
        assert answer.error_code == 58  # SASL_AUTHENTICATION_FAILED
        assert "invalid credentials" in answer.error_message
        assert wire.is_closed_by_peer()


def test_plain_checks_against_the_scram_credentials(secured: SecureBroker) -> None:
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, ALICE, ALICE_PASSWORD).error_code == 0
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, ALICE, "wrong").error_code == 58
        assert wire.is_closed_by_peer()
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, "nobody", "x").error_code == 58


def test_unknown_mechanism_is_refused(secured: SecureBroker) -> None:
    with KafkaWire(secured.sasl) as wire:
        answer = _handshake(wire, "GSSAPI")
        assert answer.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert set(answer.mechanisms) == {"SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"}
        assert wire.is_closed_by_peer()


def test_requests_before_authentication_close_the_connection(secured: SecureBroker) -> None:
    produce_body = {
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": "x", "partition_data": [{"index": 0, "records": b""}]}],
    }
    with KafkaWire(secured.sasl) as wire:
        versions = wire.request(
            API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"}
        )
        assert versions.error_code == 0
        wire.send(0, 9, produce_body)
        assert wire.is_closed_by_peer()
    with KafkaWire(secured.sasl) as wire:  # a handshake is not a login
        assert _handshake(wire, "PLAIN").error_code == 0
        wire.send(METADATA, 9, metadata_body(None))
        assert wire.is_closed_by_peer()
    with KafkaWire(secured.sasl) as wire:  # SaslAuthenticate without a handshake
        answer = _authenticate(wire, b"\0alice\0x")
        assert answer.error_code == 34  # ILLEGAL_SASL_STATE
        assert wire.is_closed_by_peer()


def test_large_frames_wait_for_the_login(secured: SecureBroker) -> None:
    """Before its login a SASL connection may send 512 KiB frames at most (Kafka's
    sasl.server.max.receive.size); after it, produce requests of the usual size go through."""
    import struct

    from harness.batches import make_batch
    from harness.kafka_wire import PRODUCE, produce_body, produce_partition

    with KafkaWire(secured.sasl) as wire:
        wire.send_raw(struct.pack(">i", 600 * 1024) + b"\0" * 1024)
        assert wire.is_closed_by_peer()
    topic = new_topic()
    admin = AdminClient(sasl_ssl_confluent(secured))
    admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
    with KafkaWire(secured.sasl) as wire:
        assert _login_plain(wire, ALICE, ALICE_PASSWORD).error_code == 0
        batch = make_batch(0, [secrets.token_bytes(700 * 1024)])
        code, _ = produce_partition(wire.request(PRODUCE, 9, produce_body(topic, 0, batch)))
        assert code == 0


def test_sasl_handshake_on_a_plaintext_listener_is_an_illegal_state(secured: SecureBroker) -> None:
    with KafkaWire(secured.internal) as wire:
        assert _handshake(wire, "PLAIN").error_code == 34


# --- mTLS --------------------------------------------------------------------------------------


def test_mtls_client_produces_and_consumes(secured: SecureBroker) -> None:
    config = confluent_mtls(secured.mtls, secured.pki)
    topic = new_topic()
    producer = Producer(config)
    for i in range(5):
        producer.produce(topic, value=f"m-{i}".encode())
    assert producer.flush(30) == 0
    assert sorted(consume_values(config, topic, 5)) == sorted(f"m-{i}".encode() for i in range(5))
    kp = KafkaProducer(
        bootstrap_servers=secured.mtls,
        security_protocol="SSL",
        ssl_cafile=str(secured.pki.ca.cert_path),
        ssl_certfile=str(secured.pki.alice.cert),
        ssl_keyfile=str(secured.pki.alice.key),
    )
    kp.send(topic, b"kafka-python over mTLS").get(30)
    kp.close()
    # the certificate's subject is the principal, as Kafka's default principal builder says it
    assert "authenticated by certificate as User:CN=alice,O=KafScale Test" in (
        secured.process.log_path.read_text()
    )


def _tls_connect(secured: SecureBroker, cert: Path | None, key: Path | None) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(secured.pki.ca.cert_path))
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    raw = socket.create_connection(("127.0.0.1", secured.ports["MTLS"]), timeout=10)
    tls = context.wrap_socket(raw, server_hostname="localhost")
    # TLS 1.3 reports a refused client certificate only at the first read
    tls.sendall(_api_versions_frame())
    tls.recv(4)
    return tls


def _api_versions_frame() -> bytes:
    from kafscale.broker.protocol import codec

    return codec.encode_request(API_VERSIONS, 0, 1, {})


@pytest.mark.parametrize("who", ["no certificate", "expired", "untrusted CA"])
def test_mtls_listener_refuses_bad_client_certificates(secured: SecureBroker, who: str) -> None:
    pair = {
        "no certificate": None,
        "expired": secured.pki.expired,
        "untrusted CA": secured.pki.stranger,
    }[who]
    cert, key = (pair.cert, pair.key) if pair else (None, None)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):  # noqa: SIM117
        with _tls_connect(secured, cert, key) as tls:
            if not tls.recv(4):
                raise ConnectionError("closed")


def test_valid_client_certificate_is_answered(secured: SecureBroker) -> None:
    with _tls_connect(secured, secured.pki.alice.cert, secured.pki.alice.key) as tls:
        assert len(tls.recv(65536)) > 0


# --- certificate reload ------------------------------------------------------------------------


def test_a_replaced_server_certificate_is_served_to_new_connections(secured: SecureBroker) -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    from harness.tls import issue

    def served_serial() -> int:
        context = ssl.create_default_context(cafile=str(secured.pki.ca.cert_path))
        address = ("127.0.0.1", secured.ports["SECURE"])
        with (
            socket.create_connection(address, timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der).serial_number

    before = served_serial()
    fresh = issue(
        secured.pki.ca,
        secured.workdir / "pki",
        "server-renewed",
        [(NameOID.COMMON_NAME, "localhost")],
        server=True,
    )
    renewed_serial = x509.load_pem_x509_certificate(fresh.cert.read_bytes()).serial_number
    assert renewed_serial != before
    # replace the files the way a Secret update does: key and certificate together
    os.replace(fresh.key, secured.pki.server.key)
    os.replace(fresh.cert, secured.pki.server.cert)
    deadline = time.monotonic() + 15
    while served_serial() != renewed_serial:
        assert time.monotonic() < deadline, "the renewed certificate was not picked up"
        time.sleep(0.1)


# --- the admin port ----------------------------------------------------------------------------


def test_admin_drain_and_status_need_the_token(secured: SecureBroker) -> None:
    url = secured.process.admin_url
    assert admin_request(url, "GET", "/healthz")[0] == 200
    assert admin_request(url, "GET", "/readyz")[0] == 200
    assert admin_request(url, "GET", "/status")[0] == 401
    assert admin_request(url, "POST", "/drain")[0] == 401
    assert admin_request(url, "POST", "/drain", token="wrong")[0] == 401
    status, body = admin_request(url, "GET", "/status", token=secured.token)
    assert status == 200 and body["node_id"] == secured.process.node_id


def test_drain_hook_sends_the_token_from_the_brokers_environment(secured: SecureBroker) -> None:
    """Last in the module: the broker is drained afterwards."""
    env = settings_free_env()
    hook = [sys.executable, "-m", "kafscale.broker.drain_hook"]
    args = ["--admin-url", secured.process.admin_url, "--timeout-s", "30"]
    refused = children.run([*hook, *args], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1
    # one line saying why, not a Python dict on stdout
    assert refused.stdout == "" and refused.stderr.splitlines() == [
        "kafscale drain: refused (HTTP 401): a valid bearer token is required"
    ], (refused.stdout, refused.stderr)
    assert secured.process.status()["draining"] is False
    env["KAFSCALE_ADMIN__TOKEN_FILE"] = secured.process.env["KAFSCALE_ADMIN__TOKEN_FILE"]
    done = children.run([*hook, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert secured.process.status()["draining"] is True
