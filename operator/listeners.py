"""``spec.listeners`` → the broker settings, ports and certificate mounts that serve them. Pure.

With no listeners a cluster keeps its one PLAINTEXT listener on 9092 and nothing here adds a
thing. With listeners every broker opens them plus an ``INTERNAL`` PLAINTEXT listener on 9091:
the broker's registered (main) address, which the proxy connects to without logging in, reachable
only from the cluster's own pods and the operator (a NetworkPolicy).

Advertised addresses: the internal listener advertises the pod IP; the others the pod's DNS name
``<a-b-c-d>.<namespace>.pod`` (CoreDNS's pod records), which the broker certificate's wildcard
``*.<namespace>.pod`` covers, so TLS clients that check host names (librdkafka and the Java
client do by default) accept it. A Deployment's pods have no stable names of their own and the
IP is only known in the pod, so the broker's start command turns the IP into that name.
"""

from __future__ import annotations

import json
from typing import Any

from kafscale.operator import naming
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.model_cluster_status import ListenerStatus
from kafscale.operator.model_listeners import ListenerAuthenticationType, ListenerSpec
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec

POD_IP_VAR = "KAFSCALE_POD_IP"  # the pod IP (status.podIP) in broker pods with listeners
CLUSTER_DOMAIN = "cluster.local"

_MECHANISMS = {
    ListenerAuthenticationType.SCRAM_SHA_512: "SCRAM-SHA-512",
    ListenerAuthenticationType.SCRAM_SHA_256: "SCRAM-SHA-256",
    ListenerAuthenticationType.PLAIN: "PLAIN",
}

# Broker settings (dotted, as in spec.brokers.config) these builders set when listeners exist.
MANAGED_WITH_LISTENERS = frozenset(
    {
        "listeners",
        "advertised_listeners",
        "listener_security_protocol_map",
        "internal_listener_name",
        "tls",
        "tls.cert_file",
        "tls.key_file",
        "tls.ca_file",
        "tls.client_auth",
        "tls.client_auth_overrides",
        "sasl",
        "sasl.enabled_mechanisms",
    }
)


def managed_config_keys(spec: KafScaleClusterSpec) -> frozenset[str]:
    """``spec.brokers.config`` keys the listeners own (none without listeners)."""
    return MANAGED_WITH_LISTENERS if spec.listeners else frozenset()


def replaces_one_listener(spec: KafScaleClusterSpec) -> bool:
    """Whether the brokers get ``listeners`` (``spec.listeners``, or ``listeners`` in
    ``spec.brokers.config``), which replace the one listener: its port and advertised host are
    then not rendered (not used; a broker refuses them unless the listeners have them)."""
    return bool(spec.listeners) or bool(spec.brokers.config.get("listeners", "").strip())


def kafka_name(listener: ListenerSpec) -> str:
    return listener.name.upper()


def _auth(listener: ListenerSpec) -> ListenerAuthenticationType:
    return ListenerAuthenticationType(listener.authentication.type)


def sasl_mechanisms(spec: KafScaleClusterSpec) -> list[str]:
    """The SASL mechanisms the listeners name, in a fixed order (the broker's setting is one
    for every SASL listener)."""
    wanted = {_auth(listener) for listener in spec.listeners}
    return [name for auth, name in _MECHANISMS.items() if auth in wanted]


def listener_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The ConfigMap's listener, TLS and SASL variables (none without listeners)."""
    if not spec.listeners:
        return {}
    internal = naming.INTERNAL_LISTENER
    binds = [f"{internal}://:{naming.INTERNAL_PORT}"]
    protocols = [f"{internal}:{internal_protocol(spec)}"]
    for listener in spec.listeners:
        binds.append(f"{kafka_name(listener)}://:{listener.port}")
        protocols.append(f"{kafka_name(listener)}:{listener.security_protocol}")
    env = {
        "KAFSCALE_LISTENERS": ",".join(binds),
        "KAFSCALE_LISTENER_SECURITY_PROTOCOL_MAP": ",".join(protocols),
        "KAFSCALE_INTERNAL_LISTENER_NAME": internal,
    }
    if spec.needs_broker_certificate:
        env["KAFSCALE_TLS__CERT_FILE"] = f"{naming.BROKER_TLS_DIR}/{naming.TLS_CERT_KEY}"
        env["KAFSCALE_TLS__KEY_FILE"] = f"{naming.BROKER_TLS_DIR}/{naming.TLS_KEY_KEY}"
    mtls = [internal] if spec.proxy_internal_tls else []
    mtls += [
        kafka_name(lst) for lst in spec.listeners if _auth(lst) == ListenerAuthenticationType.TLS
    ]
    if mtls:
        env["KAFSCALE_TLS__CA_FILE"] = f"{naming.BROKER_TLS_DIR}/{naming.CA_CERT_KEY}"
        env["KAFSCALE_TLS__CLIENT_AUTH_OVERRIDES"] = ",".join(f"{n}:required" for n in mtls)
    mechanisms = sasl_mechanisms(spec)
    if mechanisms:
        env["KAFSCALE_SASL__ENABLED_MECHANISMS"] = json.dumps(mechanisms)
    env.update(proxy_trust_environment(ref, spec))
    return env


