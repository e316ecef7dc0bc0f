"""Delegation tokens (KIP-48) with the Java client, against a broker and through the proxy.

One broker serves the module with the authorizer on and a token secret key, on a PLAINTEXT
listener ``PLAIN`` and a SASL_PLAINTEXT listener ``SASL``; a proxy in front of it has a
SASL_PLAINTEXT listener and logs in to the broker as ``proxy-user`` (trusted to forward
principals). alice may write and read the ``tok-`` topics and groups; bob and eve may do
nothing. The Java AdminClient creates, renews, expires and describes tokens
(``java/TokenAdmin.java``); Java producers and consumers log in with a token
(``ScramLoginModule ... tokenauth="true"``) and get alice's rights. kafka-python and
librdkafka offer no SCRAM token login (no ``tokenauth`` extension), so the Java client is the
one client here that logs in with a token.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from harness import children
from harness.brokers import BrokerCluster, new_cluster
from harness.etcd import harness_etcd
from harness.java_client import java_client, java_program
from harness.java_session import JavaSession
from harness.ports import free_port_run, listener_ports
from harness.proxy import add_proxy
from harness.s3 import S3Endpoint
from harness.secured import add_broker, kafscale_cli, kafscale_cli_calls, make_topics

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec
from kafscale.broker.proxy.login import SaslLogin, log_in

pytestmark = pytest.mark.integration

SECRET_KEY = "token-signing-key-" + uuid.uuid4().hex
PASSWORDS = {"alice": "alice-secret-xx", "bob": "bob-secret-xxxx", "eve": "eve-secret-xxxx"}
PROXY_USER, PROXY_PASSWORD = "proxy-user", "proxy-secret-xx"
TOKEN_ENV = {
    "KAFSCALE_AUTHORIZER__ENABLED": "true",
    "KAFSCALE_DELEGATION_TOKEN__SECRET_KEY": SECRET_KEY,
    "KAFSCALE_DELEGATION_TOKEN__EXPIRY_CHECK_INTERVAL_MS": "300",
}
SOURCE = Path(__file__).with_name("java") / "TokenAdmin.java"
REMOVAL_DEADLINE_S = 30.0


@dataclass
class TokenCluster:
    cluster: BrokerCluster
    plain: str
    sasl: str
    proxy: str
    workdir: Path
    session: JavaSession

    def properties(self, name: str, user: str, password: str, token: bool = False) -> Path:
        """A Java client properties file for a SCRAM login (with a token: tokenauth)."""
        mechanism = "SCRAM-SHA-256" if token else "SCRAM-SHA-512"
        extension = ' tokenauth="true"' if token else ""
        path = self.workdir / f"{name}-{uuid.uuid4().hex[:6]}.properties"
        path.write_text(
            "security.protocol=SASL_PLAINTEXT\n"
            f"sasl.mechanism={mechanism}\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user}" password="{password}"{extension};\n'
        )
        return path

    def user(self, name: str) -> Path:
        return self.properties(name, name, PASSWORDS[name])


@pytest.fixture(scope="module")
def tokens(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TokenCluster]:
    workdir = tmp_path_factory.mktemp("tokens")
    etcd_url = etcd_server.client_url
    cluster = new_cluster(etcd_url, s3_server, workdir, "tok")
    name = cluster.cluster
    users = {**PASSWORDS, PROXY_USER: PROXY_PASSWORD}
    grants = (
        ("--topic", "tok-", "--prefixed", "--principal", "User:alice", "--operation", "WRITE"),
        ("--topic", "tok-", "--prefixed", "--principal", "User:alice", "--operation", "READ"),
        ("--group", "tok-", "--prefixed", "--principal", "User:alice", "--operation", "READ"),
        (
            "--cluster-resource",
            "--principal",
            f"User:{PROXY_USER}",
            "--operation",
            "CLUSTER_ACTION",
        ),
        ("--cluster-resource", "--principal", "User:alice", "--operation", "DESCRIBE_CONFIGS"),
    )
    kafscale_cli_calls(
        etcd_url,
        name,
        [
            (("users", "create", user, "--password-stdin"), password)
            for user, password in users.items()
        ]
        + [(("acls", "add", *grant), "") for grant in grants],
    )
    ports = listener_ports("PLAIN", "SASL")
    broker = add_broker(
        cluster,
        ports,
        "PLAIN",
        "broker.log",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="PLAIN:PLAINTEXT,SASL:SASL_PLAINTEXT",
        **TOKEN_ENV,
    )
    proxy_port = free_port_run(avoid=ports.values())
    proxy = add_proxy(
        cluster,
        proxy_port,
        "proxy.log",
        KAFSCALE_LISTENERS=f"CLIENTS://127.0.0.1:{proxy_port}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="CLIENTS:SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__LISTENER="SASL",
        KAFSCALE_UPSTREAM__SASL_MECHANISM="SCRAM-SHA-256",
        KAFSCALE_UPSTREAM__SASL_USERNAME=PROXY_USER,
        KAFSCALE_UPSTREAM__SASL_PASSWORD=PROXY_PASSWORD,
        **TOKEN_ENV,
    )
    # One JVM for the module's dozens of TokenAdmin calls (each still a new Admin and login).
    session = JavaSession([*java_program(SOURCE, "TokenAdmin"), "serve"])
    try:
        broker.start()
        proxy.start()
        yield TokenCluster(
            cluster,
            f"127.0.0.1:{ports['PLAIN']}",
            f"127.0.0.1:{ports['SASL']}",
            f"127.0.0.1:{proxy_port}",
            workdir,
            session,
        )
    finally:
        session.close()
        cluster.stop_all()


@dataclass(frozen=True)
class Token:
    token_id: str
    hmac: str
    expiry_ms: int
    max_ms: int


def admin(tc: TokenCluster, bootstrap: str, properties: Path | None, *args: str) -> list[str]:
    """One TokenAdmin call: its output's words (``error <Exception>`` on failure)."""
    _, lines = tc.session.call(str(properties or "-"), args[0], bootstrap, *args[1:])
    return " ".join(lines).split()


