"""What broker and proxy pods are told: their ConfigMap, pod variables, certificate mounts.

The non-secret ``KAFSCALE_*`` settings go into one ConfigMap (its hash in the pod template rolls
the pods when it changes); the pod's own name and IP and the storage credentials come from the
downward API and a Secret; the listeners' and etcd's certificates are mounted from Secrets.
Pure. A ``brokers.config`` key the operator sets itself is refused (``InvalidBrokerConfig``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kafscale.operator import etcd_security, listeners, naming
from kafscale.operator.brokerconfig import InvalidBrokerConfig, broker_config_env
from kafscale.operator.manifest_pods import Manifest
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

ETCD_ENDPOINTS_KEY = "KAFSCALE_ETCD__ENDPOINTS"  # the brokers' etcd, a JSON list of client URLs


def broker_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The non-secret KAFSCALE_* variables every broker (and proxy) pod gets."""
    storage = spec.storage
    env = {
        "KAFSCALE_CLUSTER": naming.kafscale_cluster_name(ref, spec),
        ETCD_ENDPOINTS_KEY: json.dumps(naming.etcd_endpoints(ref, spec)),
        "KAFSCALE_ETCD__SESSION_TTL_S": str(spec.brokers.session_ttl_seconds),
        "KAFSCALE_STORAGE__KIND": "s3",
        "KAFSCALE_STORAGE__BUCKET": storage.bucket,
        "KAFSCALE_STORAGE__PREFIX": storage.prefix,
        "KAFSCALE_STORAGE__REGION": storage.region,
        "KAFSCALE_LISTENER__ADMIN_PORT": str(naming.ADMIN_PORT),
    }
    if not listeners.replaces_one_listener(spec):
        env["KAFSCALE_LISTENER__PORT"] = str(naming.KAFKA_PORT)
    if storage.endpoint:
        env["KAFSCALE_STORAGE__ENDPOINT"] = storage.endpoint
    if spec.brokers.rack:
        env["KAFSCALE_LISTENER__RACK"] = spec.brokers.rack
    env.update(broker_config_env(spec.brokers.config))
    managed = listeners.managed_config_keys(spec) | etcd_security.managed_config_keys(spec)
    clash = sorted(set(spec.brokers.config) & managed)
    if clash:
        raise InvalidBrokerConfig(
            f"brokers.config[{clash[0]!r}] is set by the operator (spec.listeners, etcd.tls)"
        )
    if spec.proxy.enabled and spec.authorizer_enabled and not spec.listeners:
        raise InvalidBrokerConfig(
            "authorizer.enabled with the proxy needs spec.listeners: the proxy proves who it "
            "is on the brokers' internal listener, which only exists with listeners"
        )
    env.update(listeners.listener_environment(ref, spec))
    env.update(etcd_security.etcd_client_environment(spec))
    return dict(sorted(env.items()))


def config_hash(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def build_config_map(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_metadata(ref, naming.config_map_name(ref.name), naming.CONFIG),
        "data": broker_environment(ref, spec),
    }


def pod_env(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The pod's name, its IP and the storage credentials. The IP is the advertised host of
    the one listener; with listeners it is the start command's (``POD_IP_VAR``), which
    advertises it in ``KAFSCALE_ADVERTISED_LISTENERS`` for ``spec.listeners`` (the broker
    refuses ``listener.advertised_host`` beside listeners unless they advertise it)."""
    one_listener = not listeners.replaces_one_listener(spec)
    ip_var = "KAFSCALE_LISTENER__ADVERTISED_HOST" if one_listener else listeners.POD_IP_VAR
    env: list[dict[str, Any]] = [
        {"name": "KAFSCALE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ip_var, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    secret = spec.storage.credentials_secret
    if secret is not None:
        for var, key in (
            ("KAFSCALE_STORAGE__ACCESS_KEY_ID", secret.access_key_id_key),
            ("KAFSCALE_STORAGE__SECRET_ACCESS_KEY", secret.secret_access_key_key),
        ):
            env.append(
                {"name": var, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
            )
    return env


def token_env(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The delegation-token key from its Secret, for brokers and proxies (tokens enabled)."""
    if not spec.delegation_tokens.enabled:
        return []
    selector = {
        "name": naming.delegation_token_secret_name(ref.name),
        "key": naming.DELEGATION_TOKEN_KEY,
    }
    return [
        {"name": "KAFSCALE_DELEGATION_TOKEN__SECRET_KEY", "valueFrom": {"secretKeyRef": selector}}
    ]


def tls_volumes(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """Certificate Secrets of broker and proxy pods: the listeners' and etcd's client one."""
    volumes = [listeners.broker_tls_volume(ref)] if spec.needs_broker_certificate else []
    return volumes + etcd_security.etcd_client_volumes(ref, spec)


def tls_mounts(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    mounts = [listeners.broker_tls_mount()] if spec.needs_broker_certificate else []
    return mounts + etcd_security.etcd_client_mounts(spec)
