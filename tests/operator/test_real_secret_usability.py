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


# The status timer and the resync run once an hour here: what the tests below see within
# WATCH_BOUND_S comes from the Secret watch (before it, from one of those timers only).
SLOW_TIMERS = {"status_interval_s": 3600.0, "resync_interval_s": 3600.0}
WATCH_BOUND_S = 60.0


async def test_a_users_secret_broken_after_start_is_reported_at_once_and_cleared_once_fixed(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The user's own ``demo-delegation-token`` is usable when the cluster starts; the user
    then removes its ``secret-key``. Before, nothing said so until the next resync (5 min by
    default, an hour here): the brokers' next pods failed. Now the Secret watch reports it at
    once (``Degraded``/``SecretUnusable``, one Warning Event), and once the key is back the
    condition clears, also without a timer."""
    ns, kube = kube_namespace, kube_cluster
    secret = f"{SECRETS.format(ns=ns)}/demo-delegation-token"
    kube.create(
        SECRETS.format(ns=ns),
        {"metadata": {"name": "demo-delegation-token"}, "data": {"secret-key": _b64("mine")}},
    )
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    brokers = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    spec = {**MANAGED, "delegationTokens": {"enabled": True}}
    async with operator_thread(operator_settings(kafscale_chart, **SLOW_TIMERS)):
        body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        await settle(lambda: _owned_by(kube.get(brokers), body), what="the brokers made")
        assert _unusable(kube, cluster) is None

        kube.merge_patch(secret, {"data": {"secret-key": None}})
        message = await settle(
            lambda: _unusable(kube, cluster),
            what="Degraded: SecretUnusable",
            timeout_s=WATCH_BOUND_S,
        )
        assert "Secret demo-delegation-token (no owner reference): no secret-key" in message
        (event,) = await settle(
            lambda: [e for e in events_of(kube, ns, "demo") if e[1] == REASON],
            what="a SecretUnusable Event",
        )
        assert event[0] == "Warning" and "no secret-key" in event[2]
        assert _owned_by(kube.get(brokers), body)  # held back: left as it was, not deleted
        now = kube.get(secret)
        assert "secret-key" not in (now.get("data") or {})  # theirs: not written
        # Watched, not handled by kopf's change handlers: no annotation, no finalizer on it.
        assert not now["metadata"].get("annotations") and not now["metadata"].get("finalizers")

        kube.merge_patch(secret, {"data": {"secret-key": _b64("mine again")}})
        await settle(
            lambda: _unusable(kube, cluster) is None,
            what="the condition cleared",
            timeout_s=WATCH_BOUND_S,
        )
        assert base64.b64decode(kube.get(secret)["data"]["secret-key"]) == b"mine again"
        assert [e for e in events_of(kube, ns, "demo") if e[1] == REASON] == [event]


async def test_an_operator_made_certificate_secret_deleted_is_issued_again_at_once(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A TLS listener: the operator issued ``demo-broker-tls``. Deleted (by mistake, or to
    rotate it), it was issued again only at the next reconcile: an edit, a restart or the
    resync. Now the Secret watch issues it again at once, from the same CA."""
    ns, kube = kube_namespace, kube_cluster
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    leaf = f"{SECRETS.format(ns=ns)}/demo-broker-tls"
    spec = {**MANAGED, "listeners": [{"name": "secure", "port": 9093, "tls": True}]}
    async with operator_thread(operator_settings(kafscale_chart, **SLOW_TIMERS)):
        body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        first = await settle(
            lambda: (found := kube.get(leaf)) is not None and _owned_by(found, body) and found,
            what="the operator's certificate",
        )
        ca = kube.get(f"{SECRETS.format(ns=ns)}/demo-ca")

        kube.delete(leaf)
        again = await settle(
            lambda: (
                (found := kube.get(leaf)) is not None
                and found["metadata"]["uid"] != first["metadata"]["uid"]
                and found
            ),
            what="the certificate issued again",
            timeout_s=WATCH_BOUND_S,
        )
        assert _owned_by(again, body)
        assert again["data"]["ca.crt"] == first["data"]["ca.crt"]
        assert (
            kube.get(f"{SECRETS.format(ns=ns)}/demo-ca")["metadata"]["uid"] == ca["metadata"]["uid"]
        )
        assert _unusable(kube, cluster) is None