def create(
    tc: TokenCluster, bootstrap: str, properties: Path, *args: str, lifetime_ms: int = -1
) -> Token:
    words = admin(tc, bootstrap, properties, "create", str(lifetime_ms), *args)
    assert words[0] == "token", words
    return Token(words[1], words[2], int(words[3]), int(words[4]))


def token_login(tc: TokenCluster, token: Token) -> Path:
    return tc.properties(f"token-{token.token_id[:6]}", token.token_id, token.hmac, token=True)


def produce_consume(tc: TokenCluster, bootstrap: str, properties: Path, count: int = 5) -> int:
    """A Java producer, then a consumer group member, logged in as ``properties`` says, on a
    new ``tok-`` topic: how many records the consumer read back."""
    topic, group = f"tok-{uuid.uuid4().hex[:8]}", f"tok-g-{uuid.uuid4().hex[:6]}"
    make_topics(tc.cluster.etcd_url, tc.cluster.cluster, 2, topic)
    env = {**os.environ, "CLIENT_PROPERTIES": str(properties)}
    produced = children.run(
        [*java_client(), "produce", bootstrap, topic, "2", str(count), "none"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert len(produced.stdout.splitlines()) == count
    consumed = children.run(
        [*java_client(), "consume", bootstrap, topic, group, str(count), "30000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert consumed.returncode == 0, consumed.stdout + consumed.stderr
    return sum(line.startswith("record ") for line in consumed.stdout.splitlines())


def test_a_token_logs_in_as_its_owner_and_gets_the_owners_rights(tokens: TokenCluster) -> None:
    made = create(tokens, tokens.sasl, tokens.user("alice"), "-", "User:bob")
    login = token_login(tokens, made)
    assert produce_consume(tokens, tokens.sasl, login) == 5
    described = admin(tokens, tokens.sasl, tokens.user("alice"), "describe")
    assert described[0] == "described" and made.token_id in described
    line = described[described.index(made.token_id) :][:5]
    assert line == [made.token_id, "User:alice", "User:alice", made.hmac, "User:bob"]
    # bob renews (a renewer), eve may not (neither owner nor renewer) and sees nothing
    assert (
        admin(tokens, tokens.sasl, tokens.user("bob"), "renew", made.hmac, "60000")[0] == "renewed"
    )
    assert admin(tokens, tokens.sasl, tokens.user("eve"), "renew", made.hmac, "60000") == [
        "error",
        "DelegationTokenOwnerMismatchException",
    ]
    assert made.token_id not in admin(tokens, tokens.sasl, tokens.user("eve"), "describe")
    # a token-authenticated connection may not create, renew or describe tokens
    assert admin(tokens, tokens.sasl, login, "create", "-1") == [
        "error",
        "UnsupportedByAuthenticationException",
    ]
    assert admin(tokens, tokens.sasl, login, "renew", made.hmac, "1000")[1] == (
        "UnsupportedByAuthenticationException"
    )
    # expired at the owner's request: gone at once, and its logins are refused
    assert (
        admin(tokens, tokens.sasl, tokens.user("alice"), "expire", made.hmac, "-1")[0] == "expired"
    )
    assert admin(tokens, tokens.sasl, login, "describe") == ["error", "SaslAuthenticationException"]
    assert admin(tokens, tokens.sasl, tokens.user("alice"), "renew", made.hmac, "1000") == [
        "error",
        "DelegationTokenNotFoundException",
    ]


def test_a_token_has_no_rights_of_its_own_beyond_the_owners(tokens: TokenCluster) -> None:
    """bob's token logs in as bob, who may write nothing: the producer is refused."""
    made = create(tokens, tokens.sasl, tokens.user("bob"))
    env_file = token_login(tokens, made)
    topic = f"tok-{uuid.uuid4().hex[:6]}"
    make_topics(tokens.cluster.etcd_url, tokens.cluster.cluster, 1, topic)
    done = children.run(
        [*java_client(), "produce", tokens.sasl, topic, "1", "1", "none"],
        env={**os.environ, "CLIENT_PROPERTIES": str(env_file)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "AuthorizationException" in done.stdout + done.stderr


def test_tokens_are_refused_on_unauthenticated_listeners(tokens: TokenCluster) -> None:
    assert admin(tokens, tokens.plain, None, "create", "-1") == [
        "error",
        "UnsupportedByAuthenticationException",
    ]
    assert admin(tokens, tokens.plain, None, "describe") == [
        "error",
        "UnsupportedByAuthenticationException",
    ]


def test_a_token_for_another_owner_needs_create_tokens_on_that_user(tokens: TokenCluster) -> None:
    assert admin(tokens, tokens.sasl, tokens.user("eve"), "create", "-1", "User:alice") == [
        "error",
        "DelegationTokenAuthorizationException",
    ]
    name = tokens.cluster.cluster
    kafscale_cli(
        tokens.cluster.etcd_url,
        name,
        "acls",
        "add",
        "--user-principal",
        "User:alice",
        "--principal",
        "User:eve",
        "--operation",
        "CREATE_TOKENS",
    )
    deadline = time.monotonic() + REMOVAL_DEADLINE_S
    while True:  # the broker's ACL watch takes a moment
        words = admin(tokens, tokens.sasl, tokens.user("eve"), "create", "-1", "User:alice")
        if words[0] == "token" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert words[0] == "token", words
    described = admin(tokens, tokens.sasl, tokens.user("alice"), "describe", "User:alice")
    line = described[described.index(words[1]) :][:3]
    assert line == [words[1], "User:alice", "User:eve"]  # owner alice, requested by eve
    by_eve = token_login(tokens, Token(words[1], words[2], 0, 0))
    assert produce_consume(tokens, tokens.sasl, by_eve) == 5  # alice's rights


def _stored(tc: TokenCluster, token_id: str) -> bool:
    async def run() -> bool:
        etcd = await harness_etcd(tc.cluster.etcd_url)
        try:
            return (
                await etcd.get(keys.delegation_token_key(tc.cluster.cluster, token_id)) is not None
            )
        finally:
            await etcd.close()

    return asyncio.run(run())


def test_an_expired_token_is_refused_and_removed(tokens: TokenCluster) -> None:
    # Long enough to outlast TokenAdmin's JVM exit and the etcd read below on a loaded machine
    # (the broker removes the token soon after it expires: 1.5 s left a race).
    made = create(tokens, tokens.sasl, tokens.user("alice"), lifetime_ms=6000)
    assert made.max_ms - made.expiry_ms == 0
    assert _stored(tokens, made.token_id)
    while time.time() * 1000 <= made.expiry_ms + 50:
        time.sleep(0.1)
    assert admin(tokens, tokens.sasl, token_login(tokens, made), "describe") == [
        "error",
        "SaslAuthenticationException",
    ]
    deadline = time.monotonic() + REMOVAL_DEADLINE_S
    while _stored(tokens, made.token_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _stored(tokens, made.token_id)


def test_through_the_proxy(tokens: TokenCluster) -> None:
    """Created at the proxy (forwarded to a broker), used at the proxy (its own SASL login
    reads the token from etcd) with alice's rights; a token login at the proxy may not create
    tokens."""
    made = create(tokens, tokens.proxy, tokens.user("alice"))
    login = token_login(tokens, made)
    assert produce_consume(tokens, tokens.proxy, login) == 5
    assert admin(tokens, tokens.proxy, login, "create", "-1") == [
        "error",
        "UnsupportedByAuthenticationException",
    ]
    assert admin(tokens, tokens.proxy, tokens.user("eve"), "expire", made.hmac, "-1") == [
        "error",
        "DelegationTokenOwnerMismatchException",
    ]
    assert (
        admin(tokens, tokens.proxy, tokens.user("alice"), "expire", made.hmac, "-1")[0] == "expired"
    )
    assert admin(tokens, tokens.proxy, login, "describe") == [
        "error",
        "SaslAuthenticationException",
    ]


def test_describe_configs_says_the_key_is_set_but_never_what_it_is(tokens: TokenCluster) -> None:
    admin_client = AdminClient(
        {
            "bootstrap.servers": tokens.sasl,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": PASSWORDS["alice"],
        }
    )
    (broker_id,) = admin_client.list_topics(timeout=30).brokers
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    configs = admin_client.describe_configs([resource])[resource].result(timeout=30)
    key = configs["delegation.token.secret.key"]
    assert key.is_sensitive and key.value is None
    assert configs["delegation.token.expiry.check.interval.ms"].value == "300"
    assert not any(SECRET_KEY in str(entry.value) for entry in configs.values())


CREATE_DELEGATION_TOKEN, ENVELOPE = 38, 58
REQUEST_NOT_ALLOWED = 64


async def _forwarded_create(
    address: str, token_authenticated: bool, login: SaslLogin | None = None
) -> int:
    """CreateDelegationToken for alice in an Envelope from the proxy's own user (trusted:
    CLUSTER_ACTION), her principal marked token-authenticated or not: the inner error code
    (the Envelope's own when it is refused)."""
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        login = login or SaslLogin("SCRAM-SHA-256", PROXY_USER, PROXY_PASSWORD)
        await log_in(reader, writer, login, 1 << 20)
        create = {"renewers": [], "max_lifetime": -1}
        inner = codec.encode_request(CREATE_DELEGATION_TOKEN, 3, 5, create, "t")[4:]
        envelope = {
            "request_data": inner,
            "request_principal": codec.encode_principal("User:alice", token_authenticated),
            "client_host_address": bytes([127, 0, 0, 1]),
        }
        writer.write(codec.encode_request(ENVELOPE, 0, 9, envelope, "t"))
        await writer.drain()
        (length,) = struct.unpack(">i", await reader.readexactly(4))
        answer = codec.decode_response(await reader.readexactly(length), ENVELOPE, 0)
        if int(answer.error_code) != 0:
            return int(answer.error_code)
        # The error code follows the flexible response header (correlation id, no tags);
        # an error answer carries Kafka's -1 timestamps, which kio's reader refuses.
        (code,) = struct.unpack_from(">h", bytes(answer.response_data), 5)
        return int(code)
    finally:
        writer.close()


def test_a_broker_refuses_token_requests_forwarded_for_a_token_login(tokens: TokenCluster) -> None:
    """The proxy marks a token login's principal in the Envelope (Kafka's
    ``token_authenticated``); a broker refuses its token requests as from a direct token
    login, and runs the same request for the same principal without the mark."""
    assert asyncio.run(_forwarded_create(tokens.sasl, True)) == REQUEST_NOT_ALLOWED
    assert asyncio.run(_forwarded_create(tokens.sasl, False)) == 0


CLUSTER_AUTHORIZATION_FAILED = 31


def test_a_token_login_may_not_forward_requests(tokens: TokenCluster) -> None:
    """A token of the proxy's own principal (which may CLUSTER_ACTION) logs in, but its
    Envelopes are refused: it would otherwise act as any principal, unmarked, and mint tokens
    that outlive it."""
    proxys = create(tokens, tokens.sasl, tokens.properties("proxy", PROXY_USER, PROXY_PASSWORD))
    by_token = SaslLogin("SCRAM-SHA-256", proxys.token_id, proxys.hmac, token_auth=True)
    answer = asyncio.run(_forwarded_create(tokens.sasl, False, by_token))
    assert answer == CLUSTER_AUTHORIZATION_FAILED


def test_a_proxy_that_does_not_forward_principals_refuses_token_requests(
    tokens: TokenCluster,
) -> None:
    """With ``upstream.forward_principals`` off the brokers see every client as the proxy's
    own user (here one that may CLUSTER_ACTION): a token alice asked for there would be the
    proxy's, a login stronger than hers. That proxy refuses the token APIs instead."""
    port = free_port_run()
    proxy = add_proxy(
        tokens.cluster,
        port,
        "proxy-unforwarded.log",
        KAFSCALE_LISTENERS=f"CLIENTS://127.0.0.1:{port}",
        KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP="CLIENTS:SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KAFSCALE_UPSTREAM__LISTENER="SASL",
        KAFSCALE_UPSTREAM__SASL_MECHANISM="SCRAM-SHA-256",
        KAFSCALE_UPSTREAM__SASL_USERNAME=PROXY_USER,
        KAFSCALE_UPSTREAM__SASL_PASSWORD=PROXY_PASSWORD,
        KAFSCALE_UPSTREAM__FORWARD_PRINCIPALS="false",
        **TOKEN_ENV,
    )
    proxy.start()
    try:
        answer = admin(tokens, f"127.0.0.1:{port}", tokens.user("alice"), "create", "-1")
        assert answer == ["error", "UnsupportedByAuthenticationException"]
    finally:
        proxy.stop()
