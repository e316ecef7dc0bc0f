"""The proxy with spec.listeners and the authorizer: the pure builders (no API server).

What a user relies on: clients reach the proxy's Service on the cluster's listeners with their
TLS/SASL, and the brokers trust the client principals the proxy forwards because the proxy
proves who it is with a certificate from the cluster CA on the brokers' internal listener.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from harness import children
from harness.cluster_specs import (
    NOW,
    PLAIN_LISTENER,
    REF,
    THREE_LISTENERS,
    cluster_spec,
    container_of,
    find,
    objects_of,
)

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.security.listeners import ClientAuth, SecurityProtocol
from kafscale.broker.security.tls import principal_from_certificate
from kafscale.operator import certificates, listeners, manifest_config, manifest_proxy, naming, pki
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.models import ClusterRef, parse_cluster_spec

pytestmark = pytest.mark.operator

GUARDED = cluster_spec(listeners=THREE_LISTENERS, proxy={"enabled": True}, authorizer=True)
POD_ADVERTISED_LISTENERS = (
    "INTERNAL://10-0-0-7.kafka.pod:9091,PLAIN://10-0-0-7.kafka.pod:9092,"
    "EXTERNAL://10-0-0-7.kafka.pod:9093,MTLS://10-0-0-7.kafka.pod:9094"
)


def spec_of(raw: dict[str, Any]) -> Any:
    return parse_cluster_spec(raw)


def without_authorizer() -> dict[str, Any]:
    return {**GUARDED, "brokers": {}}


def pod_environment(raw: dict[str, Any], deployment: str) -> dict[str, str]:
    """What a pod of ``deployment`` sees: the ConfigMap, then its container's own values."""
    objects = objects_of(raw)
    env = dict(find(objects, "ConfigMap", "demo-config")["data"])
    for item in container_of(find(objects, "Deployment", deployment))["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def broker_pod_settings(raw: dict[str, Any], env: pytest.MonkeyPatch) -> BrokerSettings:
    """The settings a broker pod of ``raw`` starts with (its start command adds the advertised
    listeners from the pod's address)."""
    for key, value in pod_environment(raw, "demo-broker").items():
        env.setenv(key, value)
    env.setenv("KAFSCALE_ADVERTISED_LISTENERS", POD_ADVERTISED_LISTENERS)
    return BrokerSettings()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("KAFSCALE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_the_proxy_opens_the_clusters_listeners_and_reaches_brokers_with_its_certificate(
    clean_env: pytest.MonkeyPatch,
) -> None:
    for key, value in pod_environment(GUARDED, "demo-proxy").items():
        clean_env.setenv(key, value)
    settings = ProxySettings()
    plan = {lst.name: lst for lst in settings.listener_plan()}
    assert {n: (lst.port, lst.protocol) for n, lst in plan.items()} == {
        "PLAIN": (9092, SecurityProtocol.PLAINTEXT),
        "EXTERNAL": (9093, SecurityProtocol.SASL_SSL),
        "MTLS": (9094, SecurityProtocol.SSL),
    }
    # Clients are told the proxy's Service on every listener, never a broker.
    assert {n: (lst.advertised_host, lst.advertised_port) for n, lst in plan.items()} == {
        "PLAIN": ("demo-proxy.kafka.svc", 9092),
        "EXTERNAL": ("demo-proxy.kafka.svc", 9093),
        "MTLS": ("demo-proxy.kafka.svc", 9094),
    }
    assert plan["MTLS"].client_auth == ClientAuth.REQUIRED
    assert plan["EXTERNAL"].client_auth == ClientAuth.NONE
    assert settings.tls.cert_file == Path(naming.BROKER_TLS_DIR) / "tls.crt"
    assert settings.sasl.enabled_mechanisms == ("SCRAM-SHA-512",)
    upstream = settings.upstream
    assert upstream.security_protocol == SecurityProtocol.SSL
    assert upstream.cert_file == Path(naming.PROXY_CLIENT_TLS_DIR) / "tls.crt"
    assert upstream.key_file == Path(naming.PROXY_CLIENT_TLS_DIR) / "tls.key"
    assert upstream.ca_file == Path(naming.PROXY_CLIENT_TLS_DIR) / "ca.crt"
    assert upstream.forward_principals and upstream.check_hostname


def test_the_proxy_pod_mounts_what_its_settings_name_and_serves_the_listener_ports() -> None:
    objects = objects_of(GUARDED)
    proxy = find(objects, "Deployment", "demo-proxy")
    pod = proxy["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "demo-broker-tls", "proxy-client-tls": "demo-proxy-client-tls"}
    mounts = {m["name"]: m["mountPath"] for m in container_of(proxy)["volumeMounts"]}
    assert mounts["proxy-client-tls"] == naming.PROXY_CLIENT_TLS_DIR
    assert mounts["tls"] == naming.BROKER_TLS_DIR
    ports = {p["name"]: p["containerPort"] for p in container_of(proxy)["ports"]}
    assert ports == {"plain": 9092, "external": 9093, "mtls": 9094, "admin": 8080}
    service = find(objects, "Service", "demo-proxy")
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("plain", 9092, "plain"),
        ("external", 9093, "external"),
        ("mtls", 9094, "mtls"),
    ]


def test_brokers_require_the_proxys_certificate_and_trust_its_principal(
    clean_env: pytest.MonkeyPatch,
) -> None:
    settings = broker_pod_settings(GUARDED, clean_env)
    plan = {lst.name: lst for lst in settings.listener_plan()}
    assert plan["INTERNAL"].protocol == SecurityProtocol.SSL
    assert plan["INTERNAL"].client_auth == ClientAuth.REQUIRED
    assert plan["MTLS"].client_auth == ClientAuth.REQUIRED
    assert settings.tls.ca_file == Path(naming.BROKER_TLS_DIR) / "ca.crt"
    assert settings.authorizer.enabled
    # The user's super users stay; the proxy's and the brokers' own principals are added.
    assert settings.authorizer.super_users == (
        "User:admin",
        naming.PROXY_PRINCIPAL,
        naming.broker_principal(REF.name),
    )


def test_the_internal_listener_advertises_a_name_the_broker_certificate_covers(
    tmp_path: Path,
) -> None:
    """The proxy checks host names over TLS: the internal listener advertises the pod's DNS
    name (as the client listeners do), not its IP."""
    command = container_of(find(objects_of(GUARDED), "Deployment", "demo-broker"))["command"]
    fake = tmp_path / "kafscale"
    fake.write_text('#!/bin/sh\necho "$KAFSCALE_ADVERTISED_LISTENERS"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = children.run(
        [*command[:2], command[2].replace("$$", "$")],
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", listeners.POD_IP_VAR: "10.1.2.3"},
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    assert result.stdout.split(",")[0] == "INTERNAL://10-1-2-3.kafka.pod:9091"
    assert "*.kafka.pod" in listeners.broker_tls_hosts(REF)


def test_without_the_authorizer_the_internal_listener_stays_plaintext() -> None:
    raw = without_authorizer()
    env = manifest_config.broker_environment(REF, spec_of(raw))
    assert "INTERNAL:PLAINTEXT" in env["KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"]
    assert "KAFSCALE_AUTHORIZER__SUPER_USERS" not in env
    proxy_env = pod_environment(raw, "demo-proxy")
    assert not any(key.startswith("KAFSCALE_UPSTREAM__") for key in proxy_env)
    names = [leaf.secret_name for leaf in certificates.leaf_requests(REF, spec_of(raw))]
    assert "demo-proxy-client-tls" not in names
    # Clients still get the listeners on the proxy.
    assert proxy_env["KAFSCALE_LISTENERS"] == "PLAIN://:9092,EXTERNAL://:9093,MTLS://:9094"


def test_the_authorizer_on_the_internal_listener_alone_still_gets_a_broker_certificate() -> None:
    """No TLS client listener: the mTLS internal listener needs the server certificate too."""
    raw = {**GUARDED, "listeners": [PLAIN_LISTENER]}
    names = [leaf.secret_name for leaf in certificates.leaf_requests(REF, spec_of(raw))]
    assert names == ["demo-broker-tls", "demo-proxy-client-tls"]
    env = manifest_config.broker_environment(REF, spec_of(raw))
    assert env["KAFSCALE_TLS__CERT_FILE"] == f"{naming.BROKER_TLS_DIR}/tls.crt"


def test_the_operator_issued_proxy_certificate_names_the_trusted_principal() -> None:
    spec = spec_of(GUARDED)
    (leaf,) = [lf for lf in certificates.leaf_requests(REF, spec) if lf.component == naming.PROXY]
    ca = pki.make_ca(certificates.kafka_ca(REF).common_name, NOW)
    pair = pki.issue(ca, leaf.common_name, leaf.hosts, NOW, server=leaf.server, client=leaf.client)
    cert = x509.load_pem_x509_certificate(pair.cert)
    assert principal_from_certificate(cert.public_bytes(Encoding.DER)) == naming.PROXY_PRINCIPAL
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]


def test_cert_manager_issues_the_same_subject() -> None:
    objects = objects_of(GUARDED, cert_manager=True)
    certificate = find(objects, "Certificate", "demo-proxy-client-tls")["spec"]
    assert certificate["commonName"] == naming.PROXY_COMMON_NAME
    assert certificate["subject"] == {"organizations": ["kafscale"]}
    assert certificate["usages"] == ["digital signature", "key encipherment", "client auth"]
    assert certificate["issuerRef"]["name"] == naming.ca_issuer_name("demo")
    assert ("cert-manager.io/v1", "Certificate", "demo-proxy-client-tls") in (
        certificates.cert_manager_object_ids(REF)
    )


def test_status_names_the_proxy_once_it_is_ready() -> None:
    spec = spec_of(GUARDED)
    statuses = listeners.listener_status(REF, spec)
    assert statuses is not None
    assert [(s.name, s.bootstrap_servers) for s in statuses] == [
        ("plain", "demo-proxy.kafka.svc:9092"),
        ("external", "demo-proxy.kafka.svc:9093"),
        ("mtls", "demo-proxy.kafka.svc:9094"),
    ]
    assert naming.bootstrap_address(REF, spec) == "demo-proxy.kafka.svc:9092"
    before = listeners.listener_status(REF, spec, proxy_ready=False)
    assert before is not None and before[1].bootstrap_servers == "demo-brokers.kafka.svc:9093"


def test_bad_super_users_and_the_authorizer_without_listeners_are_refused() -> None:
    bad = cluster_spec(
        listeners=THREE_LISTENERS,
        proxy={"enabled": True},
        brokers={"config": {"authorizer.enabled": "true", "authorizer.super_users": "User:admin"}},
    )
    with pytest.raises(InvalidBrokerConfig, match="JSON list"):
        manifest_config.broker_environment(REF, spec_of(bad))
    bare = {k: v for k, v in GUARDED.items() if k != "listeners"}
    with pytest.raises(InvalidBrokerConfig, match=r"needs spec\.listeners"):
        manifest_config.broker_environment(REF, spec_of(bare))


def test_without_listeners_the_proxy_keeps_its_one_plaintext_port(
    clean_env: pytest.MonkeyPatch,
) -> None:
    raw = cluster_spec(proxy={"enabled": True})
    for key, value in pod_environment(raw, "demo-proxy").items():
        clean_env.setenv(key, value)
    settings = ProxySettings()
    (only,) = settings.listener_plan()
    assert (only.port, only.protocol) == (9092, SecurityProtocol.PLAINTEXT)
    assert settings.upstream.security_protocol == SecurityProtocol.PLAINTEXT
    service = find(objects_of(raw), "Service", "demo-proxy")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("kafka", 9092)]


