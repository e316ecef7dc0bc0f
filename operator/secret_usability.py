"""Pure: whether a Secret of the cluster's names that the cluster does not own can be used.

A Secret of one of the cluster's Secret names that the user made (their own certificate, CA or
delegation-token key) is used as it is and never written over (:mod:`secret_writes`). One the
pods cannot use would fail them with nothing in the cluster's status saying why: a broker
certificate Secret without ``tls.key`` crash-loops the brokers, a token Secret without
``secret-key`` leaves them in ``CreateContainerConfigError``. So such a Secret is judged here
by what its readers need (:class:`Need`), and one that falls short makes the cluster
``Degraded`` with reason :data:`REASON`, naming the Secret, its owner and what is missing; the
Deployments and StatefulSets whose pods read it (or a certificate issued from it, for a CA)
are held back until it is fixed or deleted (:func:`conflicts.plan_apply`). A usable one says
nothing. The cluster's own Secrets are not judged: the operator rewrites those itself. The
Secret watch (:mod:`secret_watch`) applies the cluster again as soon as one of these Secrets
changes in a way that matters (:meth:`UnusableSecrets.reapply_due`).
"""

from __future__ import annotations

import base64
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafscale.operator import certificates, naming, pki
from kafscale.operator.listeners import listener_environment
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import describe_owner, owned_by

Manifest = dict[str, Any]

REASON = "SecretUnusable"


class Need(enum.Enum):
    """What is read from a Secret: which keys, and what they must hold."""

    CA = "ca"  # tls.crt a certificate; tls.key, if there, its key (the operator signs with it)
    LEAF = "leaf"  # tls.crt and tls.key, a certificate and its key
    LEAF_AND_CA = "leaf-and-ca"  # the same, and ca.crt: the pods also trust what it signed
    TOKEN = "token"  # secret-key, the delegation-token key


REQUIRED_KEYS: dict[Need, tuple[str, ...]] = {
    Need.CA: (naming.TLS_CERT_KEY,),
    Need.LEAF: (naming.TLS_CERT_KEY, naming.TLS_KEY_KEY),
    Need.LEAF_AND_CA: (naming.TLS_CERT_KEY, naming.TLS_KEY_KEY, naming.CA_CERT_KEY),
    Need.TOKEN: (naming.DELEGATION_TOKEN_KEY,),
}


def _value(secret: Manifest, key: str) -> bytes:
    """The decoded value of ``key`` (empty: absent, empty or not base64)."""
    raw = (secret.get("data") or {}).get(key) or ""
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return b""


def problem(need: Need, secret: Manifest) -> str | None:
    """What keeps ``secret``'s readers from using it (None: usable), e.g. ``no tls.key``."""
    missing = [key for key in REQUIRED_KEYS[need] if not _value(secret, key)]
    if missing:
        return f"no {' or '.join(missing)}"
    if need is Need.TOKEN:
        return None
    key = _value(secret, naming.TLS_KEY_KEY) or None  # a CA without its key: the user signs
    found = pki.pair_problem(_value(secret, naming.TLS_CERT_KEY), key)
    ca_cert = _value(secret, naming.CA_CERT_KEY)
    if found is None and need is Need.LEAF_AND_CA and pki.pair_problem(ca_cert, None):
        return "ca.crt is not a PEM certificate"
    return found


def _broker_reads_ca(ref: ClusterRef, spec: KafScaleClusterSpec) -> bool:
    """Whether the brokers read ``ca.crt`` of their certificate Secret (an mTLS listener)."""
    return "KAFSCALE_TLS__CA_FILE" in listener_environment(ref, spec)


