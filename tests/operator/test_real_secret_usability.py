"""A Secret of the cluster's names that the user made and the pods cannot use is reported (real
API server 1.20.2, chart RBAC, the operator running).

Before, such a Secret was used as it was (a user's own certificate or token key is never
written over), and the pods failed with nothing in the cluster's status saying why: a token
Secret without ``secret-key`` left the brokers in ``CreateContainerConfigError``, a certificate
Secret without ``tls.key`` crash-looped them. Now the cluster is ``Degraded``/``SecretUnusable``
with one Warning Event naming the Secret, its owner and what it lacks, the pods that read it
are held back, and the cluster goes on once the user fixes or deletes it. The pure decisions
are ``test_secret_usability.py``.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    MANAGED,
    SECRETS,
    STATEFULSETS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    events_of,
    operator_settings,
    settle,
)
from harness.kube_apiserver import KubeCluster

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

REASON = "SecretUnusable"


def _users_secret(kube: KubeCluster, ns: str, name: str, **metadata: Any) -> dict[str, Any]:
    """A Secret of the user's with one key the cluster does not read."""
    body = {"metadata": {"name": name, **metadata}, "data": {"note": _b64("mine")}}
    created: dict[str, Any] = kube.create(SECRETS.format(ns=ns), body)
    return created


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unusable(kube: KubeCluster, cluster: str) -> str | None:
    degraded = condition_of(kube.get(cluster), "Degraded") or ("", "", "")
    return degraded[2] if degraded[:2] == ("True", REASON) else None


def _owned_by(obj: dict[str, Any] | None, owner: dict[str, Any]) -> bool:
    owners = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(o["uid"] == owner["metadata"]["uid"] for o in owners)


async def test_a_token_secret_without_its_key_is_reported_and_the_cluster_goes_on_once_fixed(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The user's ``demo-delegation-token`` (owned by their ConfigMap ``shop``) has no
    ``secret-key``: ``Degraded``/``SecretUnusable`` and one Warning Event name it, its owner and
    the missing key; the brokers (which read it) are held back, the etcd (which does not) is
    not; the Secret is left as it is. Once the user adds the key, the brokers are made and the
    condition clears; the Secret is still theirs."""
    ns, kube = kube_namespace, kube_cluster
    shop = kube.create(f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "shop"}})
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "shop",
        "uid": shop["metadata"]["uid"],
    }
    theirs = _users_secret(kube, ns, "demo-delegation-token", ownerReferences=[owner])
    secret = f"{SECRETS.format(ns=ns)}/demo-delegation-token"
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    brokers = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    spec = {**MANAGED, "delegationTokens": {"enabled": True}}
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        message = await settle(lambda: _unusable(kube, cluster), what="Degraded: SecretUnusable")
        assert "Secret demo-delegation-token (owned by ConfigMap shop" in message
        assert "no secret-key" in message and "Deployment demo-broker held back" in message
        ready = condition_of(kube.get(cluster), "Ready")
        assert ready is not None and ready[:2] == ("False", REASON)
        body = kube.get(cluster)
        assert _owned_by(kube.get(f"{STATEFULSETS.format(ns=ns)}/demo-etcd"), body)
        assert kube.get(brokers) is None
        (event,) = await settle(
            lambda: [e for e in events_of(kube, ns, "demo") if e[1] == REASON],
            what="a SecretUnusable Event",
        )
        assert event[0] == "Warning" and "Secret demo-delegation-token (owned by" in event[2]
        assert "no secret-key" in event[2]
        now = kube.get(secret)
        assert now["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert now["data"] == theirs["data"]

        kube.merge_patch(secret, {"data": {"secret-key": _b64("their own key")}})
        await settle(lambda: _owned_by(kube.get(brokers), body), what="the brokers made")
        await settle(lambda: _unusable(kube, cluster) is None, what="the condition cleared")
        now = kube.get(secret)
        assert now["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert now["metadata"]["ownerReferences"] == [owner]
        assert base64.b64decode(now["data"]["secret-key"]) == b"their own key"
        assert [e for e in events_of(kube, ns, "demo") if e[1] == REASON] == [event]


async def test_a_certificate_secret_without_its_key_is_reported_until_deleted_then_made_anew(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A TLS listener: the user's ``demo-broker-tls`` has no ``tls.crt``/``tls.key``; the
    cluster says so and holds the brokers back (their pods mount it). Once the user deletes
    it, the operator issues its own and makes the brokers."""
    ns, kube = kube_namespace, kube_cluster
    _users_secret(kube, ns, "demo-broker-tls")
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    brokers = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    spec = {**MANAGED, "listeners": [{"name": "secure", "port": 9093, "tls": True}]}
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        message = await settle(lambda: _unusable(kube, cluster), what="Degraded: SecretUnusable")
        assert "Secret demo-broker-tls (no owner reference): no tls.crt or tls.key" in message
        assert "Deployment demo-broker held back" in message
        assert kube.get(brokers) is None
        body = kube.get(cluster)

        kube.delete(f"{SECRETS.format(ns=ns)}/demo-broker-tls")
        await settle(
            lambda: _owned_by(kube.get(f"{SECRETS.format(ns=ns)}/demo-broker-tls"), body),
            what="the operator's own certificate",
        )
        await settle(lambda: _owned_by(kube.get(brokers), body), what="the brokers made")
        await settle(lambda: _unusable(kube, cluster) is None, what="the condition cleared")
