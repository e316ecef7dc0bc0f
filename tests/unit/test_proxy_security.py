"""The pure parts of the proxy's security: forwarded principals in Envelopes, the client
address, the proxy's own ACL checks and its security settings."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from kafscale.broker.authz.model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from kafscale.broker.authz.store import AclCache, binding_key
from kafscale.broker.config import AuthorizerSettings, BrokerSettings, TlsSettings
from kafscale.broker.local import LocalOptions, local_proxy_settings, local_settings
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import answers
from kafscale.broker.proxy.access import ProxyAccess
from kafscale.broker.proxy.answers import Identity
from kafscale.broker.proxy.config import ProxySettings, UpstreamSettings
from kafscale.broker.proxy.upstream import ForwardingRefused, UpstreamError, UpstreamLink
from kafscale.broker.security.forwarding import address_bytes, address_text, peer_host
from kafscale.broker.security.listeners import ClientAuth, SecurityProtocol
from kafscale.broker.security.local_pki import BROKER_PRINCIPAL, PROXY_PRINCIPAL, make_local_pki
from kafscale.broker.security.sasl_client import ScramClient, plain_message
from kafscale.broker.security.scram import (
    AuthenticationFailed,
    ScramExchange,
    ScramMechanism,
    new_credential,
    parse_client_first,
)
from kafscale.operator import manifest_config, manifest_proxy
from kafscale.operator.models import ClusterRef, parse_cluster_spec

# --- principals and addresses ------------------------------------------------------------------


def test_principal_is_kafkas_version_prefixed_default_principal_data() -> None:
    data = codec.encode_principal("User:alice")
    # i16 version 0, compact strings "User" and "alice", token_authenticated false, no tags
    assert data == b"\x00\x00" + b"\x05User" + b"\x06alice" + b"\x00" + b"\x00"
    assert codec.decode_principal(data) == "User:alice"
    subject = "User:CN=alice,O=Example"  # a certificate principal keeps its colons and commas
    assert codec.decode_principal(codec.encode_principal(subject)) == subject


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x01\x05User\x06alice\x00\x00",  # a version we do not know
        b"\x00\x00\x05User\x01\x00\x00",  # no name
        b"\x00\x00\x05User\x06alice\x01\x00",  # token-authenticated: never trusted
        b"\x00\x00\xff",
    ],
)
def test_unreadable_forwarded_principals_are_refused(data: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode_principal(data)


def test_client_addresses_travel_as_kafka_writes_them() -> None:
    assert address_bytes("10.1.2.3") == bytes([10, 1, 2, 3])
    assert address_text(bytes([10, 1, 2, 3])) == "10.1.2.3"
    assert address_text(address_bytes("::1")) == "::1"
    assert address_text(address_bytes("[fe80::1]")) == "fe80::1"
    assert address_bytes("/run/kafka.sock") == b""
    assert address_text(b"") == "*"
    with pytest.raises(ValueError):
        address_text(b"\x01\x02\x03")
    assert peer_host("10.0.0.1:5000") == "10.0.0.1"
    assert peer_host("::1:5000") == "::1"


# --- the Envelope on the proxy's side ------------------------------------------------------------


def _request_frame(correlation_id: int) -> bytes:
    return codec.encode_request(3, 9, correlation_id, {"topics": None}, "client-1")


def test_a_link_wraps_the_request_whole_in_an_envelope_with_the_clients_principal() -> None:
    link = UpstreamLink(None, codec.encode_principal("User:alice"), address_bytes("10.0.0.7"))
    frame = _request_frame(42)
    wrapped = link.wrap(frame)
    decoded = codec.decode_request(wrapped[4:], codec.request_schema(58, 0))
    assert decoded.header.api_key == 58
    assert decoded.header.correlation_id == 42  # the broker's answer is matched by it
    assert decoded.body.request_data == frame[4:]
    assert codec.decode_principal(decoded.body.request_principal) == "User:alice"
    assert address_text(decoded.body.client_host_address) == "10.0.0.7"


def test_a_link_unwraps_the_answer_or_raises_when_the_broker_refused() -> None:
    link = UpstreamLink(None, codec.encode_principal("User:alice"), b"")
    inner = b"\x00\x00\x00\x2a" + b"inner response body"
    ok = codec.encode_response(58, 0, 42, {"response_data": inner, "error_code": 0})
    assert link.unwrap(ok[4:]) == inner
    refused = codec.encode_response(
        58, 0, 42, {"response_data": None, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
    )
    with pytest.raises(ForwardingRefused) as caught:
        link.unwrap(refused[4:])
    assert caught.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    with pytest.raises(UpstreamError):
        link.unwrap(b"\x00\x00\x00\x2a\x00\xff\xff")


def test_a_link_without_a_principal_sends_requests_bare() -> None:
    link = UpstreamLink()
    frame = _request_frame(7)
    assert link.wrap(frame) == frame
    assert link.unwrap(b"body") == b"body"


# --- the proxy's own ACL checks ------------------------------------------------------------------


def _access(enabled: bool = True, super_users: tuple[str, ...] = ()) -> ProxyAccess:
    cache = AclCache()
    binding = AclBinding(
        ResourceType.TOPIC,
        "orders-",
        PatternType.PREFIXED,
        "User:alice",
        "*",
        Operation.READ,
        Permission.ALLOW,
    )
    cache.put(binding_key("c", binding), binding.to_json())
    settings = AuthorizerSettings(enabled=enabled, super_users=super_users)
    return ProxyAccess(settings, cache)


def test_the_proxy_decides_describe_as_a_broker_would() -> None:
    access = _access()
    describe, topic = Operation.DESCRIBE, ResourceType.TOPIC
    assert access.allowed("User:alice", "10.0.0.1:1", describe, topic, "orders-eu")  # READ⇒
    assert not access.allowed("User:alice", "10.0.0.1:1", describe, topic, "payments")
    assert not access.allowed("User:bob", "10.0.0.1:1", describe, topic, "orders-eu")
    assert _access(super_users=("User:bob",)).allowed("User:bob", "h:1", describe, topic, "x")
    assert _access(enabled=False).allowed("User:bob", "h:1", describe, topic, "payments")


# --- settings ------------------------------------------------------------------------------------


def test_proxy_listeners_take_the_brokers_settings() -> None:
    settings = ProxySettings(
        listeners="EXTERNAL://:9093,INTERNAL://127.0.0.1:9092",
        listener_security_protocol_map="EXTERNAL:SASL_SSL,INTERNAL:PLAINTEXT",
        advertised_listeners="EXTERNAL://kafka.example.com:443",
        tls=TlsSettings(cert_file="server.crt", key_file="server.key"),
    )
    external, internal = settings.listener_plan()
    assert (external.name, external.protocol) == ("EXTERNAL", SecurityProtocol.SASL_SSL)
    assert (external.advertised_host, external.advertised_port) == ("kafka.example.com", 443)
    assert (internal.host, internal.port, internal.protocol) == (
        "127.0.0.1",
        9092,
        SecurityProtocol.PLAINTEXT,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"listeners": "E://:9093", "listener_security_protocol_map": "E:SASL_SSL"},  # no cert
        {"listeners": "E://:9093", "listener_security_protocol_map": "E:SASL"},  # no protocol
        {"upstream": {"security_protocol": "SASL_SSL"}},
        {"upstream": {"cert_file": "proxy.crt", "key_file": "proxy.key"}},  # not over TLS
        {"upstream": {"security_protocol": "SSL", "cert_file": "proxy.crt"}},  # no key
    ],
)
def test_bad_proxy_security_settings_are_refused_at_start(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ProxySettings(**kwargs)  # type: ignore[arg-type]


def test_forwarding_principals_is_on_by_default() -> None:
    assert UpstreamSettings().forward_principals
    assert ProxySettings().upstream.security_protocol is SecurityProtocol.PLAINTEXT


# --- kafscale local --proxy ----------------------------------------------------------------------


def _secured_local(tmp_path: Path) -> tuple[BrokerSettings, LocalOptions]:
    base = BrokerSettings(
        listeners="EXTERNAL://127.0.0.1:7000",
        listener_security_protocol_map="EXTERNAL:SASL_SSL",
        tls=TlsSettings(cert_file="server.crt", key_file="server.key"),
        authorizer=AuthorizerSettings(enabled=True, super_users=("User:admin",)),
    )
    return base, LocalOptions(tmp_path, 2, 7000, "0.0.0.0", proxy=True)


def test_local_proxy_takes_the_secured_listeners_and_the_brokers_only_trust_it(
    tmp_path: Path,
) -> None:
    base, options = _secured_local(tmp_path)
    pki = make_local_pki(tmp_path / "tls", [])
    proxy = local_proxy_settings(base, options, "http://etcd", pki)
    assert [(lst.name, lst.port, lst.protocol) for lst in proxy.listener_plan()] == [
        ("EXTERNAL", 7000, SecurityProtocol.SASL_SSL)
    ]
    assert proxy.authorizer.enabled and proxy.upstream.cert_file == pki.proxy_cert
    broker = local_settings(base, options, "http://etcd", 1, pki)
    (internal,) = broker.listener_plan()
    assert (internal.port, internal.protocol, internal.client_auth) == (
        7002,
        SecurityProtocol.SSL,
        ClientAuth.REQUIRED,
    )
    assert internal.advertised_host == "127.0.0.1"  # what the proxy dials, and the cert names
    assert broker.authorizer.super_users == ("User:admin", PROXY_PRINCIPAL, BROKER_PRINCIPAL)
    assert broker.tls.ca_file == pki.ca_file
    for key in (pki.broker_key, pki.proxy_key):
        assert key.stat().st_mode & 0o077 == 0


def test_local_proxy_without_the_authorizer_puts_plain_brokers_behind_it(
    tmp_path: Path,
) -> None:
    base, options = _secured_local(tmp_path)
    base = base.model_copy(update={"authorizer": AuthorizerSettings()})
    broker = local_settings(base, options, "http://etcd", 0)
    (plain,) = broker.listener_plan()
    assert (plain.port, plain.protocol) == (7001, SecurityProtocol.PLAINTEXT)
    assert local_proxy_settings(base, options, "http://etcd").upstream == UpstreamSettings()


# --- the proxy's own answers, as the client may see them ----------------------------------------


def _routes(*names: str) -> Any:
    topics = {name: TopicInfo(name, uuid.uuid4().hex, 1) for name in names}
    view = SimpleNamespace(topics=topics, topics_by_id={}, brokers={1: None})
    return SimpleNamespace(view=view, partition_owner=lambda tp: 1, leader_epoch=lambda tp: 0)


def test_proxy_metadata_lists_describable_topics_and_refuses_named_others() -> None:
    me = Identity(1000, "proxy", 9092, "c")
    routes = _routes("mine", "theirs")
    every = SimpleNamespace(topics=None, include_topic_authorized_operations=True)
    answer = answers.metadata(
        every, 12, routes, me, lambda name: name == "mine", lambda t, n: 0b1000
    )
    assert [(t["name"], t["topic_authorized_operations"]) for t in answer["topics"]] == [
        ("mine", 0b1000)
    ]
    assert answer["cluster_authorized_operations"] == answers.AUTHORIZED_OPERATIONS_OMITTED
    named = SimpleNamespace(topics=[SimpleNamespace(name="theirs")])
    (theirs,) = answers.metadata(named, 12, routes, me, lambda name: name == "mine")["topics"]
    assert theirs["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_proxy_find_coordinator_refuses_groups_the_client_may_not_describe() -> None:
    me = Identity(1000, "proxy", 9092, "c")
    request = SimpleNamespace(key_type=0, coordinator_keys=["g-mine", "other"])
    entries = answers.find_coordinator(request, 4, me, lambda group: group.startswith("g-"))
    assert [(e["key"], e["error_code"], e["node_id"]) for e in entries["coordinators"]] == [
        ("g-mine", ErrorCode.NONE, 1000),
        ("other", ErrorCode.GROUP_AUTHORIZATION_FAILED, -1),
    ]


# --- the proxy's SASL login to the brokers ------------------------------------------------------


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_the_proxys_scram_client_logs_in_to_the_brokers_scram_server(
    mechanism: ScramMechanism,
) -> None:
    credential = new_credential("proxy-pass", mechanism)
    client = ScramClient(mechanism, "proxy,user=x", "proxy-pass")
    first = parse_client_first(client.first_message())
    assert first.username == "proxy,user=x"  # escaped on the wire, the same name at the server
    server = ScramExchange(mechanism, first, credential)
    final = client.final_message(server.server_first_message())
    client.check_final(server.final(final))


def test_the_proxys_scram_client_checks_the_server_and_the_server_the_password() -> None:
    mechanism = ScramMechanism.SCRAM_SHA_512
    credential = new_credential("right", mechanism)
    wrong = ScramClient(mechanism, "proxy", "wrong")
    server = ScramExchange(mechanism, parse_client_first(wrong.first_message()), credential)
    with pytest.raises(AuthenticationFailed):
        server.final(wrong.final_message(server.server_first_message()))
    client = ScramClient(mechanism, "proxy", "right")
    server = ScramExchange(mechanism, parse_client_first(client.first_message()), credential)
    client.final_message(server.server_first_message())
    with pytest.raises(AuthenticationFailed):  # a server that does not know the credential
        client.check_final(b"v=" + b"A" * 88)
    with pytest.raises(AuthenticationFailed):  # a nonce the client did not start
        ScramClient(mechanism, "proxy", "right").final_message(b"r=other,s=AAAA,i=4096")
    assert plain_message("proxy", "pw") == b"\x00proxy\x00pw"


def test_a_sasl_upstream_needs_the_proxys_credentials() -> None:
    with pytest.raises(ValidationError):
        UpstreamSettings(security_protocol=SecurityProtocol.SASL_PLAINTEXT)
    with pytest.raises(ValidationError):
        UpstreamSettings(sasl_mechanism="GSSAPI")
    settings = UpstreamSettings(
        security_protocol=SecurityProtocol.SASL_SSL,
        sasl_username="proxy",
        sasl_password="pw",
        listener="proxy",
    )
    assert settings.sasl_mechanism == "SCRAM-SHA-512"


# --- on Kubernetes: the shared ConfigMap holds the brokers' listeners ---------------------------


def test_a_proxy_pod_serves_the_clusters_listeners_beside_the_brokers_configmap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The proxy reads the broker's listener settings under the same names; its Deployment
    sets the client listeners (the brokers' without INTERNAL) and their per-listener client
    auth over the ConfigMap's, and advertises the proxy's Service on each."""
    spec = parse_cluster_spec(
        {
            "storage": {"bucket": "bucket-1"},
            "proxy": {"enabled": True},
            "listeners": [
                {"name": "external", "port": 9093, "tls": True},
                {"name": "mtls", "port": 9094, "tls": True, "authentication": {"type": "tls"}},
            ],
        }
    )
    ref = ClusterRef(name="demo", namespace="kafka", uid="0b7f3c1e-0000-4000-8000-000000000001")
    deployment = manifest_proxy.build_proxy_deployment(ref, spec)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for key in list(os.environ):
        if key.startswith("KAFSCALE_"):
            monkeypatch.delenv(key)
    for key, value in manifest_config.broker_environment(ref, spec).items():  # envFrom
        monkeypatch.setenv(key, value)
    for item in container["env"]:  # env wins over envFrom
        if "value" in item:
            monkeypatch.setenv(item["name"], item["value"])
    plan = {lst.name: lst for lst in ProxySettings().listener_plan()}
    assert {n: (lst.port, lst.protocol) for n, lst in plan.items()} == {
        "EXTERNAL": (9093, SecurityProtocol.SSL),
        "MTLS": (9094, SecurityProtocol.SSL),
    }
    assert {lst.advertised_host for lst in plan.values()} == {"demo-proxy.kafka.svc"}