def cluster_needs(
    ref: ClusterRef, spec: KafScaleClusterSpec, *, cert_manager: bool
) -> dict[str, Need]:
    """Each Secret the operator would make for the cluster, by name, with what is read from it.
    Certificates only where the operator makes them (cert-manager writes its own Secrets)."""
    needs: dict[str, Need] = {}
    if not cert_manager:
        for ca in certificates.ca_requests(ref, spec):
            needs[ca.secret_name] = Need.CA
        broker = naming.broker_tls_secret_name(ref.name)
        for leaf in certificates.leaf_requests(ref, spec):
            with_ca = leaf.secret_name != broker or _broker_reads_ca(ref, spec)
            needs[leaf.secret_name] = Need.LEAF_AND_CA if with_ca else Need.LEAF
    if spec.delegation_tokens.enabled:
        needs[naming.delegation_token_secret_name(ref.name)] = Need.TOKEN
    return needs


def describe(ref: ClusterRef, need: Need, secret: Manifest | None) -> str | None:
    """``Secret <name> (<owner>): <problem>`` for a Secret of another owner its readers cannot
    use; None for none, the cluster's own, or a usable one."""
    if secret is None or owned_by(secret, ref.uid):
        return None
    found = problem(need, secret)
    if found is None:
        return None
    return f"Secret {secret['metadata']['name']} ({describe_owner(secret)}): {found}"


@dataclass(frozen=True)
class UnusableSecrets:
    """The Secrets of other owners the cluster cannot use, and whose readers must wait; and
    every Secret of the cluster's names that its pods read (what the operator's Secret watch
    follows: :func:`reapply_due`)."""

    needs: dict[str, Need] = field(default_factory=dict)  # each unusable one: what it lacks for
    problems: dict[str, str] = field(default_factory=dict)  # each: ``describe``'s words
    blocked: frozenset[str] = frozenset()  # them, and the certificates an unusable CA signs
    read: dict[str, Need] = field(default_factory=dict)  # every one the pods read, usable or not

    def reapply_due(self, ref: ClusterRef, name: str, secret: Manifest | None) -> bool:
        """Whether the Secret ``name``, now ``secret`` (None: deleted), calls for the cluster's
        objects to be applied again: one judged unusable was fixed, deleted, replaced or is
        unusable for another reason; a usable one of another owner broke; the cluster's own
        was deleted or broken (the operator makes or issues it again). A change that leaves
        each as it was judged (the operator's own write of a usable one, a usable one of yours
        edited and still usable) does not: a pass would change nothing."""
        need = self.read.get(name)
        if need is None:
            return False
        if name in self.problems:
            return describe(ref, need, secret) != self.problems[name]
        if secret is None:
            return True
        if owned_by(secret, ref.uid):
            return problem(need, secret) is not None
        return describe(ref, need, secret) is not None


def judge(
    ref: ClusterRef,
    spec: KafScaleClusterSpec,
    found: Mapping[str, Manifest],
    *,
    cert_manager: bool,
) -> UnusableSecrets:
    """Judge the Secrets of other owners the writers found (``found``: name → Secret)."""
    needs = cluster_needs(ref, spec, cert_manager=cert_manager)
    problems = {
        name: text
        for name, need in needs.items()
        if (text := describe(ref, need, found.get(name))) is not None
    }
    leaves = certificates.leaf_requests(ref, spec) if not cert_manager else []
    signed = {leaf.secret_name for leaf in leaves if leaf.ca.secret_name in problems}
    return UnusableSecrets(
        needs={name: needs[name] for name in problems},
        problems=problems,
        blocked=frozenset(problems) | signed,
        read=needs,
    )


def secrets_read(workload: Manifest) -> frozenset[str]:
    """The Secrets a Deployment's or StatefulSet's pods read: volumes, ``secretKeyRef``,
    ``envFrom``."""
    pod = ((workload.get("spec") or {}).get("template") or {}).get("spec") or {}
    names = [(v.get("secret") or {}).get("secretName") for v in pod.get("volumes") or []]
    for container in _containers(pod):
        for env in container.get("env") or []:
            names.append(((env.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name"))
        for source in container.get("envFrom") or []:
            names.append((source.get("secretRef") or {}).get("name"))
    return frozenset(name for name in names if name)


def _containers(pod: Manifest) -> Iterable[Manifest]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
