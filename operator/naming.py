"""Names and labels of everything the operator creates: each spelt once, here.

Labels follow the Kubernetes recommendations (``app.kubernetes.io/*``). Selector labels are the
subset that never changes over an object's life (a Deployment's selector is immutable), so the
version label is never part of a selector.
"""

from __future__ import annotations

from kafscale import __version__
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec

APP = "kafscale"
MANAGER = "kafscale-operator"  # app.kubernetes.io/managed-by and the server-side apply manager
FIELD_MANAGER = MANAGER

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_VERSION = "app.kubernetes.io/version"

ANNOTATION_CONFIG_HASH = "kafscale.io/config-hash"

BROKER = "broker"
ETCD = "etcd"
PROXY = "proxy"
CONFIG = "config"
USER = "user"
LABEL_USER = "kafscale.io/user"
LABEL_ETCD_CLIENT = "kafscale.io/etcd-client"  # "true": a pod of yours the etcd policy admits

KAFKA_PORT = 9092
INTERNAL_PORT = 9091  # the internal PLAINTEXT listener when spec.listeners is set
INTERNAL_LISTENER = "INTERNAL"
ADMIN_PORT = 8080
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
ETCD_METRICS_PORT = 2381  # plain-HTTP /readyz, /livez and /metrics of an etcd serving TLS

# The proxy's identity on the brokers' internal listener (its client certificate's subject).
PROXY_COMMON_NAME = "kafscale-proxy"
# The subject is O=kafscale, CN=... (pki's, and cert-manager's with subject.organizations);
# the broker names it in RFC 4514 order, last attribute first.
PROXY_PRINCIPAL = f"User:CN={PROXY_COMMON_NAME},O={APP}"

# Where certificate Secrets are mounted in the pods.
BROKER_TLS_DIR = "/etc/kafscale/tls"
PROXY_CLIENT_TLS_DIR = "/etc/kafscale/proxy-client-tls"
ETCD_CLIENT_TLS_DIR = "/etc/kafscale/etcd-tls"
ETCD_SERVER_TLS_DIR = "/etc/etcd/tls"
# Keys of every certificate Secret (those of cert-manager's and of kubernetes.io/tls Secrets).
TLS_CERT_KEY = "tls.crt"
TLS_KEY_KEY = "tls.key"
CA_CERT_KEY = "ca.crt"


def selector_labels(cluster: str, component: str) -> dict[str, str]:
    return {LABEL_NAME: APP, LABEL_INSTANCE: cluster, LABEL_COMPONENT: component}


def labels(cluster: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(cluster, component),
        LABEL_PART_OF: APP,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_VERSION: __version__,
    }


def pod_labels(cluster: str, component: str) -> dict[str, str]:
    """Labels of pod templates and claim templates: :func:`labels` without the operator's
    version. A template that changed with each operator release rolled every pod of every
    cluster on an operator upgrade (the image, ``spec.image``, had not changed), and a
    StatefulSet's claim templates cannot change at all (the API server refuses the apply)."""
    return {
        **selector_labels(cluster, component),
        LABEL_PART_OF: APP,
        LABEL_MANAGED_BY: MANAGER,
    }


def label_selector(cluster: str, component: str) -> str:
    """The selector as a string (status.brokers.selector, list calls)."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(cluster, component).items())


def user_labels(cluster: str, user: str) -> dict[str, str]:
    """Labels of a KafScaleUser's Secret (``kafscale.io/user`` names the user it belongs to)."""
    return {**labels(cluster, USER), LABEL_USER: user}


def user_secret_name(user: str) -> str:
    """The user's password Secret: named after the user, as Strimzi's KafkaUser does."""
    return user


def config_map_name(cluster: str) -> str:
    return f"{cluster}-config"


def broker_deployment_name(cluster: str) -> str:
    return f"{cluster}-broker"


def broker_service_name(cluster: str) -> str:
    return f"{cluster}-brokers"


def broker_pdb_name(cluster: str) -> str:
    return f"{cluster}-broker"


def broker_hpa_name(cluster: str) -> str:
    return f"{cluster}-broker"


def proxy_name(cluster: str) -> str:
    return f"{cluster}-proxy"


def broker_pods_service_name(cluster: str) -> str:
    """Headless Service giving each broker pod a DNS name (``<pod>.<this>.<ns>.svc``) that the
    broker certificate's wildcard covers: brokers advertise it on every listener."""
    return f"{cluster}-broker-pods"


