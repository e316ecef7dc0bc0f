"""Whether a Secret of the cluster's names that another owner made can be used (pure).

The real-API-server side (the condition, the Event, the pods held back, the cluster going on
once the Secret is fixed or deleted) is ``test_real_secret_usability.py``.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest
from harness.cluster_specs import (
    MTLS_LISTENER,
    NOW,
    PLAIN_LISTENER,
    REF,
    SCRAM_LISTENER,
    cluster_spec,
    objects_of,
)

from kafscale.operator import pki
from kafscale.operator.conflicts import plan_apply
from kafscale.operator.manifests import object_id
from kafscale.operator.models import parse_cluster_spec
from kafscale.operator.ownership import owner_reference
from kafscale.operator.secret_usability import (
    Need,
    UnusableSecrets,
    cluster_needs,
    judge,
    problem,
    secrets_read,
)
from kafscale.operator.secret_watch import clusters_reading, clusters_to_reapply
from kafscale.operator.status import ClusterObservation, compute_cluster_status
from kafscale.operator.tls_secrets import ensure_certificate_secrets

pytestmark = pytest.mark.operator

CA = pki.make_ca("their CA", NOW)
LEAF = pki.issue(CA, "demo-brokers", ["demo-brokers"], NOW, server=True, client=False)
OTHER_CA = pki.make_ca("another CA", NOW)
SHOP = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop", "uid": "9f1c-other"}
TLS_SPEC = parse_cluster_spec(
    cluster_spec(listeners=[PLAIN_LISTENER, SCRAM_LISTENER], etcd={"replicas": 1, "tls": True})
)
KEYS = {"tls_crt": "tls.crt", "tls_key": "tls.key", "ca_crt": "ca.crt", "secret_key": "secret-key"}
TOKENS = {**cluster_spec(proxy={"enabled": True}), "delegationTokens": {"enabled": True}}


def secret(name: str, owners: list[dict[str, Any]] | None = None, **data: bytes) -> dict[str, Any]:
    """A live Secret: ``data`` by key (``tls_crt`` for ``tls.crt``...), base64 as stored."""
    encoded = {KEYS.get(key, key): value for key, value in data.items()}
    meta: dict[str, Any] = {"name": name, "namespace": REF.namespace, "uid": f"uid-{name}"}
    if owners:
        meta["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "data": {k: base64.b64encode(v).decode() for k, v in encoded.items()},
    }


def test_a_usable_secret_has_no_problem() -> None:
    leaf = secret("x", tls_crt=LEAF.cert, tls_key=LEAF.key, ca_crt=CA.cert)
    assert problem(Need.LEAF, leaf) is None
    assert problem(Need.LEAF_AND_CA, leaf) is None
    assert problem(Need.CA, secret("x", tls_crt=CA.cert, tls_key=CA.key)) is None
    assert problem(Need.CA, secret("x", tls_crt=CA.cert)) is None  # the user issues the leaves
    assert problem(Need.TOKEN, secret("x", secret_key=b"their own key")) is None


@pytest.mark.parametrize(
    ("need", "data", "expected"),
    [
        (Need.LEAF, {"tls_crt": LEAF.cert}, "no tls.key"),
        (Need.LEAF, {}, "no tls.crt or tls.key"),
        (Need.LEAF_AND_CA, {"tls_crt": LEAF.cert, "tls_key": LEAF.key}, "no ca.crt"),
        (Need.LEAF, {"tls_crt": b"not a certificate", "tls_key": LEAF.key}, "tls.crt is not a PEM"),
        (Need.LEAF, {"tls_crt": LEAF.cert, "tls_key": b"garbage"}, "tls.key is not a PEM private"),
        (Need.LEAF, {"tls_crt": LEAF.cert, "tls_key": CA.key}, "not the private key of tls.crt"),
        (
            Need.LEAF_AND_CA,
            {"tls_crt": LEAF.cert, "tls_key": LEAF.key, "ca_crt": b"-----BEGIN nothing"},
            "ca.crt is not a PEM certificate",
        ),
        (Need.CA, {"tls_key": CA.key}, "no tls.crt"),
        (Need.CA, {"tls_crt": CA.cert, "tls_key": OTHER_CA.key}, "not the private key"),
        (Need.TOKEN, {"other": b"x"}, "no secret-key"),
        (Need.TOKEN, {"secret_key": b""}, "no secret-key"),
    ],
)
def test_what_a_secret_lacks_is_said(need: Need, data: dict[str, bytes], expected: str) -> None:
    found = problem(need, secret("x", **data))
    assert found is not None and expected in found


def test_a_value_that_is_not_base64_counts_as_missing() -> None:
    broken = secret("x", tls_crt=LEAF.cert)
    broken["data"]["tls.key"] = "%%% not base64"
    assert problem(Need.LEAF, broken) == "no tls.key"


def test_the_secrets_a_cluster_reads_and_what_it_reads_from_each() -> None:
    needs = cluster_needs(REF, TLS_SPEC, cert_manager=False)
    assert needs == {
        "demo-ca": Need.CA,
        "demo-etcd-ca": Need.CA,
        "demo-broker-tls": Need.LEAF,  # no mTLS listener: the brokers read no ca.crt
        "demo-etcd-server-tls": Need.LEAF_AND_CA,
        "demo-etcd-client-tls": Need.LEAF_AND_CA,
    }
    mtls = parse_cluster_spec(cluster_spec(listeners=[PLAIN_LISTENER, MTLS_LISTENER]))
    assert cluster_needs(REF, mtls, cert_manager=False)["demo-broker-tls"] == Need.LEAF_AND_CA
    assert cluster_needs(REF, TLS_SPEC, cert_manager=True) == {}  # cert-manager's Secrets
    tokens = parse_cluster_spec(TOKENS)
    assert cluster_needs(REF, tokens, cert_manager=True) == {"demo-delegation-token": Need.TOKEN}
    assert cluster_needs(REF, parse_cluster_spec(cluster_spec()), cert_manager=False) == {}


def test_only_unusable_secrets_of_other_owners_are_reported_with_their_owner() -> None:
    found = {
        "demo-broker-tls": secret("demo-broker-tls", [SHOP], tls_crt=LEAF.cert),
        "demo-etcd-ca": secret("demo-etcd-ca", tls_crt=CA.cert),  # theirs, usable
        "demo-etcd-client-tls": secret("demo-etcd-client-tls", [owner_reference(REF)]),  # ours
    }
    judged = judge(REF, TLS_SPEC, found, cert_manager=False)
    assert judged.problems == {
        "demo-broker-tls": "Secret demo-broker-tls (owned by Deployment shop (uid 9f1c-other)): "
        "no tls.key"
    }
    assert judged.needs == {"demo-broker-tls": Need.LEAF}
    assert judged.blocked == {"demo-broker-tls"}
    nothing_found = judge(REF, TLS_SPEC, {}, cert_manager=False)
    assert nothing_found == UnusableSecrets(read=cluster_needs(REF, TLS_SPEC, cert_manager=False))


def test_an_unusable_ca_blocks_the_certificates_it_would_sign() -> None:
    found = {"demo-etcd-ca": secret("demo-etcd-ca", tls_key=CA.key)}
    judged = judge(REF, TLS_SPEC, found, cert_manager=False)
    assert judged.problems == {
        "demo-etcd-ca": "Secret demo-etcd-ca (no owner reference): no tls.crt"
    }
    assert judged.blocked == {"demo-etcd-ca", "demo-etcd-server-tls", "demo-etcd-client-tls"}


def test_a_judged_secret_calls_for_a_pass_once_fixed_deleted_or_otherwise_broken() -> None:
    broken = secret("demo-delegation-token", other=b"x")
    judged = judge(
        REF, parse_cluster_spec(TOKENS), {broken["metadata"]["name"]: broken}, cert_manager=False
    )
    name = "demo-delegation-token"
    assert not judged.reapply_due(REF, name, broken)
    assert judged.reapply_due(REF, name, secret(name, secret_key=b"fixed"))
    assert judged.reapply_due(REF, name, None)
    assert not judged.reapply_due(REF, name, secret(name, secret_key=b""))  # still no key
    assert judged.reapply_due(REF, name, secret(name, [SHOP], other=b"x"))  # another owner now


def test_a_usable_secret_calls_for_a_pass_once_broken_or_deleted_not_when_edited_usable() -> None:
    """What the Secret watch acts on (the operator's own writes start no pass)."""
    name = "demo-delegation-token"
    theirs = secret(name, [SHOP], secret_key=b"their key")
    ours = secret(name, [owner_reference(REF)], secret_key=b"our key")
    for usable in (theirs, ours):
        judged = judge(REF, parse_cluster_spec(TOKENS), {name: usable}, cert_manager=False)
        assert judged.problems == {}
        assert not judged.reapply_due(REF, name, usable)
        assert judged.reapply_due(REF, name, None)  # deleted: the operator makes its own
        owners = usable["metadata"]["ownerReferences"]
        assert judged.reapply_due(REF, name, secret(name, owners, other=b"x"))  # broken
        assert not judged.reapply_due(REF, name, secret(name, owners, secret_key=b"another"))
        assert not judged.reapply_due(REF, "demo-ca", None)  # not a Secret this cluster reads


def test_a_changed_secret_concerns_the_clusters_of_its_namespace_that_read_it() -> None:
    name = "demo-delegation-token"
    tokens = parse_cluster_spec(TOKENS)
    key = (REF.namespace, REF.name, REF.uid)
    other = ("staging", "demo", "another-uid")
    plain = (REF.namespace, "plain", "plain-uid")
    judged = {
        key: judge(REF, tokens, {}, cert_manager=False),
        other: judge(
            REF.model_copy(update={"namespace": "staging"}), tokens, {}, cert_manager=False
        ),
        plain: judge(REF, parse_cluster_spec(cluster_spec()), {}, cert_manager=False),
    }
    assert clusters_reading(judged, REF.namespace, name) == [key]
    assert clusters_reading(judged, "staging", name) == [other]
    assert clusters_reading(judged, REF.namespace, "orders-app") == []
    broken = secret(name, [SHOP], other=b"x")
    assert clusters_to_reapply(judged, REF.namespace, name, broken) == [key]
    assert clusters_to_reapply(judged, REF.namespace, name, None) == [key]
    usable = secret(name, [SHOP], secret_key=b"k")
    assert clusters_to_reapply(judged, REF.namespace, name, usable) == []


def test_the_pod_workloads_reading_an_unusable_secret_are_held_back_the_rest_applied() -> None:
    objects = objects_of(TOKENS)
    live = {object_id(m): None for m in objects}
    broken = secret("demo-delegation-token", other=b"x")
    judged = judge(
        REF, parse_cluster_spec(TOKENS), {"demo-delegation-token": broken}, cert_manager=False
    )
    plan = plan_apply(REF, objects, live, judged)
    kept = {(m["kind"], m["metadata"]["name"]) for m in plan.apply}
    assert ("Deployment", "demo-broker") not in kept and ("Deployment", "demo-proxy") not in kept
    assert ("StatefulSet", "demo-etcd") in kept  # etcd reads no token
    assert ("Service", "demo-brokers") in kept and ("ConfigMap", "demo-config") in kept
    assert plan.message is None
    assert plan.secrets_message == (
        "not this cluster's and not usable, so left as they are: Secret demo-delegation-token "
        "(no owner reference): no secret-key; fix them, or delete them and the operator makes "
        "its own; until then Deployment demo-broker, Deployment demo-proxy held back (their "
        "pods read them)"
    )
    assert plan_apply(REF, objects, live).secrets_message is None


def test_secrets_read_by_a_workload_come_from_volumes_key_refs_and_env_from() -> None:
    objects = objects_of(
        {
            **cluster_spec(
                listeners=[PLAIN_LISTENER, SCRAM_LISTENER], etcd={"replicas": 1, "tls": True}
            ),
            "delegationTokens": {"enabled": True},
        }
    )
    brokers = next(m for m in objects if m["metadata"]["name"] == "demo-broker")
    etcd = next(m for m in objects if m["kind"] == "StatefulSet")
    assert secrets_read(brokers) == {
        "demo-broker-tls",
        "demo-etcd-client-tls",
        "demo-delegation-token",
    }
    assert secrets_read(etcd) == {"demo-etcd-server-tls"}
    pod = {
        "spec": {
            "template": {"spec": {"containers": [{"envFrom": [{"secretRef": {"name": "s"}}]}]}}
        }
    }
    assert secrets_read(pod) == {"s"}


def test_an_unusable_secret_makes_the_cluster_degraded_with_its_own_reason() -> None:
    message = (
        "not this cluster's and not usable, so left as they are: Secret demo-ca (…): no tls.crt"
    )
    status = compute_cluster_status(
        REF, TLS_SPEC, ClusterObservation(unusable_secrets=message), [], now="2026-11-28T00:00:00Z"
    )
    conditions = {c.type: (c.status, c.reason, c.message) for c in status.conditions}
    assert conditions["Degraded"] == ("True", "SecretUnusable", message)
    assert conditions["Ready"][:2] == ("False", "SecretUnusable")
    assert status.phase == "Degraded"


class SecretStore:
    """The two calls the certificate writers make (get, write), on a dict of Secrets."""

    def __init__(self, *secrets: dict[str, Any]) -> None:
        self.secrets = {s["metadata"]["name"]: s for s in secrets}

    async def get(self, _v: str, _k: str, _ns: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get(name)

    async def write(self, manifest: dict[str, Any], _live: Any) -> dict[str, Any]:
        self.secrets[manifest["metadata"]["name"]] = manifest
        return manifest


def test_no_certificate_is_issued_from_a_ca_of_the_users_that_cannot_sign() -> None:
    """The user's ``demo-ca`` holds a ``tls.key`` that is not its certificate's key. Before,
    the operator signed the broker certificate with that key: one no client trusting the CA's
    certificate accepts, the TLS listener refused with nothing said. Now nothing is issued
    from it, and the writers hand it on to be judged (``SecretUnusable``)."""
    theirs = secret("demo-ca", tls_crt=CA.cert, tls_key=OTHER_CA.key)
    spec = parse_cluster_spec(cluster_spec(listeners=[PLAIN_LISTENER, SCRAM_LISTENER]))
    kube = SecretStore(theirs)
    done = asyncio.run(ensure_certificate_secrets(kube, REF, spec, NOW))  # type: ignore[arg-type]
    assert done.written == [] and done.found == {"demo-ca": theirs}
    assert set(kube.secrets) == {"demo-ca"}  # no broker certificate from it
    judged = judge(REF, spec, done.found, cert_manager=False)
    assert judged.problems["demo-ca"].endswith("tls.key is not the private key of tls.crt")
    assert judged.blocked == {"demo-ca", "demo-broker-tls"}
