"""The managed etcd with ``etcd.tls: true``, and who may reach it. Pure builders.

etcd then serves clients and peers over TLS only, asks every client and peer for a certificate
signed by the cluster's etcd CA (``--client-cert-auth``), and answers health probes on a plain
metrics port (2381). Brokers and proxies get the client certificate Secret mounted and the
broker's own etcd TLS settings; the operator reads the same Secret to connect.

NetworkPolicies: etcd's client port admits only this cluster's pods and the operator's pods
(peers: only etcd's own members); with ``spec.listeners`` the brokers' internal PLAINTEXT
listener admits only the cluster's pods and the operator, while the listeners clients use and the
admin port (probes, metrics) stay open. They take effect where the network plugin enforces
NetworkPolicies; the certificate check holds everywhere.
"""

from __future__ import annotations

from typing import Any

from kafscale.operator import naming
from kafscale.operator.listeners import CLUSTER_DOMAIN
from kafscale.operator.model_stores import EtcdMode
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

NETWORK_POLICY_API = "networking.k8s.io/v1"
# The operator's pods, as the chart labels them (any namespace).
OPERATOR_POD_LABELS = {naming.LABEL_NAME: naming.APP, naming.LABEL_COMPONENT: "operator"}


def managed_tls(spec: KafScaleClusterSpec) -> bool:
    return spec.etcd.mode == EtcdMode.MANAGED and spec.etcd.tls


MANAGED_WITH_TLS = frozenset({"etcd.ca_file", "etcd.cert_file", "etcd.key_file"})


def managed_config_keys(spec: KafScaleClusterSpec) -> frozenset[str]:
    """``spec.brokers.config`` keys etcd TLS owns (none without it)."""
    return MANAGED_WITH_TLS if managed_tls(spec) else frozenset()


def etcd_client_environment(spec: KafScaleClusterSpec) -> dict[str, str]:
    """The brokers' (and proxies') etcd TLS settings (none unless the managed etcd has TLS)."""
    if not managed_tls(spec):
        return {}
    directory = naming.ETCD_CLIENT_TLS_DIR
    return {
        "KAFSCALE_ETCD__CA_FILE": f"{directory}/{naming.CA_CERT_KEY}",
        "KAFSCALE_ETCD__CERT_FILE": f"{directory}/{naming.TLS_CERT_KEY}",
        "KAFSCALE_ETCD__KEY_FILE": f"{directory}/{naming.TLS_KEY_KEY}",
    }


def etcd_client_volumes(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    if not managed_tls(spec):
        return []
    secret = naming.etcd_client_secret_name(ref.name)
    return [{"name": "etcd-tls", "secret": {"secretName": secret, "defaultMode": 0o440}}]


def etcd_client_mounts(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    if not managed_tls(spec):
        return []
    return [{"name": "etcd-tls", "mountPath": naming.ETCD_CLIENT_TLS_DIR, "readOnly": True}]


def etcd_server_hosts(ref: ClusterRef) -> list[str]:
    """Names of the etcd server/peer certificate: every member, the client Service, loopback."""
    name, ns = naming.etcd_name(ref.name), ref.namespace
    client = naming.etcd_client_service_name(ref.name)
    hosts = [f"*.{name}.{ns}.svc", f"*.{name}.{ns}.svc.{CLUSTER_DOMAIN}"]
    hosts += [
        naming.service_host(client, ns),
        f"{naming.service_host(client, ns)}.{CLUSTER_DOMAIN}",
    ]
    return [*hosts, "localhost", "127.0.0.1"]


def etcd_tls_args() -> list[str]:
    directory = naming.ETCD_SERVER_TLS_DIR
    cert = f"{directory}/{naming.TLS_CERT_KEY}"
    key = f"{directory}/{naming.TLS_KEY_KEY}"
    ca = f"{directory}/{naming.CA_CERT_KEY}"
    return [
        f"--cert-file={cert}",
        f"--key-file={key}",
        f"--trusted-ca-file={ca}",
        "--client-cert-auth",
        f"--peer-cert-file={cert}",
        f"--peer-key-file={key}",
        f"--peer-trusted-ca-file={ca}",
        "--peer-client-cert-auth",
        f"--listen-metrics-urls=http://0.0.0.0:{naming.ETCD_METRICS_PORT}",
    ]


def etcd_server_volume(ref: ClusterRef) -> dict[str, Any]:
    secret = naming.etcd_server_secret_name(ref.name)
    return {"name": "tls", "secret": {"secretName": secret, "defaultMode": 0o440}}


def etcd_server_mount() -> dict[str, Any]:
    return {"name": "tls", "mountPath": naming.ETCD_SERVER_TLS_DIR, "readOnly": True}


def _cluster_pods(ref: ClusterRef) -> dict[str, Any]:
    """This cluster's pods (brokers, proxies, etcd members), in the cluster's namespace."""
    return {
        "podSelector": {
            "matchLabels": {naming.LABEL_NAME: naming.APP, naming.LABEL_INSTANCE: ref.name}
        }
    }


def _operator_pods() -> dict[str, Any]:
    return {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def build_etcd_network_policy(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, Any]:
    """etcd's client port: this cluster's pods, the operator and pods labelled as etcd clients
    in the cluster's namespace; peers: etcd members; the metrics/health port: anyone (the
    kubelet's probes, scrapers)."""
    members = {"podSelector": {"matchLabels": naming.selector_labels(ref.name, naming.ETCD)}}
    labelled = {"podSelector": {"matchLabels": {naming.LABEL_ETCD_CLIENT: "true"}}}
    clients = [_cluster_pods(ref), _operator_pods(), labelled]
    ingress: list[dict[str, Any]] = [
        {"from": clients, "ports": [_tcp(naming.ETCD_CLIENT_PORT)]},
        {"from": [members], "ports": [_tcp(naming.ETCD_PEER_PORT)]},
    ]
    if spec.etcd.tls:
        ingress.append({"ports": [_tcp(naming.ETCD_METRICS_PORT)]})
    return {
        "apiVersion": NETWORK_POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": object_metadata(ref, naming.etcd_network_policy_name(ref.name), naming.ETCD),
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(ref.name, naming.ETCD)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def build_broker_network_policy(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, Any]:
    """With listeners: the internal listener only for this cluster's pods and the operator;
    the client listeners and the admin port for anyone."""
    open_ports = [_tcp(listener.port) for listener in spec.listeners] + [_tcp(naming.ADMIN_PORT)]
    return {
        "apiVersion": NETWORK_POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": object_metadata(
            ref, naming.broker_network_policy_name(ref.name), naming.BROKER
        ),
        "spec": {
            "podSelector": {"matchLabels": naming.selector_labels(ref.name, naming.BROKER)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [_cluster_pods(ref), _operator_pods()],
                    "ports": [_tcp(naming.INTERNAL_PORT)],
                },
                {"ports": open_ports},
            ],
        },
    }
