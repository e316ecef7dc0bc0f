"""spec.listeners, etcd TLS, certificates and NetworkPolicies: the pure builders and the PKI."""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from harness import children
from harness.cluster_specs import (
    NOW,
    REF,
    THREE_LISTENERS,
    cluster_spec,
    container_of,
    find,
    objects_of,
)
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.security.listeners import ClientAuth, SecurityProtocol
from kafscale.operator import (
    certificates,
    listeners,
    manifest_brokers,
    manifest_config,
    manifests,
    naming,
    pki,
)
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.models import parse_cluster_spec, parse_user_spec
from kafscale.operator.users import password_from_ref, secret_of

pytestmark = pytest.mark.operator

SECURED = cluster_spec(listeners=THREE_LISTENERS, proxy={"enabled": True}, etcd={"tls": True})


# --- listeners ------------------------------------------------------------------------------------


def test_the_broker_reads_the_listeners_the_operator_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ConfigMap plus the pod's variables parse into the broker's listener plan."""
    spec = parse_cluster_spec(SECURED)
    env = manifest_config.broker_environment(REF, spec)
    for key in list(os.environ):
        if key.startswith("KAFSCALE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(
        "KAFSCALE_ADVERTISED_LISTENERS",
        "INTERNAL://10.0.0.7:9091,PLAIN://10-0-0-7.kafka.pod:9092,"
        "EXTERNAL://10-0-0-7.kafka.pod:9093,MTLS://10-0-0-7.kafka.pod:9094",
    )
    settings = BrokerSettings()
    plan = {listener.name: listener for listener in settings.listener_plan()}
    assert {n: (lst.port, lst.protocol) for n, lst in plan.items()} == {
        "INTERNAL": (9091, SecurityProtocol.PLAINTEXT),
        "PLAIN": (9092, SecurityProtocol.PLAINTEXT),
        "EXTERNAL": (9093, SecurityProtocol.SASL_SSL),
        "MTLS": (9094, SecurityProtocol.SSL),
    }
    assert plan["MTLS"].client_auth == ClientAuth.REQUIRED
    assert plan["EXTERNAL"].client_auth == ClientAuth.NONE
    assert settings.internal_listener_name == "INTERNAL"
    assert settings.tls.cert_file == Path("/etc/kafscale/tls/tls.crt")
    assert settings.tls.ca_file == Path("/etc/kafscale/tls/ca.crt")
    assert settings.sasl.enabled_mechanisms == ("SCRAM-SHA-512",)
    assert settings.etcd.cert_file == Path("/etc/kafscale/etcd-tls/tls.crt")
    assert list(settings.etcd.endpoints) == ["https://demo-etcd-client.kafka.svc:2379"]


def test_proxy_pods_reach_a_tls_etcd_with_the_mounted_client_certificate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kafscale.broker.proxy.config import ProxySettings

    spec = parse_cluster_spec(SECURED)
    for key in list(os.environ):
        if key.startswith("KAFSCALE_"):
            monkeypatch.delenv(key)
    for key, value in manifest_config.broker_environment(REF, spec).items():
        monkeypatch.setenv(key, value)
    settings = ProxySettings()
    assert settings.etcd.cert_file == Path(naming.ETCD_CLIENT_TLS_DIR) / "tls.crt"
    assert settings.etcd.key_file == Path(naming.ETCD_CLIENT_TLS_DIR) / "tls.key"
    assert settings.etcd.ca_file == Path(naming.ETCD_CLIENT_TLS_DIR) / "ca.crt"


def test_without_listeners_nothing_changes() -> None:
    spec = parse_cluster_spec(cluster_spec())
    assert listeners.listener_environment(REF, spec) == {}
    deployment = manifest_brokers.build_broker_deployment(REF, spec)
    container = container_of(deployment)
    assert container["args"] == ["broker"] and "command" not in container
    assert [p["name"] for p in container["ports"]] == ["kafka", "admin"]
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert naming.bootstrap_address(REF, spec) == "demo-brokers.kafka.svc:9092"


def test_ports_services_and_the_start_command(tmp_path: Path) -> None:
    objects = objects_of(SECURED)
    broker = find(objects, "Deployment", "demo-broker")
    ports = {p["name"]: p["containerPort"] for p in container_of(broker)["ports"]}
    assert ports == {"internal": 9091, "plain": 9092, "external": 9093, "mtls": 9094, "admin": 8080}
    service = find(objects, "Service", "demo-brokers")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
        ("plain", 9092),
        ("external", 9093),
        ("mtls", 9094),
    ]
    assert naming.bootstrap_address(REF, parse_cluster_spec(SECURED), proxy_ready=False) == (
        "demo-brokers.kafka.svc:9092"
    )

    # Run the start command in a real shell, as the container would (after Kubernetes' own
    # $$ → $ expansion), with a stand-in `kafscale` that prints what it was given.
    command = container_of(broker)["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    fake = tmp_path / "kafscale"
    fake.write_text('#!/bin/sh\necho "$@"\necho "$KAFSCALE_ADVERTISED_LISTENERS"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)

    def run(pod_ip: str) -> tuple[str, str]:
        result = children.run(
            [*command[:2], command[2].replace("$$", "$")],
            env={"PATH": f"{tmp_path}:/usr/bin:/bin", listeners.POD_IP_VAR: pod_ip},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        args, advertised = result.stdout.splitlines()
        return args, advertised

    assert run("10.1.2.3") == (
        "broker",
        "INTERNAL://10.1.2.3:9091,PLAIN://10-1-2-3.kafka.pod:9092,"
        "EXTERNAL://10-1-2-3.kafka.pod:9093,MTLS://10-1-2-3.kafka.pod:9094",
    )
    assert run("fd00::7")[1].startswith("INTERNAL://[fd00::7]:9091,PLAIN://fd00--7.kafka.pod:9092")
    # The pod DNS name is one the broker certificate covers.
    assert "*.kafka.pod" in listeners.broker_tls_hosts(REF)


def test_listener_status_says_where_to_connect() -> None:
    """Before the proxy is ready (or without it) the listeners are the brokers' Service's;
    tests/operator/test_proxy_security.py covers the proxy's."""
    statuses = listeners.listener_status(REF, parse_cluster_spec(SECURED), proxy_ready=False)
    assert statuses is not None
    assert [s.to_api() for s in statuses] == [
        {
            "name": "plain",
            "securityProtocol": "PLAINTEXT",
            "bootstrapServers": "demo-brokers.kafka.svc:9092",
        },
        {
            "name": "external",
            "securityProtocol": "SASL_SSL",
            "bootstrapServers": "demo-brokers.kafka.svc:9093",
            "caSecret": "demo-ca",
        },
        {
            "name": "mtls",
            "securityProtocol": "SSL",
            "bootstrapServers": "demo-brokers.kafka.svc:9094",
            "caSecret": "demo-ca",
        },
    ]
    assert listeners.listener_status(REF, parse_cluster_spec(cluster_spec(bucket="b12"))) is None