def broker_pod_host(cluster: str, namespace: str) -> str:
    """A broker pod's own DNS name, with ``$(KAFSCALE_POD_NAME)`` for Kubernetes to expand."""
    return f"$(KAFSCALE_POD_NAME).{broker_pods_service_name(cluster)}.{namespace}.svc"


def ca_secret_name(cluster: str) -> str:
    """CA of the Kafka listeners (signs the broker certificate and mTLS client certificates)."""
    return f"{cluster}-ca"


def broker_tls_secret_name(cluster: str) -> str:
    return f"{cluster}-broker-tls"


def proxy_client_secret_name(cluster: str) -> str:
    """The client certificate the proxy presents on the brokers' internal listener."""
    return f"{cluster}-proxy-client-tls"


def delegation_token_secret_name(cluster: str) -> str:
    """The Secret holding the cluster's delegation-token key (``DELEGATION_TOKEN_KEY``)."""
    return f"{cluster}-delegation-token"


DELEGATION_TOKEN_KEY = "secret-key"


def etcd_ca_secret_name(cluster: str) -> str:
    return f"{cluster}-etcd-ca"


def etcd_server_secret_name(cluster: str) -> str:
    return f"{cluster}-etcd-server-tls"


def etcd_client_secret_name(cluster: str) -> str:
    """The client certificate brokers, proxies and the operator present to the managed etcd."""
    return f"{cluster}-etcd-client-tls"


def selfsigned_issuer_name(cluster: str) -> str:
    """cert-manager Issuer that self-signs the cluster's CAs."""
    return f"{cluster}-selfsigned"


def ca_issuer_name(cluster: str) -> str:
    return f"{cluster}-ca"


def etcd_ca_issuer_name(cluster: str) -> str:
    return f"{cluster}-etcd-ca"


def broker_network_policy_name(cluster: str) -> str:
    return f"{cluster}-broker"


def etcd_network_policy_name(cluster: str) -> str:
    return f"{cluster}-etcd"


def etcd_name(cluster: str) -> str:
    """StatefulSet, headless Service and PDB of the managed etcd."""
    return f"{cluster}-etcd"


def etcd_client_service_name(cluster: str) -> str:
    return f"{cluster}-etcd-client"


def etcd_member_url(
    cluster: str, namespace: str, ordinal: int, port: int, scheme: str = "http"
) -> str:
    name = etcd_name(cluster)
    return f"{scheme}://{name}-{ordinal}.{name}.{namespace}.svc:{port}"


def etcd_scheme(spec: KafScaleClusterSpec) -> str:
    return "https" if spec.etcd.tls else "http"


def service_host(service: str, namespace: str) -> str:
    return f"{service}.{namespace}.svc"


def kafscale_cluster_name(ref: ClusterRef, spec: KafScaleClusterSpec) -> str:
    """The cluster's name in etcd (``/kafscale/<name>/``) and in object keys."""
    return spec.cluster_name or f"{ref.namespace}.{ref.name}"


def etcd_endpoints(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[str]:
    """Client URLs of the cluster's etcd, as brokers and the operator reach it."""
    if spec.etcd.mode == "External":
        return list(spec.etcd.endpoints)
    host = service_host(etcd_client_service_name(ref.name), ref.namespace)
    return [f"{etcd_scheme(spec)}://{host}:{ETCD_CLIENT_PORT}"]


def broker_service_port(spec: KafScaleClusterSpec) -> int:
    """The brokers' Service port clients bootstrap from: the first listener's, else 9092."""
    return spec.listeners[0].port if spec.listeners else KAFKA_PORT


def bootstrap_address(ref: ClusterRef, spec: KafScaleClusterSpec, proxy_ready: bool = True) -> str:
    """The proxy's Service when the proxy is enabled and ready, else the brokers' Service."""
    return f"{bootstrap_host(ref, spec, proxy_ready)}:{broker_service_port(spec)}"


def bootstrap_host(ref: ClusterRef, spec: KafScaleClusterSpec, proxy_ready: bool = True) -> str:
    """The Service clients bootstrap from: the proxy's when enabled and ready (it serves the
    same ports as the brokers' Service: the listeners', else 9092), else the brokers'."""
    service = proxy_name(ref.name) if spec.proxy.enabled and proxy_ready else None
    return service_host(service or broker_service_name(ref.name), ref.namespace)


def broker_principal(cluster: str) -> str:
    """The brokers' identity on each other's mTLS internal listener (a transaction coordinator
    writing markers): the subject of their certificate, whose common name is the brokers'
    Service (O=kafscale as :data:`PROXY_PRINCIPAL`'s)."""
    return f"User:CN={broker_service_name(cluster)[:64]},O={APP}"
