"""``spec.listeners`` on the proxy, and the proxy's way to the brokers. Pure.

With the proxy enabled, the listeners are what clients see on the proxy's Service (Strimzi's
reading: a listener is a way in for clients): every proxy replica opens each listener with the
brokers' TLS and SASL settings and advertises the proxy's Service on it, so a client never
learns a broker address. The brokers keep the same listeners for clients inside the cluster.
Without listeners the proxy keeps its one PLAINTEXT port 9092.

The proxy reaches the brokers on their ``INTERNAL`` listener. With the authorizer on, that
listener is SSL with client certificates required and the proxy presents its own certificate
(subject ``CN=kafscale-proxy,O=kafscale``, from the cluster CA), a super user of the brokers:
they then trust the client principals it forwards in KIP-590 Envelopes. Without the authorizer
it stays PLAINTEXT (a NetworkPolicy keeps it to the cluster's pods): there is nothing to trust.
"""

from __future__ import annotations

from typing import Any

from kafscale.operator import naming
from kafscale.operator.listeners import kafka_name
from kafscale.operator.model_listeners import ListenerAuthenticationType
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec


def proxy_host(ref: ClusterRef) -> str:
    return naming.service_host(naming.proxy_name(ref.name), ref.namespace)


def _listener_env(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The client listeners (the brokers' without ``INTERNAL``), advertising the Service.

    The ConfigMap's TLS file settings and SASL mechanisms apply as they are; the protocol map
    keeps its ``INTERNAL`` entry (a map entry without a listener is allowed) but per-listener
    client auth may only name the proxy's own listeners, so it is set here."""
    if not spec.listeners:
        # The ConfigMap has no listeners then; blank ones would still be overridden harmlessly.
        return {"KAFSCALE_LISTENERS": "", "KAFSCALE_ADVERTISED_LISTENERS": ""}
    host = proxy_host(ref)
    mtls = [
        kafka_name(lst)
        for lst in spec.listeners
        if lst.authentication.type == ListenerAuthenticationType.TLS
    ]
    return {
        "KAFSCALE_LISTENERS": ",".join(
            f"{kafka_name(lst)}://:{lst.port}" for lst in spec.listeners
        ),
        "KAFSCALE_ADVERTISED_LISTENERS": ",".join(
            f"{kafka_name(lst)}://{host}:{lst.port}" for lst in spec.listeners
        ),
        "KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES": ",".join(f"{name}:required" for name in mtls),
    }


def _upstream_env(spec: KafScaleClusterSpec) -> dict[str, str]:
    """The proxy's certificate on the brokers' mTLS internal listener (none: PLAINTEXT)."""
    if not spec.proxy_internal_tls:
        return {}
    folder = naming.PROXY_CLIENT_TLS_DIR
    return {
        "KAFSCALE_UPSTREAM__SECURITY_PROTOCOL": "SSL",
        "KAFSCALE_UPSTREAM__CA_FILE": f"{folder}/{naming.CA_CERT_KEY}",
        "KAFSCALE_UPSTREAM__CERT_FILE": f"{folder}/{naming.TLS_CERT_KEY}",
        "KAFSCALE_UPSTREAM__KEY_FILE": f"{folder}/{naming.TLS_KEY_KEY}",
    }


def proxy_environment_values(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """What a proxy container sets over the shared ConfigMap (``env`` wins over ``envFrom``):
    every replica advertises the proxy's Service, clients may reach any of them (on the one
    listener, or on each of ``spec.listeners``: their advertised listeners name it)."""
    advertised = (
        {}
        if spec.listeners
        else {
            "KAFSCALE_LISTENER__ADVERTISED_HOST": proxy_host(ref),
            "KAFSCALE_LISTENER__ADVERTISED_PORT": str(naming.KAFKA_PORT),
        }
    )
    return {**advertised, **_listener_env(ref, spec), **_upstream_env(spec)}


def proxy_container_ports(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The proxy's Kafka ports: one per listener, else ``kafka`` 9092 (admin added by caller)."""
    if not spec.listeners:
        return [{"name": "kafka", "containerPort": naming.KAFKA_PORT, "protocol": "TCP"}]
    return [
        {"name": lst.name, "containerPort": lst.port, "protocol": "TCP"} for lst in spec.listeners
    ]


def proxy_service_ports(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The proxy Service's ports: the listeners' (names and numbers as the brokers' Service)."""
    return [
        {
            "name": port["name"],
            "port": port["containerPort"],
            "targetPort": port["name"],
            "protocol": "TCP",
        }
        for port in proxy_container_ports(spec)
    ]


def proxy_client_volumes(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    if not spec.proxy_internal_tls:
        return []
    secret = naming.proxy_client_secret_name(ref.name)
    return [{"name": "proxy-client-tls", "secret": {"secretName": secret, "defaultMode": 0o440}}]


def proxy_client_mounts(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    if not spec.proxy_internal_tls:
        return []
    return [
        {"name": "proxy-client-tls", "mountPath": naming.PROXY_CLIENT_TLS_DIR, "readOnly": True}
    ]
