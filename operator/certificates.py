"""Which certificates a cluster needs, as cert-manager objects or as operator-made Secrets. Pure.

A cluster with a TLS listener needs a broker server certificate (Secret
``<cluster>-broker-tls``) from the cluster CA (``<cluster>-ca``), a client certificate too
(subject ``CN=<cluster>-brokers,O=kafscale``) where the internal listener is mTLS; a proxy in
front of brokers with the authorizer on, a client certificate (``<cluster>-proxy-client-tls``,
subject ``CN=kafscale-proxy,O=kafscale``) from the same CA; a managed etcd with
``tls: true`` needs a server/peer certificate (``<cluster>-etcd-server-tls``) and a client
certificate (``<cluster>-etcd-client-tls``) from the etcd CA (``<cluster>-etcd-ca``). Every
Secret holds ``tls.crt``, ``tls.key`` and ``ca.crt``, the layout of cert-manager's Secrets, so
the pods mount the same keys whoever made them.

Where the API server serves ``cert-manager.io/v1``, the operator creates cert-manager objects
(a self-signing Issuer, a CA Certificate and a CA Issuer per CA, a Certificate per leaf) and
cert-manager writes and renews the Secrets. Elsewhere the operator makes them itself
(:mod:`kafscale.operator.pki`) and re-issues a leaf certificate when it nears expiry or its
names change.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from kafscale.operator import naming
from kafscale.operator.etcd_security import etcd_server_hosts, managed_tls
from kafscale.operator.listeners import broker_tls_hosts
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata, owned_by
from kafscale.operator.pki import PemPair

CERT_MANAGER_API = "cert-manager.io/v1"
CA_DURATION = "87600h"  # 10 years, as the operator's own CAs
LEAF_DURATION = "8760h"  # 1 year
LEAF_RENEW_BEFORE = "720h"  # 30 days


@dataclass(frozen=True)
class CaRequest:
    secret_name: str
    issuer_name: str
    common_name: str


@dataclass(frozen=True)
class LeafRequest:
    secret_name: str
    ca: CaRequest
    common_name: str
    hosts: tuple[str, ...]
    server: bool
    client: bool
    component: str
    # Whether cert-manager puts O=kafscale in the subject as the operator's own PKI always does:
    # where the subject is a principal, it must not depend on who issued the certificate.
    organization: bool = False


def kafka_ca(ref: ClusterRef) -> CaRequest:
    return CaRequest(
        naming.ca_secret_name(ref.name),
        naming.ca_issuer_name(ref.name),
        f"kafscale {ref.namespace}/{ref.name} CA",
    )


def etcd_ca(ref: ClusterRef) -> CaRequest:
    return CaRequest(
        naming.etcd_ca_secret_name(ref.name),
        naming.etcd_ca_issuer_name(ref.name),
        f"kafscale {ref.namespace}/{ref.name} etcd CA",
    )


def leaf_requests(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[LeafRequest]:
    """Every leaf certificate the spec needs (none: no TLS listener, no etcd TLS)."""
    leaves: list[LeafRequest] = []
    if spec.needs_broker_certificate:
        leaves.append(
            LeafRequest(
                naming.broker_tls_secret_name(ref.name),
                kafka_ca(ref),
                naming.broker_service_name(ref.name),
                tuple(broker_tls_hosts(ref)),
                server=True,
                # The brokers' identity on each other's mTLS internal listener (markers):
                # naming.broker_principal, so O=kafscale whoever issues it.
                client=spec.proxy_internal_tls,
                component=naming.BROKER,
                organization=spec.proxy_internal_tls,
            )
        )
    if spec.proxy_internal_tls:
        leaves.append(
            LeafRequest(
                naming.proxy_client_secret_name(ref.name),
                kafka_ca(ref),
                naming.PROXY_COMMON_NAME,  # the subject is the proxy's principal
                (),
                server=False,
                client=True,
                component=naming.PROXY,
                organization=True,
            )
        )
    if managed_tls(spec):
        ca = etcd_ca(ref)
        leaves.append(
            LeafRequest(
                naming.etcd_server_secret_name(ref.name),
                ca,
                naming.etcd_name(ref.name),
                tuple(etcd_server_hosts(ref)),
                server=True,
                client=True,  # members are each other's clients on the peer port
                component=naming.ETCD,
            )
        )
        leaves.append(
            LeafRequest(
                naming.etcd_client_secret_name(ref.name),
                ca,
                f"{naming.kafscale_cluster_name(ref, spec)}-client",
                (),
                server=False,
                client=True,
                component=naming.ETCD,
            )
        )
    return leaves


def ca_requests(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[CaRequest]:
    unique: dict[str, CaRequest] = {}
    for leaf in leaf_requests(ref, spec):
        unique.setdefault(leaf.ca.secret_name, leaf.ca)
    return list(unique.values())


# --- operator-made Secrets -----------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def build_tls_secret(
    ref: ClusterRef, name: str, component: str, pair: PemPair, ca_cert: bytes
) -> dict[str, Any]:
    """A ``kubernetes.io/tls`` Secret with the CA certificate beside the pair."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": object_metadata(ref, name, component),
        "data": {
            naming.TLS_CERT_KEY: _b64(pair.cert),
            naming.TLS_KEY_KEY: _b64(pair.key),
            naming.CA_CERT_KEY: _b64(ca_cert),
        },
    }


