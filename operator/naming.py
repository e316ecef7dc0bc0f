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

KAFKA_PORT = 9092
ADMIN_PORT = 8080
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380


def selector_labels(cluster: str, component: str) -> dict[str, str]:
    return {LABEL_NAME: APP, LABEL_INSTANCE: cluster, LABEL_COMPONENT: component}


def labels(cluster: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(cluster, component),
        LABEL_PART_OF: APP,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_VERSION: __version__,
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


def etcd_name(cluster: str) -> str:
    """StatefulSet, headless Service and PDB of the managed etcd."""
    return f"{cluster}-etcd"


def etcd_client_service_name(cluster: str) -> str:
    return f"{cluster}-etcd-client"


def etcd_member_url(cluster: str, namespace: str, ordinal: int, port: int) -> str:
    name = etcd_name(cluster)
    return f"http://{name}-{ordinal}.{name}.{namespace}.svc:{port}"


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
    return [f"http://{host}:{ETCD_CLIENT_PORT}"]


def bootstrap_address(ref: ClusterRef, spec: KafScaleClusterSpec, proxy_ready: bool = True) -> str:
    """The proxy's Service when the proxy is enabled and ready, else the brokers' Service."""
    use_proxy = spec.proxy.enabled and proxy_ready
    service = proxy_name(ref.name) if use_proxy else broker_service_name(ref.name)
    return f"{service_host(service, ref.namespace)}:{KAFKA_PORT}"
