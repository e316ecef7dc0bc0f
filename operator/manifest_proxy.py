"""The lease-aware proxy's objects: its Deployment, client Service and PodDisruptionBudget.

Built only when ``spec.proxy.enabled``; ``replicas`` is left out when an HPA of the user's owns
them (``spec.proxy.autoscaled``). The proxy's listeners and client certificates come from
``proxy_listeners``. Pure, like every builder.
"""

from __future__ import annotations

from kafscale.operator import naming, proxy_listeners
from kafscale.operator.manifest_config import (
    broker_environment,
    config_hash,
    pod_env,
    tls_mounts,
    tls_volumes,
    token_env,
)
from kafscale.operator.manifest_pods import (
    Manifest,
    container_resources,
    container_security_context,
    pod_common,
    pod_disruption_budget,
    pod_spread,
)
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

DEFAULT_PROXY_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}}


def build_proxy_deployment(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    name = naming.proxy_name(ref.name)
    container = {
        "name": naming.PROXY,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["proxy"],
        "ports": [
            *proxy_listeners.proxy_container_ports(spec),
            {"name": "admin", "containerPort": naming.ADMIN_PORT, "protocol": "TCP"},
        ],
        # The cluster and etcd variables the brokers get (the proxy ignores the rest).
        "envFrom": [{"configMapRef": {"name": naming.config_map_name(ref.name)}}],
        "env": [
            *pod_env(spec)[:1],  # the pod name; the proxy needs no storage credentials
            *token_env(ref, spec),  # token logins at the proxy
            *proxy_environment(ref, spec),
        ],
        "resources": container_resources(spec.proxy.resources, DEFAULT_PROXY_RESOURCES),
        # Ready once its routing tables are loaded from etcd and some broker is registered.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "admin"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "admin"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            *tls_mounts(spec),
            *proxy_listeners.proxy_client_mounts(spec),
        ],
    }
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        *tls_volumes(ref, spec),
        *proxy_listeners.proxy_client_volumes(ref, spec),
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_metadata(ref, name, naming.PROXY),
        "spec": {
            **({} if spec.proxy.autoscaled else {"replicas": spec.proxy.replicas}),
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.PROXY)},
            "template": {
                "metadata": {
                    "labels": naming.pod_labels(ref.name, naming.PROXY),
                    "annotations": {
                        naming.ANNOTATION_CONFIG_HASH: config_hash(broker_environment(ref, spec))
                    },
                },
                "spec": {
                    **pod_common(spec, spec.proxy.service_account_name),
                    "containers": [container],
                    "volumes": volumes,
                    **pod_spread(ref, naming.PROXY),
                },
            },
        },
    }


def proxy_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, str]]:
    """The proxy's own variables over the shared ConfigMap: see :mod:`proxy_listeners`."""
    values = proxy_listeners.proxy_environment_values(ref, spec)
    return [{"name": name, "value": value} for name, value in values.items()]


def build_proxy_pdb(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    name = naming.proxy_name(ref.name)
    return pod_disruption_budget(ref, name, naming.PROXY, {"maxUnavailable": 1})


def build_proxy_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(ref, naming.proxy_name(ref.name), naming.PROXY),
        "spec": {
            "type": spec.proxy.service_type,
            "selector": naming.selector_labels(ref.name, naming.PROXY),
            "ports": proxy_listeners.proxy_service_ports(spec),
        },
    }