def pair_in(secret: dict[str, Any] | None) -> PemPair | None:
    """The certificate and key a Secret holds (None: no Secret or keys missing/unreadable)."""
    data = (secret or {}).get("data") or {}
    try:
        cert = base64.b64decode(data.get(naming.TLS_CERT_KEY) or "", validate=True)
        key = base64.b64decode(data.get(naming.TLS_KEY_KEY) or "", validate=True)
    except ValueError:
        return None
    return PemPair(cert, key) if cert and key else None


def ca_cert_in(secret: dict[str, Any] | None) -> bytes | None:
    data = (secret or {}).get("data") or {}
    try:
        value = base64.b64decode(data.get(naming.CA_CERT_KEY) or "", validate=True)
    except ValueError:
        return None
    return value or None


# --- cert-manager --------------------------------------------------------------------------------


def _issuer_ref(name: str) -> dict[str, str]:
    return {"name": name, "kind": "Issuer", "group": "cert-manager.io"}


def _certificate(
    ref: ClusterRef, name: str, component: str, spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Certificate",
        "metadata": object_metadata(ref, name, component),
        "spec": spec,
    }


def _issuer(ref: ClusterRef, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": CERT_MANAGER_API,
        "kind": "Issuer",
        "metadata": object_metadata(ref, name, naming.CONFIG),
        "spec": spec,
    }


def _private_key() -> dict[str, Any]:
    return {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"}


def build_cert_manager_objects(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """Issuers and Certificates whose Secrets are the ones the pods mount (empty: no TLS)."""
    leaves = leaf_requests(ref, spec)
    if not leaves:
        return []
    selfsigned = naming.selfsigned_issuer_name(ref.name)
    objects = [_issuer(ref, selfsigned, {"selfSigned": {}})]
    for ca in ca_requests(ref, spec):
        ca_spec = {
            "isCA": True,
            "commonName": ca.common_name,
            "secretName": ca.secret_name,
            "duration": CA_DURATION,
            "privateKey": {"algorithm": "ECDSA", "size": 256},
            "issuerRef": _issuer_ref(selfsigned),
        }
        objects.append(_certificate(ref, ca.secret_name, naming.CONFIG, ca_spec))
        objects.append(_issuer(ref, ca.issuer_name, {"ca": {"secretName": ca.secret_name}}))
    for leaf in leaves:
        usages = ["digital signature", "key encipherment"]
        usages += ["server auth"] if leaf.server else []
        usages += ["client auth"] if leaf.client else []
        leaf_spec: dict[str, Any] = {
            "secretName": leaf.secret_name,
            "commonName": leaf.common_name,
            "duration": LEAF_DURATION,
            "renewBefore": LEAF_RENEW_BEFORE,
            "usages": usages,
            "privateKey": _private_key(),
            "issuerRef": _issuer_ref(leaf.ca.issuer_name),
        }
        if leaf.organization:
            leaf_spec["subject"] = {"organizations": [naming.APP]}
        dns = [h for h in leaf.hosts if not h[0].isdigit()]
        ips = [h for h in leaf.hosts if h[0].isdigit()]
        if dns:
            leaf_spec["dnsNames"] = dns
        if ips:
            leaf_spec["ipAddresses"] = ips
        objects.append(_certificate(ref, leaf.secret_name, leaf.component, leaf_spec))
    return objects


CERT_MANAGER_ANNOTATION = "cert-manager.io/certificate-name"


def use_cert_manager(served: bool, ca_secret: dict[str, Any] | None, uid: str) -> bool:
    """Whether cert-manager makes the cluster's certificates: it is served, and the operator
    has not already made the cluster's CA (installing cert-manager later must not replace a CA
    that clients already trust; the operator keeps its own then)."""
    if not served:
        return False
    if ca_secret is None:
        return True
    meta = ca_secret.get("metadata") or {}
    return not owned_by(ca_secret, uid) or CERT_MANAGER_ANNOTATION in (
        meta.get("annotations") or {}
    )


def cert_manager_object_ids(ref: ClusterRef) -> list[tuple[str, str, str]]:
    """Every cert-manager object any spec of this cluster can produce."""
    name = ref.name
    certificates = [
        naming.ca_secret_name(name),
        naming.broker_tls_secret_name(name),
        naming.proxy_client_secret_name(name),
        naming.etcd_ca_secret_name(name),
        naming.etcd_server_secret_name(name),
        naming.etcd_client_secret_name(name),
    ]
    issuers = [
        naming.selfsigned_issuer_name(name),
        naming.ca_issuer_name(name),
        naming.etcd_ca_issuer_name(name),
    ]
    ids = [(CERT_MANAGER_API, "Certificate", c) for c in certificates]
    return ids + [(CERT_MANAGER_API, "Issuer", i) for i in dict.fromkeys(issuers)]
