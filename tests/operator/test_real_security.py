"""Security on the real API server (1.20.2): TLS listeners, the managed etcd over TLS, cert-manager,
KafScaleUser passwords of the user's own. The operator runs as the chart's ServiceAccount.

No kubelet runs, so no pod starts; what the pods would do is done beside the server with the
operator's own output: the certificates it wrote into Secrets serve a local etcd started with the
StatefulSet's TLS flags (the operator's client certificate gets in, a client without one does
not) and a local broker started with the ConfigMap's listener settings, which a TLS client that
checks host names (against the CA in the Secret) talks to.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from harness import children
from harness.brokers import BrokerCluster
from harness.cluster_specs import PLAIN_LISTENER, SCRAM_LISTENER, cluster_spec, external_etcd
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    SECRETS,
    USERS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    operator_settings,
    secret_files,
    settle,
    write_files,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import free_ports

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, find_etcd_binary
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol import codec
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.scram import ScramMechanism, check_password
from kafscale.operator import naming, pki
from kafscale.operator.kube import Kube, load_configuration
from kafscale.operator.models import ClusterRef, parse_cluster_spec
from kafscale.operator.tls_secrets import etcd_client_tls

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
API_VERSIONS = 18
SECURED_SPEC = cluster_spec(
    listeners=[PLAIN_LISTENER, SCRAM_LISTENER],
    brokers={"replicas": 1},
    etcd={"replicas": 1, "tls": True},
)


def hosts_of(pem: bytes) -> set[str]:
    return set(pki.certificate_hosts(pem))


def start_tls_etcd(directory: Path, tls_args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """etcd with the StatefulSet's TLS flags (files from the operator's Secret), on loopback."""
    client, peer, metrics = free_ports(3)
    url = f"https://127.0.0.1:{client}"
    flags = [
        a.replace(naming.ETCD_SERVER_TLS_DIR, str(directory))
        for a in tls_args
        if not a.startswith("--listen-metrics-urls")
    ]
    process = children.spawn(
        [
            str(find_etcd_binary()),
            f"--data-dir={directory / 'data'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=https://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=https://127.0.0.1:{peer}",
            f"--initial-cluster=default=https://127.0.0.1:{peer}",
            f"--listen-metrics-urls=http://127.0.0.1:{metrics}",
            "--unsafe-no-fsync",
            *flags,
        ],
        stdout=(directory / "etcd.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    return process, url


async def connect_within(url: str, tls: EtcdTls, timeout_s: float = 30) -> Etcd:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Etcd.connect([url], 2.0, tls=tls)
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def api_versions_over_tls(port: int, ca: Path, server_hostname: str) -> bytes:
    """One ApiVersions request over TLS, the host name checked against the certificate."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as tls,
    ):
        tls.sendall(codec.encode_request(API_VERSIONS, 0, 7, {}))
        size = int.from_bytes(tls.recv(4), "big")
        body = b""
        while len(body) < size:
            chunk = tls.recv(size - len(body))
            if not chunk:
                break
            body += chunk
        return body