def test_certificates_are_mounted_where_the_settings_point() -> None:
    objects = objects_of(SECURED)
    for name in ("demo-broker", "demo-proxy"):
        pod = find(objects, "Deployment", name)["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets == {"tls": "demo-broker-tls", "etcd-tls": "demo-etcd-client-tls"}
        mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["tls"] == naming.BROKER_TLS_DIR
        assert mounts["etcd-tls"] == naming.ETCD_CLIENT_TLS_DIR
    etcd = find(objects, "StatefulSet", "demo-etcd")
    pod = etcd["spec"]["template"]["spec"]
    assert pod["volumes"] == [
        {"name": "tls", "secret": {"secretName": "demo-etcd-server-tls", "defaultMode": 0o440}}
    ]
    args = container_of(etcd)["args"]
    assert "--client-cert-auth" in args and "--peer-client-cert-auth" in args
    assert "--listen-client-urls=https://0.0.0.0:2379" in args
    assert any(a.startswith("--initial-cluster=demo-etcd-0=https://") for a in args)
    assert f"--trusted-ca-file={naming.ETCD_SERVER_TLS_DIR}/ca.crt" in args
    assert container_of(etcd)["readinessProbe"]["httpGet"]["port"] == "metrics"


def test_every_object_validates_strictly() -> None:
    for obj in objects_of(SECURED):
        kubernetes_validate.validate(obj, "1.32.0", strict=True)


def test_network_policies() -> None:
    objects = objects_of(SECURED)
    etcd = find(objects, "NetworkPolicy", "demo-etcd")["spec"]
    assert etcd["podSelector"]["matchLabels"] == naming.selector_labels("demo", naming.ETCD)
    client_rule = etcd["ingress"][0]
    assert client_rule["ports"] == [{"protocol": "TCP", "port": 2379}]
    sources = client_rule["from"]
    assert sources[0]["podSelector"]["matchLabels"] == {
        naming.LABEL_NAME: naming.APP,
        naming.LABEL_INSTANCE: "demo",
    }
    assert "namespaceSelector" not in sources[0]  # this namespace only
    assert sources[1]["podSelector"]["matchLabels"][naming.LABEL_COMPONENT] == "operator"
    assert sources[2] == {"podSelector": {"matchLabels": {"kafscale.io/etcd-client": "true"}}}
    broker = find(objects, "NetworkPolicy", "demo-broker")["spec"]
    assert broker["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 9091}]
    assert {p["port"] for p in broker["ingress"][1]["ports"]} == {9092, 9093, 9094, 8080}
    assert "from" not in broker["ingress"][1]
    plain = objects_of(cluster_spec())
    assert [o["metadata"]["name"] for o in plain if o["kind"] == "NetworkPolicy"] == ["demo-etcd"]
    off = objects_of(cluster_spec(etcd={"networkPolicy": False}))
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


def test_cert_manager_objects_make_the_mounted_secrets() -> None:
    objects = objects_of(SECURED, cert_manager=True)
    by_secret = {o["spec"]["secretName"]: o["spec"] for o in objects if o["kind"] == "Certificate"}
    assert set(by_secret) == {
        "demo-ca",
        "demo-broker-tls",
        "demo-etcd-ca",
        "demo-etcd-server-tls",
        "demo-etcd-client-tls",
    }
    assert by_secret["demo-ca"]["isCA"] and by_secret["demo-etcd-ca"]["isCA"]
    assert by_secret["demo-broker-tls"]["issuerRef"]["name"] == "demo-ca"
    assert "*.kafka.pod" in by_secret["demo-broker-tls"]["dnsNames"]
    assert by_secret["demo-etcd-server-tls"]["ipAddresses"] == ["127.0.0.1"]
    assert set(by_secret["demo-etcd-server-tls"]["usages"]) >= {"server auth", "client auth"}
    assert by_secret["demo-etcd-client-tls"]["issuerRef"]["name"] == "demo-etcd-ca"
    issuers = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Issuer"}
    assert issuers == {
        "demo-selfsigned": {"selfSigned": {}},
        "demo-ca": {"ca": {"secretName": "demo-ca"}},
        "demo-etcd-ca": {"ca": {"secretName": "demo-etcd-ca"}},
    }
    for obj in objects:
        assert obj["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert not [o for o in objects_of(SECURED) if o["apiVersion"].startswith("cert-manager")]
    plain = objects_of(cluster_spec(), cert_manager=True)
    assert not [o for o in plain if o["apiVersion"].startswith("cert-manager")]


def test_cert_manager_is_used_unless_the_operator_already_made_the_ca() -> None:
    mine = {"metadata": {"ownerReferences": [{"uid": REF.uid}]}}
    issued = {
        "metadata": {
            "ownerReferences": [{"uid": REF.uid}],
            "annotations": {certificates.CERT_MANAGER_ANNOTATION: "demo-ca"},
        }
    }
    assert certificates.use_cert_manager(True, None, REF.uid)  # a new cluster
    assert certificates.use_cert_manager(True, {"metadata": {}}, REF.uid)  # cert-manager's
    assert certificates.use_cert_manager(True, issued, REF.uid)
    assert not certificates.use_cert_manager(True, mine, REF.uid)  # keep the trusted CA
    assert not certificates.use_cert_manager(False, None, REF.uid)


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        [{"name": "internal", "port": 9095}],
        [{"name": "a", "port": 9091}],
        [{"name": "a", "port": 8080}],
        [{"name": "a", "port": 9093, "authentication": {"type": "tls"}}],
        [{"name": "a", "port": 9093}, {"name": "a", "port": 9094}],
        [{"name": "a", "port": 9093}, {"name": "b", "port": 9093}],
        [{"name": "Upper", "port": 9093}],
    ],
)
def test_bad_listeners_are_refused(bad: list[dict[str, Any]]) -> None:
    with pytest.raises(ValidationError):
        parse_cluster_spec(cluster_spec(listeners=bad))


def test_etcd_tls_is_for_the_managed_etcd() -> None:
    with pytest.raises(ValidationError, match="managed etcd"):
        parse_cluster_spec(
            cluster_spec(etcd={"mode": "External", "endpoints": ["https://e:2379"], "tls": True})
        )


def test_free_form_config_cannot_override_what_listeners_set() -> None:
    spec = parse_cluster_spec({**SECURED, "brokers": {"config": {"tls.client_auth": "required"}}})
    with pytest.raises(InvalidBrokerConfig, match=r"tls\.client_auth"):
        manifests.build_cluster_objects(REF, spec)
    etcd = parse_cluster_spec({**SECURED, "brokers": {"config": {"etcd.ca_file": "/x"}}})
    with pytest.raises(InvalidBrokerConfig, match=r"etcd\.ca_file"):
        manifests.build_cluster_objects(REF, etcd)
    alone = parse_cluster_spec(cluster_spec(brokers={"config": {"tls.client_auth": "required"}}))
    manifests.build_cluster_objects(REF, alone)  # without listeners it is the user's to set


# --- the operator's PKI ---------------------------------------------------------------------------


def test_issued_certificates_verify_against_their_ca() -> None:
    ca = pki.make_ca("demo CA", NOW)
    hosts = listeners.broker_tls_hosts(REF)
    leaf = pki.issue(ca, "demo-brokers", hosts, NOW, server=True)
    assert pki.signed_by(leaf.cert, ca.cert)
    assert pki.certificate_hosts(leaf.cert) == frozenset(hosts)
    cert = x509.load_pem_x509_certificate(leaf.cert)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not pki.needs_reissue(leaf.cert, ca.cert, hosts, NOW)
    assert pki.ca_usable(ca, NOW)

    other = pki.make_ca("other CA", NOW)
    assert not pki.signed_by(leaf.cert, other.cert)
    assert pki.needs_reissue(leaf.cert, other.cert, hosts, NOW)  # a new CA
    assert pki.needs_reissue(leaf.cert, ca.cert, [*hosts, "new.example"], NOW)  # names changed
    late = NOW + pki.LEAF_VALIDITY - datetime.timedelta(days=10)
    assert pki.needs_reissue(leaf.cert, ca.cert, hosts, late)  # near its end
    assert pki.needs_reissue(None, ca.cert, hosts, NOW)
    assert pki.needs_reissue(b"garbage", ca.cert, hosts, NOW)
    assert not pki.ca_usable(pki.PemPair(ca.cert, other.key), NOW)  # key of another CA
    assert not pki.ca_usable(ca, NOW + pki.CA_VALIDITY)


def test_operator_made_secrets_hold_what_the_pods_read() -> None:
    ca = pki.make_ca("demo CA", NOW)
    leaf = pki.issue(ca, "c", ["x"], NOW, server=False, client=True)
    secret = certificates.build_tls_secret(REF, "demo-etcd-client-tls", "etcd", leaf, ca.cert)
    kubernetes_validate.validate(secret, "1.32.0", strict=True)
    assert secret["type"] == "kubernetes.io/tls"
    assert certificates.pair_in(secret) == leaf
    assert certificates.ca_cert_in(secret) == ca.cert
    assert certificates.pair_in(None) is None
    assert certificates.pair_in({"data": {"tls.crt": "!!"}}) is None


# --- KafScaleUser passwords of the user's own -----------------------------------------------------


def test_a_user_password_from_a_secret_key_ref() -> None:
    spec = parse_user_spec(
        {
            "cluster": "demo",
            "authentication": {
                "type": "scram-sha-512",
                "password": {"valueFrom": {"secretKeyRef": {"name": "mine", "key": "pw"}}},
            },
        }
    )
    assert secret_of("alice", spec) == "mine"
    assert secret_of("alice", parse_user_spec({"cluster": "demo"})) == "alice"
    assert password_from_ref({"data": {"pw": "czNjcmV0"}}, "pw") == "s3cret"
    assert password_from_ref({"data": {"other": "czNjcmV0"}}, "pw") is None
    assert password_from_ref(None, "pw") is None
    assert password_from_ref({"data": {"pw": "not base64!"}}, "pw") is None
