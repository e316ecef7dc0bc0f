"""The secured proxy on the real API server (1.20.2): a cluster with the authorizer on, the proxy
on and a SASL_SSL listener. The operator runs as the chart's ServiceAccount.

No kubelet runs, so no pod starts; what the pods would do is done beside the server with the
operator's own output: a broker started with the ConfigMap's settings and the certificates from
its Secrets, a proxy with the ConfigMap's settings, its Deployment's own variables and its client
certificate Secret, and a confluent-kafka SCRAM client that produces through the proxy under ACLs
(and is refused a topic it has no ACL for: the brokers check the client, not the proxy).

One difference from the pods, made on purpose: pod DNS names (``*.<ns>.pod``) and Service names
do not resolve here, so the broker and proxy serve a certificate for ``localhost`` issued from
the cluster CA in the operator's Secret; every certificate the proxy and clients check still
chains to that CA, and the proxy's client certificate is the operator's, unchanged.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from harness.brokers import BrokerCluster
from harness.cluster_specs import SCRAM_LISTENER, cluster_spec
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    cluster_manifest,
    condition_of,
    secret_files,
    settle,
    write_files,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import free_ports
from harness.proxy import start_proxy
from harness.secured import confluent_sasl_ssl, create_user, kafscale_cli, make_topics

from kafscale.broker.security.tls import principal_from_certificate
from kafscale.operator import naming, pki

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

ALICE, ALICE_PASSWORD = "alice", "alice-through-the-proxy"
GUARDED_SPEC = cluster_spec(
    listeners=[SCRAM_LISTENER],
    brokers={"replicas": 1},
    proxy={"enabled": True, "replicas": 1},
    etcd={"replicas": 1},
    authorizer=True,
)


def env_values(container: dict[str, Any]) -> dict[str, str]:
    """A container's literal variables; the API server drops ``value: ""`` (omitempty), and a
    pod gets such a variable set to the empty string."""
    return {
        item["name"]: item.get("value", "") for item in container["env"] if "valueFrom" not in item
    }


def produce(config: dict[str, Any], topic: str, count: int) -> list[KafkaError | None]:
    outcomes: list[KafkaError | None] = []
    producer = Producer({**config, "message.timeout.ms": 20_000})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, on_delivery=lambda e, _m: outcomes.append(e))
    producer.flush(30)
    return outcomes


def localized(value: str, dirs: dict[str, Path]) -> str:
    """A pod path (a Secret's mount) → where the test wrote that Secret's files."""
    for mount, local in dirs.items():
        value = value.replace(mount, str(local))
    return value


async def test_a_guarded_cluster_gets_a_proxy_the_brokers_trust(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    broker_cluster: BrokerCluster,
    tmp_path: Path,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, GUARDED_SPEC))
    secrets = {
        name: await settle(lambda name=name: secret_files(kube, ns, name), what=f"Secret {name}")
        for name in ("demo-ca", "demo-broker-tls", "demo-proxy-client-tls")
    }

    # The proxy's client certificate: from the cluster CA, for client auth, its subject the
    # principal the brokers make a super user.
    ca_pem = secrets["demo-ca"]["tls.crt"]
    client = secrets["demo-proxy-client-tls"]
    assert pki.signed_by(client["tls.crt"], ca_pem) and client["ca.crt"] == ca_pem
    certificate = x509.load_pem_x509_certificate(client["tls.crt"])
    principal = principal_from_certificate(certificate.public_bytes(Encoding.DER))
    assert principal == "User:CN=kafscale-proxy,O=kafscale" == naming.PROXY_PRINCIPAL
    usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]

    # The brokers' certificate is their client certificate toward each other too (transaction
    # markers on the mTLS internal listener), its subject a super user.
    broker_cert = x509.load_pem_x509_certificate(secrets["demo-broker-tls"]["tls.crt"])
    broker_principal = principal_from_certificate(broker_cert.public_bytes(Encoding.DER))
    assert broker_principal == naming.broker_principal("demo")
    broker_usages = broker_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in broker_usages

    # The brokers' settings: INTERNAL over mTLS, the proxy and the brokers among the super users.
    config_map = await settle(
        lambda: kube.get(f"/api/v1/namespaces/{ns}/configmaps/demo-config"), what="ConfigMap"
    )
    config = config_map["data"]
    assert "INTERNAL:SSL" in config["KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP"]
    assert "INTERNAL:required" in config["KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES"]
    assert json.loads(config["KAFSCALE_AUTHORIZER__SUPER_USERS"]) == [
        "User:admin",
        naming.PROXY_PRINCIPAL,
        naming.broker_principal("demo"),
    ]

    # The proxy Deployment: the client listener, its upstream certificate, the mounts.
    proxy = await settle(
        lambda: kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy"), what="proxy Deployment"
    )
    container = proxy["spec"]["template"]["spec"]["containers"][0]
    proxy_env = env_values(container)
    assert proxy_env["KAFSCALE_LISTENERS"] == "EXTERNAL://:9093"
    assert proxy_env["KAFSCALE_ADVERTISED_LISTENERS"] == f"EXTERNAL://demo-proxy.{ns}.svc:9093"
    assert proxy_env["KAFSCALE_UPSTREAM__SECURITY_PROTOCOL"] == "SSL"
    volumes = proxy["spec"]["template"]["spec"]["volumes"]
    assert {v["secret"]["secretName"] for v in volumes if "secret" in v} == {
        "demo-broker-tls",
        "demo-proxy-client-tls",
    }
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {naming.BROKER_TLS_DIR, naming.PROXY_CLIENT_TLS_DIR} <= mounts
    service = await settle(
        lambda: kube.get(f"/api/v1/namespaces/{ns}/services/demo-proxy"), what="proxy Service"
    )
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("external", 9093)]

    # The pods' work beside the server: a broker and a proxy with exactly these settings.
    ca_pair = pki.PemPair(ca_pem, secrets["demo-ca"]["tls.key"])
    local = pki.issue(ca_pair, "localhost", ["localhost"], datetime.datetime.now(datetime.UTC))
    served = {"tls.crt": local.cert, "tls.key": local.key, "ca.crt": ca_pem}
    dirs = {
        naming.BROKER_TLS_DIR: write_files(tmp_path / "broker-tls", served),
        naming.PROXY_CLIENT_TLS_DIR: write_files(tmp_path / "proxy-client", client),
    }
    shared = {
        k: localized(v, dirs)
        for k, v in config.items()
        if k.startswith(("KAFSCALE_TLS__", "KAFSCALE_SASL__", "KAFSCALE_AUTHORIZER__"))
        or k in ("KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP", "KAFSCALE_INTERNAL_LISTENER_NAME")
    }
    internal, external, spare = free_ports(3)
    broker_env = {
        **shared,
        "KAFSCALE_LISTENERS": f"INTERNAL://127.0.0.1:{internal},EXTERNAL://127.0.0.1:{spare}",
        "KAFSCALE_ADVERTISED_LISTENERS": f"INTERNAL://localhost:{internal}",
    }
    await asyncio.to_thread(broker_cluster.start, internal, **broker_env)
    topic, other = f"ok-{uuid.uuid4().hex[:6]}", f"no-{uuid.uuid4().hex[:6]}"
    etcd_url, name = broker_cluster.etcd_url, broker_cluster.cluster
    await asyncio.to_thread(make_topics, etcd_url, name, 1, topic, other)
    create_user(etcd_url, name, ALICE, ALICE_PASSWORD)
    for operation in ("WRITE", "DESCRIBE"):
        kafscale_cli(
            etcd_url,
            name,
            "acls",
            "add",
            "--topic",
            topic,
            "--principal",
            f"User:{ALICE}",
            "--operation",
            operation,
        )
    proxy_overrides = {
        **shared,
        **{k: localized(v, dirs) for k, v in proxy_env.items() if k.startswith("KAFSCALE_")},
        "KAFSCALE_LISTENERS": f"EXTERNAL://127.0.0.1:{external}",
        "KAFSCALE_ADVERTISED_LISTENERS": f"EXTERNAL://localhost:{external}",
    }
    await asyncio.to_thread(start_proxy, broker_cluster, **proxy_overrides)

    ca = dirs[naming.BROKER_TLS_DIR] / "ca.crt"
    client_config = confluent_sasl_ssl(
        f"localhost:{external}", ALICE, ALICE_PASSWORD, ca, "SCRAM-SHA-512"
    )
    assert await asyncio.to_thread(produce, client_config, topic, 3) == [None, None, None]
    # The brokers check alice, not the proxy (a super user): no ACL on the other topic.
    (refused,) = await asyncio.to_thread(produce, client_config, other, 1)
    assert refused is not None
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


async def test_the_authorizer_with_the_proxy_but_no_listeners_is_reported_degraded(
    kube_cluster: KubeCluster, real_operator: Any, kube_namespace: str
) -> None:
    """Without listeners there is no internal listener for the proxy to prove itself on: every
    forwarded request would be refused, so the operator says so instead of deploying it."""
    ns, kube = kube_namespace, kube_cluster
    spec = {k: v for k, v in GUARDED_SPEC.items() if k != "listeners"}
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    degraded = await settle(
        lambda: (
            (found := condition_of(kube.get(path), "Degraded")) and found[0] == "True" and found
        ),
        what="Degraded",
    )
    assert degraded[1] == "InvalidSpec" and "needs spec.listeners" in degraded[2]
    assert kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy") is None