async def test_tls_listeners_and_etcd_tls_get_certificates_that_serve(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    broker_cluster: BrokerCluster,
    tmp_path: Path,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    created = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, SECURED_SPEC))
    uid = created["metadata"]["uid"]
    names = ["demo-ca", "demo-broker-tls", "demo-etcd-ca", "demo-etcd-server-tls"]
    names.append("demo-etcd-client-tls")
    secrets: dict[str, dict[str, bytes]] = {}
    for name in names:
        secrets[name] = await settle(
            lambda name=name: secret_files(kube, ns, name), what=f"Secret {name}"
        )
        stored = kube.get(f"{SECRETS.format(ns=ns)}/{name}")
        assert stored["metadata"]["ownerReferences"][0]["uid"] == uid  # collected with it
        assert stored["type"] == "kubernetes.io/tls"

    # Each certificate verifies against its own CA, for the names the pods are reached by.
    kafka_ca, etcd_ca = secrets["demo-ca"]["tls.crt"], secrets["demo-etcd-ca"]["tls.crt"]
    broker_tls = secrets["demo-broker-tls"]
    assert pki.signed_by(broker_tls["tls.crt"], kafka_ca) and broker_tls["ca.crt"] == kafka_ca
    assert not pki.signed_by(broker_tls["tls.crt"], etcd_ca)
    assert {f"*.{ns}.pod", f"demo-brokers.{ns}.svc"} <= hosts_of(broker_tls["tls.crt"])
    for name in ("demo-etcd-server-tls", "demo-etcd-client-tls"):
        assert pki.signed_by(secrets[name]["tls.crt"], etcd_ca), name
        assert secrets[name]["ca.crt"] == etcd_ca
    assert f"*.demo-etcd.{ns}.svc" in hosts_of(secrets["demo-etcd-server-tls"]["tls.crt"])
    ca_key = x509.load_pem_x509_certificate(kafka_ca).extensions
    assert ca_key.get_extension_for_class(x509.BasicConstraints).value.ca

    # The pods mount them where the settings point.
    broker = await settle(
        lambda: kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), what="broker Deployment"
    )
    pod = broker["spec"]["template"]["spec"]
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert mounted == {"demo-broker-tls", "demo-etcd-client-tls"}
    etcd_set = kube.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd")
    etcd_pod = etcd_set["spec"]["template"]["spec"]
    assert etcd_pod["volumes"][0]["secret"]["secretName"] == "demo-etcd-server-tls"
    etcd_args = etcd_pod["containers"][0]["args"]
    assert "--client-cert-auth" in etcd_args
    config = kube.get(f"/api/v1/namespaces/{ns}/configmaps/demo-config")["data"]
    assert json.loads(config["KAFSCALE_ETCD__ENDPOINTS"])[0].startswith("https://")
    service = kube.get(f"/api/v1/namespaces/{ns}/services/demo-brokers")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "plain": 9092,
        "external": 9093,
    }
    policies = f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
    for policy in ("demo-etcd", "demo-broker"):  # the broker's is applied after the Deployment
        await settle(lambda path=f"{policies}/{policy}": kube.get(path), what=policy)

    # An edit reconciles again without churning certificates.
    kube.merge_patch(f"{CLUSTERS.format(ns=ns)}/demo", {"spec": {"brokers": {"replicas": 2}}})
    await settle(
        lambda: (
            (kube.get(f"{CLUSTERS.format(ns=ns)}/demo").get("status") or {}).get(
                "observedGeneration"
            )
            == 2
        ),
        what="generation 2 reconciled",
    )
    assert secret_files(kube, ns, "demo-broker-tls") == broker_tls
    assert secret_files(kube, ns, "demo-ca") == secrets["demo-ca"]
    status = kube.get(f"{CLUSTERS.format(ns=ns)}/demo")["status"]
    assert status["listeners"][1] == {
        "name": "external",
        "securityProtocol": "SASL_SSL",
        "bootstrapServers": f"demo-brokers.{ns}.svc:9093",
        "caSecret": "demo-ca",
    }

    # Rotation: a deleted certificate Secret is issued again (same CA) at the next reconcile.
    kube.delete(f"{SECRETS.format(ns=ns)}/demo-broker-tls")
    kube.merge_patch(f"{CLUSTERS.format(ns=ns)}/demo", {"spec": {"brokers": {"replicas": 1}}})
    rotated = await settle(
        lambda: secret_files(kube, ns, "demo-broker-tls"), what="a new broker certificate"
    )
    assert rotated["tls.crt"] != broker_tls["tls.crt"]
    assert pki.signed_by(rotated["tls.crt"], kafka_ca) and rotated["ca.crt"] == kafka_ca
    broker_tls = rotated

    # etcd with the StatefulSet's TLS flags and the server Secret: the operator's client
    # certificate (read from the Secret by the operator's own code) gets in, none does not.
    server_dir = write_files(tmp_path / "etcd-server", secrets["demo-etcd-server-tls"])
    process, url = start_tls_etcd(server_dir, [a for a in etcd_args if "tls" in a or "cert" in a])
    operator_kube = Kube(load_configuration(real_operator), 10)
    try:
        ref = ClusterRef(name="demo", namespace=ns, uid=uid)
        tls = await etcd_client_tls(
            operator_kube, ref, parse_cluster_spec(SECURED_SPEC), tmp_path / "op"
        )
        assert tls is not None
        etcd = await connect_within(url, tls)
        try:
            await etcd.put("/kafscale/tls-check", b"ok")
            assert (await etcd.get("/kafscale/tls-check")) is not None
        finally:
            await etcd.close()
        with pytest.raises(MetadataUnavailable):
            await Etcd.connect([url], 2.0, tls=EtcdTls(ca_file=tls.ca_file))

        # A broker with the ConfigMap's listener settings (its own ports: they share a
        # machine) and the mounted files: etcd over TLS, a SASL_SSL listener clients verify.
        broker_dir = write_files(tmp_path / "broker-tls", broker_tls)
        client_dir = write_files(tmp_path / "etcd-client", secrets["demo-etcd-client-tls"])
        internal, plain, external = free_ports(3)
        env = {
            k: v.replace(naming.BROKER_TLS_DIR, str(broker_dir)).replace(
                naming.ETCD_CLIENT_TLS_DIR, str(client_dir)
            )
            for k, v in config.items()
            if k.startswith(("KAFSCALE_TLS__", "KAFSCALE_ETCD__", "KAFSCALE_SASL__"))
            or k in ("KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP", "KAFSCALE_INTERNAL_LISTENER_NAME")
        }
        env["KAFSCALE_ETCD__ENDPOINTS"] = json.dumps([url])
        env["KAFSCALE_LISTENERS"] = (
            f"INTERNAL://127.0.0.1:{internal},PLAIN://127.0.0.1:{plain},"
            f"EXTERNAL://127.0.0.1:{external}"
        )
        started = await asyncio.to_thread(broker_cluster.start, internal, **env)
        assert started.status()["ready"]
        ca_file = broker_dir / "ca.crt"
        for host in (f"demo-brokers.{ns}.svc", f"10-1-2-3.{ns}.pod"):
            answer = await asyncio.to_thread(api_versions_over_tls, external, ca_file, host)
            assert len(answer) > 10, host
        with pytest.raises(ssl.SSLCertVerificationError):  # a name the certificate is not for
            await asyncio.to_thread(api_versions_over_tls, external, ca_file, "elsewhere.example")
    finally:
        operator_kube.close()
        process.kill()
        process.wait(10)