def internal_protocol(spec: KafScaleClusterSpec) -> str:
    """SSL (client certificates required) when the proxy must prove who it is, else PLAINTEXT."""
    return "SSL" if spec.proxy_internal_tls else "PLAINTEXT"


def proxy_trust_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The proxy's principal among the super users (with ``authorizer.super_users`` from
    ``spec.brokers.config`` kept), so brokers trust the client principals it forwards; and the
    brokers' own (their certificate's subject on the mTLS internal listener), so a transaction
    coordinator may write markers (WriteTxnMarkers needs CLUSTER_ACTION)."""
    if not spec.proxy_internal_tls:
        return {}
    given = spec.brokers.config.get("authorizer.super_users", "").strip()
    try:
        users = [str(user) for user in json.loads(given)] if given else []
    except (ValueError, TypeError) as exc:
        raise InvalidBrokerConfig(
            "brokers.config['authorizer.super_users'] must be a JSON list of principals"
        ) from exc
    for principal in (naming.PROXY_PRINCIPAL, naming.broker_principal(ref.name)):
        if principal not in users:
            users.append(principal)
    return {"KAFSCALE_AUTHORIZER__SUPER_USERS": json.dumps(users)}


def pod_dns_domain(namespace: str) -> str:
    return f"{namespace}.pod"


def advertise_command(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[str]:
    """The broker's start command with listeners: advertise the pod IP on the internal listener
    (bracketed when IPv6) and the pod's DNS name on the others, then ``exec`` the broker (the
    shell is replaced: the broker is the container's process and gets SIGTERM itself). ``$$``
    keeps Kubernetes from expanding ``$(...)`` itself."""
    # Over TLS the proxy checks the host name: the pod's DNS name is in the certificate.
    internal_host = "$dns" if spec.proxy_internal_tls else "$host"
    advertised = [f"{naming.INTERNAL_LISTENER}://{internal_host}:{naming.INTERNAL_PORT}"]
    advertised += [f"{kafka_name(lst)}://$dns:{lst.port}" for lst in spec.listeners]
    script = (
        f'ip="${{{POD_IP_VAR}}}"; '
        'case "$ip" in *:*) host="[$ip]" ;; *) host="$ip" ;; esac; '
        f'dns="$$(printf %s "$ip" | tr .: --).{pod_dns_domain(ref.namespace)}"; '
        f'KAFSCALE_ADVERTISED_LISTENERS="{",".join(advertised)}"; '
        "export KAFSCALE_ADVERTISED_LISTENERS; exec kafscale broker"
    )
    return ["/bin/sh", "-c", script]


def broker_container_ports(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The Kafka ports of a broker container (the admin port is added by the caller)."""
    if not spec.listeners:
        return [{"name": "kafka", "containerPort": naming.KAFKA_PORT, "protocol": "TCP"}]
    ports = [{"name": "internal", "containerPort": naming.INTERNAL_PORT, "protocol": "TCP"}]
    ports += [
        {"name": lst.name, "containerPort": lst.port, "protocol": "TCP"} for lst in spec.listeners
    ]
    return ports


def broker_service_ports(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """The brokers' Service ports: one per listener (the internal one is not offered)."""
    if not spec.listeners:
        return [
            {"name": "kafka", "port": naming.KAFKA_PORT, "targetPort": "kafka", "protocol": "TCP"}
        ]
    return [
        {"name": lst.name, "port": lst.port, "targetPort": lst.name, "protocol": "TCP"}
        for lst in spec.listeners
    ]


def broker_tls_hosts(ref: ClusterRef) -> list[str]:
    """The names the broker certificate is for: every broker pod's DNS name (wildcard), the
    brokers' and the proxy's Services, short and fully qualified."""
    ns = ref.namespace
    hosts = [f"*.{pod_dns_domain(ns)}", f"*.{pod_dns_domain(ns)}.{CLUSTER_DOMAIN}"]
    for service in (naming.broker_service_name(ref.name), naming.proxy_name(ref.name)):
        hosts += [
            service,
            f"{service}.{ns}",
            naming.service_host(service, ns),
            f"{naming.service_host(service, ns)}.{CLUSTER_DOMAIN}",
        ]
    return hosts


def broker_tls_volume(ref: ClusterRef) -> dict[str, Any]:
    return {
        "name": "tls",
        "secret": {"secretName": naming.broker_tls_secret_name(ref.name), "defaultMode": 0o440},
    }


def broker_tls_mount() -> dict[str, Any]:
    return {"name": "tls", "mountPath": naming.BROKER_TLS_DIR, "readOnly": True}


def listener_status(
    ref: ClusterRef, spec: KafScaleClusterSpec, proxy_ready: bool = True
) -> list[ListenerStatus] | None:
    """``status.listeners`` (Strimzi's shape): each listener's bootstrap address (on the
    proxy's Service when the proxy is enabled and ready, as ``status.bootstrap``, else the
    brokers') and, for TLS ones, the Secret holding the CA clients trust. None without
    listeners."""
    if not spec.listeners:
        return None
    host = naming.bootstrap_host(ref, spec, proxy_ready)
    return [
        ListenerStatus(
            name=lst.name,
            security_protocol=lst.security_protocol,
            bootstrap_servers=f"{host}:{lst.port}",
            ca_secret=naming.ca_secret_name(ref.name) if lst.tls else None,
        )
        for lst in spec.listeners
    ]