def test_the_secured_sample_gets_a_proxy_the_brokers_trust() -> None:
    """deploy/cluster-secured.yaml: the proxy serves the listeners and the brokers trust it."""
    sample = Path(__file__).resolve().parents[2] / "deploy" / "cluster-secured.yaml"
    raw = next(d for d in yaml.safe_load_all(sample.read_text()) if d["kind"] == "KafScaleCluster")
    ref = ClusterRef(name=raw["metadata"]["name"], namespace=raw["metadata"]["namespace"], uid="u")
    spec = spec_of(raw["spec"])
    assert spec.proxy_internal_tls
    env = manifest_config.broker_environment(ref, spec)
    assert json.loads(env["KAFSCALE_AUTHORIZER__SUPER_USERS"]) == [
        "User:admin",
        naming.PROXY_PRINCIPAL,
        naming.broker_principal(ref.name),
    ]
    service = manifest_proxy.build_proxy_service(ref, spec)
    assert [p["port"] for p in service["spec"]["ports"]] == [9092, 9093]


# --- the brokers' own identity toward each other (transaction markers) ---------------------


def test_brokers_speak_mtls_to_each_other_with_their_certificate_as_a_trusted_principal(
    clean_env: pytest.MonkeyPatch,
) -> None:
    """A transaction coordinator writes markers on the other brokers' mTLS internal listener:
    its settings make it speak SSL there with the broker certificate (and the cluster CA), and
    that certificate's principal is a super user (WriteTxnMarkers needs CLUSTER_ACTION)."""
    settings = broker_pod_settings(GUARDED, clean_env)
    assert settings.inter_broker_protocol() == SecurityProtocol.SSL
    assert settings.inter_broker.cert_file is None  # the broker's own: tls.cert_file
    assert settings.tls.cert_file == Path(naming.BROKER_TLS_DIR) / "tls.crt"
    assert settings.tls.ca_file == Path(naming.BROKER_TLS_DIR) / "ca.crt"
    assert naming.broker_principal(REF.name) in settings.authorizer.super_users