CERT_MANAGER_CRDS = [("certificates", "Certificate"), ("issuers", "Issuer")]


def cert_manager_crd(plural: str, kind: str) -> dict[str, Any]:
    """A stand-in for cert-manager's CRD: what makes the API server serve cert-manager.io/v1."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


async def test_with_cert_manager_served_the_operator_asks_it_for_the_certificates(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    ns, kube = kube_namespace, kube_cluster
    for plural, kind in CERT_MANAGER_CRDS:
        kube.create(CRDS, cert_manager_crd(plural, kind))
    try:
        await settle(
            lambda: (
                "cert-manager.io/v1"
                in {v["groupVersion"] for g in kube.get("/apis")["groups"] for v in g["versions"]}
            ),
            what="cert-manager.io/v1 served",
        )
        async with operator_thread(operator_settings(kafscale_chart)):
            kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, SECURED_SPEC))
            base = f"/apis/cert-manager.io/v1/namespaces/{ns}"
            certificate = await settle(
                lambda: kube.get(f"{base}/certificates/demo-broker-tls"), what="Certificate"
            )
            assert certificate["spec"]["secretName"] == "demo-broker-tls"
            assert certificate["spec"]["issuerRef"]["name"] == "demo-ca"
            assert f"*.{ns}.pod" in certificate["spec"]["dnsNames"]
            issuers = await settle(
                lambda: (
                    len(kube.get(f"{base}/issuers")["items"]) == 3
                    and kube.get(f"{base}/issuers")["items"]
                ),
                what="three Issuers",
            )
            assert {i["metadata"]["name"] for i in issuers} == {
                "demo-selfsigned",
                "demo-ca",
                "demo-etcd-ca",
            }
            listed = await settle(  # applied one after another: wait for the last
                lambda: (
                    len(kube.get(f"{base}/certificates")["items"]) == 5
                    and kube.get(f"{base}/certificates")["items"]
                ),
                what="five Certificates",
            )
            assert {c["spec"]["secretName"] for c in listed} == {
                "demo-ca",
                "demo-broker-tls",
                "demo-etcd-ca",
                "demo-etcd-server-tls",
                "demo-etcd-client-tls",
            }
            # cert-manager writes the Secrets: the operator made none of its own.
            assert secret_files(kube, ns, "demo-broker-tls") is None
            broker = await settle(
                lambda: kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), what="Deployment"
            )
            volumes = broker["spec"]["template"]["spec"]["volumes"]
            assert {"demo-broker-tls"} <= {
                v["secret"]["secretName"] for v in volumes if "secret" in v
            }
    finally:
        for plural, _ in CERT_MANAGER_CRDS:
            kube.delete(f"{CRDS}/{plural}.cert-manager.io")


async def test_a_user_password_from_a_secret_of_the_users_own(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    spec = external_etcd(etcd_server.client_url)
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    cluster = f"{ns}.demo"
    password = "my own password 42"
    kube.create(
        SECRETS.format(ns=ns),
        {
            "metadata": {"name": "alice-login"},
            "data": {"pw": base64.b64encode(password.encode()).decode()},
        },
    )

    def user(name: str, key: str) -> dict[str, Any]:
        ref = {"secretKeyRef": {"name": "alice-login", "key": key}}
        return {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafScaleUser",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "cluster": "demo",
                "authentication": {"type": "scram-sha-512", "password": {"valueFrom": ref}},
            },
        }

    kube.create(USERS.format(ns=ns), user("alice", "pw"))
    path = f"{USERS.format(ns=ns)}/alice"
    ready = await settle(
        lambda: (condition_of(kube.get(path), "Ready") or ("",))[0] == "True", what="Ready"
    )
    assert ready
    assert kube.get(path)["status"]["secret"] == "alice-login"
    store = CredentialStore(etcd, cluster)
    stored = await store.get("alice", ScramMechanism.SCRAM_SHA_512)
    assert stored is not None
    assert check_password(password.encode(), stored, ScramMechanism.SCRAM_SHA_512)
    assert secret_files(kube, ns, "alice") is None  # no generated Secret

    # A key that is not there: not ready, with a reason, and nothing written for that user.
    kube.create(USERS.format(ns=ns), user("bob", "missing"))
    bob = f"{USERS.format(ns=ns)}/bob"
    refused = await settle(
        lambda: (
            (condition_of(kube.get(bob), "Ready") or ("", ""))[1] == "PasswordSecretNotFound"
            and condition_of(kube.get(bob), "Ready")
        ),
        what="PasswordSecretNotFound",
    )
    assert refused[0] == "False" and "missing" in refused[2]
    assert await store.get("bob", ScramMechanism.SCRAM_SHA_512) is None
