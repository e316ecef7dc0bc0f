"""The I/O behind operator-made certificates: read the Secrets, decide, write what must change.

Used where cert-manager is not served. A CA Secret is made once (and again only when it is
unreadable or near its end); a leaf Secret is (re-)issued when missing, not from its CA, not for
the names the cluster needs, or within 30 days of expiring. A Secret of that name that the
cluster does not own is the user's own certificate: it is used as it is, never overwritten,
also when the user put it in place of the cluster's own after the operator read the name
(:mod:`secret_writes`).

Also the operator's own way into a managed etcd with TLS: the client certificate Secret written
to private files (gRPC reads PEM files), named by their content so a renewed certificate gives a
new connection.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import logging
from pathlib import Path
from typing import Any

from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.operator import certificates, naming, pki
from kafscale.operator.certificates import CaRequest, LeafRequest
from kafscale.operator.etcd_security import managed_tls
from kafscale.operator.kube import Kube
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import owned_by
from kafscale.operator.secret_usability import Need, problem
from kafscale.operator.secret_writes import SecretsPass, decide_and_write

log = logging.getLogger(__name__)


async def _ensure_ca(
    kube: Kube, ref: ClusterRef, ca: CaRequest, now: datetime.datetime
) -> tuple[pki.PemPair | None, SecretsPass]:
    """The CA's pair to sign with (None: a Secret of the user's without a key, or one the
    cluster cannot use), and what was written or found."""

    async def decide(secret: dict[str, Any] | None) -> tuple[pki.PemPair | None, SecretsPass]:
        current = certificates.pair_in(secret)
        if secret is not None and not owned_by(secret, ref.uid):
            usable = problem(Need.CA, secret) is None
            return (current if usable else None), SecretsPass(found={ca.secret_name: secret})
        if current is not None and pki.ca_usable(current, now):
            return current, SecretsPass()
        pair = pki.make_ca(ca.common_name, now)
        await kube.write(
            certificates.build_tls_secret(ref, ca.secret_name, naming.CONFIG, pair, pair.cert),
            secret,
        )
        log.info("made CA %s/%s", ref.namespace, ca.secret_name)
        return pair, SecretsPass([ca.secret_name])

    return await decide_and_write(kube, ref.namespace, ca.secret_name, decide)


async def _ensure_leaf(
    kube: Kube, ref: ClusterRef, leaf: LeafRequest, ca: pki.PemPair, now: datetime.datetime
) -> SecretsPass:
    async def decide(secret: dict[str, Any] | None) -> SecretsPass:
        if secret is not None and not owned_by(secret, ref.uid):
            return SecretsPass(found={leaf.secret_name: secret})  # the user's own certificate
        current = certificates.pair_in(secret)
        stale = pki.needs_reissue(
            current.cert if current else None, ca.cert, leaf.hosts, now, client=leaf.client
        )
        if not stale and certificates.ca_cert_in(secret) == ca.cert:
            return SecretsPass()
        pair = pki.issue(
            ca, leaf.common_name, leaf.hosts, now, server=leaf.server, client=leaf.client
        )
        await kube.write(
            certificates.build_tls_secret(ref, leaf.secret_name, leaf.component, pair, ca.cert),
            secret,
        )
        log.info("issued certificate %s/%s", ref.namespace, leaf.secret_name)
        return SecretsPass([leaf.secret_name])

    return await decide_and_write(kube, ref.namespace, leaf.secret_name, decide)


async def ensure_certificate_secrets(
    kube: Kube, ref: ClusterRef, spec: KafScaleClusterSpec, now: datetime.datetime
) -> SecretsPass:
    """Make or renew the cluster's CA and certificate Secrets: the names written, and the
    Secrets of other owners found under its names (used as they are)."""
    done = SecretsPass()
    cas: dict[str, pki.PemPair | None] = {}
    for ca in certificates.ca_requests(ref, spec):
        cas[ca.secret_name], made = await _ensure_ca(kube, ref, ca, now)
        done += made
    for leaf in certificates.leaf_requests(ref, spec):
        ca_pair = cas.get(leaf.ca.secret_name)
        if ca_pair is not None:
            done += await _ensure_leaf(kube, ref, leaf, ca_pair, now)
            continue
        # A user's CA Secret without a key (the user issues the leaves too) or an unusable
        # one: nothing is issued; a leaf of the user's is still judged.
        secret = await kube.get("v1", "Secret", ref.namespace, leaf.secret_name)
        if secret is not None and not owned_by(secret, ref.uid):
            done += SecretsPass(found={leaf.secret_name: secret})
    return done


def _decoded(secret: dict[str, Any], key: str) -> bytes:
    value = ((secret.get("data") or {}).get(key)) or ""
    return base64.b64decode(value)


async def etcd_client_tls(
    kube: Kube, ref: ClusterRef, spec: KafScaleClusterSpec, directory: Path
) -> EtcdTls | None:
    """The operator's TLS files for the cluster's managed etcd (None: no etcd TLS).

    ``MetadataUnavailable`` while the client certificate Secret is not there yet (cert-manager
    has not issued it), so callers treat it as etcd not answering yet.
    """
    if not managed_tls(spec):
        return None
    name = naming.etcd_client_secret_name(ref.name)
    secret = await kube.get("v1", "Secret", ref.namespace, name)
    parts = {
        key: _decoded(secret, key) if secret else b""
        for key in (naming.CA_CERT_KEY, naming.TLS_CERT_KEY, naming.TLS_KEY_KEY)
    }
    if not all(parts.values()):
        raise MetadataUnavailable(
            f"etcd client certificate Secret {ref.namespace}/{name} not ready"
        )
    digest = hashlib.sha256(b"".join(parts.values())).hexdigest()[:16]
    folder = directory / f"{ref.namespace}.{ref.name}.{digest}"
    if not folder.exists():
        folder.mkdir(mode=0o700, parents=True)
        for key, data in parts.items():
            path = folder / key
            path.touch(mode=0o600)
            path.write_bytes(data)
    return EtcdTls(
        ca_file=folder / naming.CA_CERT_KEY,
        cert_file=folder / naming.TLS_CERT_KEY,
        key_file=folder / naming.TLS_KEY_KEY,
    )