@pytest.mark.parametrize("cert_manager", [False, True])
def test_the_broker_certificate_is_a_client_certificate_naming_the_broker_principal(
    cert_manager: bool,
) -> None:
    spec = spec_of(GUARDED)
    (leaf,) = [lf for lf in certificates.leaf_requests(REF, spec) if lf.component == naming.BROKER]
    assert leaf.server and leaf.client
    if cert_manager:
        (obj,) = [
            o
            for o in certificates.build_cert_manager_objects(REF, spec)
            if o["kind"] == "Certificate" and o["spec"]["secretName"] == leaf.secret_name
        ]
        assert "client auth" in obj["spec"]["usages"]
        assert obj["spec"]["subject"] == {"organizations": [naming.APP]}
        assert f"User:CN={obj['spec']['commonName']},O={naming.APP}" == naming.broker_principal(
            REF.name
        )
        return
    ca = pki.make_ca(certificates.kafka_ca(REF).common_name, NOW)
    pair = pki.issue(ca, leaf.common_name, leaf.hosts, NOW, server=leaf.server, client=leaf.client)
    cert = x509.load_pem_x509_certificate(pair.cert)
    assert principal_from_certificate(cert.public_bytes(Encoding.DER)) == naming.broker_principal(
        REF.name
    )
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages


def test_a_server_only_broker_certificate_is_reissued_once_it_must_be_a_client_too() -> None:
    """A cluster that had TLS listeners before the authorizer: its broker certificate lacks the
    client usage the mTLS internal listener now needs, so the operator issues a new one."""
    spec = spec_of(GUARDED)
    (leaf,) = [lf for lf in certificates.leaf_requests(REF, spec) if lf.component == naming.BROKER]
    ca = pki.make_ca(certificates.kafka_ca(REF).common_name, NOW)
    old = pki.issue(ca, leaf.common_name, leaf.hosts, NOW, server=True, client=False)
    assert not pki.needs_reissue(old.cert, ca.cert, leaf.hosts, NOW)
    assert pki.needs_reissue(old.cert, ca.cert, leaf.hosts, NOW, client=True)
    new = pki.issue(ca, leaf.common_name, leaf.hosts, NOW, server=True, client=True)
    assert not pki.needs_reissue(new.cert, ca.cert, leaf.hosts, NOW, client=True)


def test_without_the_authorizer_the_broker_certificate_stays_server_only() -> None:
    spec = spec_of(without_authorizer())
    (leaf,) = [lf for lf in certificates.leaf_requests(REF, spec) if lf.component == naming.BROKER]
    assert leaf.server and not leaf.client
