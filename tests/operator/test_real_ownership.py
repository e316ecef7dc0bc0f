"""The operator touches only what its cluster owns (real API server 1.20.2, chart RBAC).

Before, it server-side applied with ``force`` over any object of the cluster's names (taking
its fields and, with the owner reference, its life) and deleted the names a spec no longer
wanted whoever's they were: a user's own ``demo-proxy`` Deployment went when the cluster
``demo`` was created without a proxy.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
from typing import Any

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    CONFIG_MAPS,
    DEPLOYMENTS,
    MANAGED,
    SECRETS,
    SERVICES,
    STATEFULSETS,
    USERS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    events_of,
    operator_settings,
    settle,
)
from harness.kube_apiserver import KubeCluster

from kafscale.operator import pki, reconcile
from kafscale.operator.discovery import fetch_capabilities
from kafscale.operator.kube import Kube, load_configuration
from kafscale.operator.models import ClusterRef, parse_cluster_spec
from kafscale.operator.naming import FIELD_MANAGER
from kafscale.operator.runtime import EtcdPool, Runtime, cluster_key
from kafscale.operator.settings import OperatorSettings
from kafscale.operator.user_handlers import UserNotReady, reconcile_user
from kafscale.operator.users import build_user_secret

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]


def _users_deployment(kube: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    """An application of the user's (no pods: ``replicas: 0``)."""
    labels = {"app": name}
    body = {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "example.org/app:1"}]},
            },
        },
    }
    created: dict[str, Any] = kube.create(DEPLOYMENTS.format(ns=ns), body)
    return created


def _users_service(kube: KubeCluster, ns: str, name: str, **metadata: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": name, **metadata},
        "spec": {"selector": {"app": "shop"}, "ports": [{"name": "web", "port": 8080}]},
    }
    created: dict[str, Any] = kube.create(SERVICES.format(ns=ns), body)
    return created


def _owner_of(deployment: dict[str, Any]) -> dict[str, Any]:
    meta = deployment["metadata"]
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": meta["name"], "uid": meta["uid"]}


def _managers(obj: dict[str, Any]) -> set[str]:
    return {entry.get("manager", "") for entry in obj["metadata"].get("managedFields") or []}


def _owned_by_cluster(obj: dict[str, Any] | None, cluster: dict[str, Any]) -> bool:
    owners = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(o["uid"] == cluster["metadata"]["uid"] for o in owners)


def _not_owned(kube: KubeCluster, cluster: str) -> str | None:
    degraded = condition_of(kube.get(cluster), "Degraded") or ("", "", "")
    return degraded[2] if degraded[:2] == ("True", "ObjectNotOwned") else None


async def test_an_object_of_another_owner_is_not_overwritten_and_the_cluster_says_why(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The user's Service ``demo-brokers`` (owned by their Deployment ``shop``) keeps its
    selector, ports and owner; the cluster's other objects are applied; ``Degraded`` and a
    Warning Event name the Service and its owner. Once the user deletes it, the operator makes
    its own (without a resync: the status timer applies again while something is held)."""
    ns, kube = kube_namespace, kube_cluster
    shop = _users_deployment(kube, ns, "shop")
    theirs = _users_service(kube, ns, "demo-brokers", ownerReferences=[_owner_of(shop)])
    service = f"{SERVICES.format(ns=ns)}/demo-brokers"
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        body = await settle(lambda: kube.get(cluster), what="the cluster")
        brokers = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
        await settle(lambda: _owned_by_cluster(kube.get(brokers), body), what="the brokers")

        now = kube.get(service)  # applied before the brokers: the operator has been here
        assert now["metadata"]["uid"] == theirs["metadata"]["uid"]
        assert now["spec"]["selector"] == {"app": "shop"}
        assert [p["port"] for p in now["spec"]["ports"]] == [8080]
        assert now["metadata"]["ownerReferences"] == theirs["metadata"]["ownerReferences"]
        assert FIELD_MANAGER not in _managers(now)

        message = await settle(lambda: _not_owned(kube, cluster), what="Degraded: ObjectNotOwned")
        assert "Service demo-brokers (owned by Deployment shop" in message
        assert "no pods" not in message  # the brokers were not held back for a Service
        ready = condition_of(kube.get(cluster), "Ready")
        assert ready is not None and ready[:2] == ("False", "ObjectNotOwned")
        (event,) = await settle(
            lambda: [e for e in events_of(kube, ns, "demo") if e[1] == "ObjectNotOwned"],
            what="an ObjectNotOwned Event",
        )
        assert event[0] == "Warning" and "Service demo-brokers" in event[2]

        kube.delete(service)
        await settle(
            lambda: _owned_by_cluster(kube.get(service), body), what="the operator's own Service"
        )
        await settle(lambda: _not_owned(kube, cluster) is None, what="the condition cleared")
        assert kube.get(service)["spec"]["selector"] != {"app": "shop"}


async def test_a_config_map_of_another_owner_holds_back_the_pods(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The brokers read their settings (etcd, bucket) from ``<name>-config``: with a user's
    ConfigMap of that name, no broker or etcd pods are made; the Services are."""
    ns, kube = kube_namespace, kube_cluster
    data = {"KAFSCALE_ETCD__ENDPOINTS": "http://their-etcd:2379"}
    kube.create(CONFIG_MAPS.format(ns=ns), {"metadata": {"name": "demo-config"}, "data": data})
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        message = await settle(lambda: _not_owned(kube, cluster), what="Degraded: ObjectNotOwned")
        assert "ConfigMap demo-config (no owner reference)" in message
        assert "no pods are started" in message and "Deployment demo-broker" in message
        assert kube.get(f"{SERVICES.format(ns=ns)}/demo-brokers") is not None
        assert kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker") is None
        assert kube.get(f"{STATEFULSETS.format(ns=ns)}/demo-etcd") is None
        assert kube.get(f"{CONFIG_MAPS.format(ns=ns)}/demo-config")["data"] == data


async def test_an_object_of_another_owner_is_not_deleted_when_the_spec_stops_wanting_its_name(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The user runs an application named ``demo-proxy``; the cluster ``demo`` has no proxy,
    so its spec does not want that name: the user's Deployment and Service stay. The
    cluster's own proxy objects still go when its proxy is turned off."""
    ns, kube = kube_namespace, kube_cluster
    theirs = _users_deployment(kube, ns, "demo-proxy")
    their_service = _users_service(kube, ns, "demo-proxy")
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        kube.create(
            CLUSTERS.format(ns=ns),
            cluster_manifest("own", ns, {**MANAGED, "proxy": {"enabled": True, "replicas": 1}}),
        )
        for name in ("demo", "own"):
            path = f"{CLUSTERS.format(ns=ns)}/{name}"
            await settle(
                lambda path=path: (kube.get(path).get("status") or {}).get("observedGeneration"),
                what=f"cluster {name} reconciled",
            )
        own_cluster = kube.get(f"{CLUSTERS.format(ns=ns)}/own")
        own_proxy = f"{DEPLOYMENTS.format(ns=ns)}/own-proxy"
        await settle(lambda: _owned_by_cluster(kube.get(own_proxy), own_cluster), what="proxy")

        kept = kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy")
        assert kept is not None and kept["metadata"]["uid"] == theirs["metadata"]["uid"]
        kept_service = kube.get(f"{SERVICES.format(ns=ns)}/demo-proxy")
        assert kept_service is not None
        assert kept_service["metadata"]["uid"] == their_service["metadata"]["uid"]
        assert _not_owned(kube, f"{CLUSTERS.format(ns=ns)}/demo") is None  # nothing to fix

        kube.merge_patch(f"{CLUSTERS.format(ns=ns)}/own", {"spec": {"proxy": {"enabled": False}}})
        own_service = f"{SERVICES.format(ns=ns)}/own-proxy"
        # one object after the other: wait for both, in whichever order they go
        await settle(
            lambda: kube.get(own_proxy) is None and kube.get(own_service) is None,
            what="the cluster's own proxy Deployment and Service deleted",
        )
        assert kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy") is not None


class TakenBeforeTheWrite(Kube):
    """The operator's client, with someone making an object of ``name`` (a ``kind``) between
    the operator's read of the name and its write: the race no test can time, made certain."""

    def __init__(self, settings: OperatorSettings, target: tuple[str, str], take: Any) -> None:
        super().__init__(load_configuration(settings), settings.api_timeout_s)
        self._target, self._take = target, take

    async def _before_write(self, manifest: dict[str, Any]) -> None:
        if (manifest["kind"], manifest["metadata"]["name"]) == self._target and self._take:
            take, self._take = self._take, None
            await asyncio.to_thread(take)

    async def apply(self, manifest: dict[str, Any], **options: Any) -> dict[str, Any]:
        await self._before_write(manifest)
        return await super().apply(manifest, **options)

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        await self._before_write(manifest)
        return await super().create(manifest)


async def test_a_name_taken_after_the_operator_found_it_free_is_not_taken_over(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The operator read ``demo-config`` as free; before it wrote the ConfigMap, the user made
    one of that name. Before, an object found absent was written with a forced server-side
    apply, which took the user's over (its data and, with the owner reference, its life). Now
    it is created, which the API server refuses when the name is taken: the user's ConfigMap
    stays as it is, the cluster reports it (``ObjectNotOwned``) and holds its pods back."""
    ns, kube = kube_namespace, kube_cluster
    theirs = {"metadata": {"name": "demo-config"}, "data": {"KAFSCALE_ETCD__ENDPOINTS": "x"}}
    made: list[dict[str, Any]] = []
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    settings = operator_settings(kafscale_chart)
    client = TakenBeforeTheWrite(
        settings,
        ("ConfigMap", "demo-config"),
        lambda: made.append(kube.create(CONFIG_MAPS.format(ns=ns), theirs)),
    )
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    try:
        ref = ClusterRef.from_body(body)
        await reconcile.apply_cluster(runtime, ref, parse_cluster_spec(body["spec"]))
        message = runtime.not_owned[cluster_key(ref)] or ""
    finally:
        await runtime.close()
    assert made, "the ConfigMap was never written"
    now = kube.get(f"{CONFIG_MAPS.format(ns=ns)}/demo-config")
    assert now["metadata"]["uid"] == made[0]["metadata"]["uid"]
    assert now["data"] == theirs["data"]
    assert not now["metadata"].get("ownerReferences")
    assert FIELD_MANAGER not in _managers(now)
    assert "ConfigMap demo-config (no owner reference)" in message
    assert "no pods are started" in message
    assert kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker") is None
    # What it made itself it owns as server-side apply does (no field left to a create's
    # "Update" entry, which would outlive the field's removal from the operator's manifest).
    service = kube.get(f"{SERVICES.format(ns=ns)}/demo-brokers")
    assert _owned_by_cluster(service, body)
    entries = service["metadata"]["managedFields"]
    assert [(e["manager"], e["operation"]) for e in entries] == [(FIELD_MANAGER, "Apply")]


async def _apply_once(
    client: Kube, settings: OperatorSettings, ref: ClusterRef, spec: dict[str, Any]
) -> Runtime:
    """One reconcile pass of the cluster with ``spec`` through ``client``; the runtime it
    ran in (closed), which keeps what the pass found."""
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    try:
        await reconcile.apply_cluster(runtime, ref, parse_cluster_spec(spec))
    finally:
        await runtime.close()
    return runtime


async def test_an_object_replaced_after_the_operator_read_it_is_not_taken_over(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A pass read ``demo-brokers`` as the cluster's own Service; before it applied over it,
    the user deleted it and made their own of that name. Before, the forced apply took the
    user's over (its selector and ports, and with the owner reference, its life). Now the
    apply carries the uid of the object the pass read, which the API server holds it to: the
    user's Service stays as it is, and the name, read again, counts as another owner's
    (``ObjectNotOwned``)."""
    ns, kube = kube_namespace, kube_cluster
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    ref, settings = ClusterRef.from_body(body), operator_settings(kafscale_chart)
    service = f"{SERVICES.format(ns=ns)}/demo-brokers"
    await _apply_once(
        Kube(load_configuration(settings), settings.api_timeout_s), settings, ref, MANAGED
    )
    assert _owned_by_cluster(kube.get(service), body)

    made: list[dict[str, Any]] = []

    def replace() -> None:
        kube.delete(service)
        made.append(_users_service(kube, ns, "demo-brokers"))

    client = TakenBeforeTheWrite(settings, ("Service", "demo-brokers"), replace)
    runtime = await _apply_once(client, settings, ref, MANAGED)
    assert made, "the Service was never written"
    now = kube.get(service)
    assert now["metadata"]["uid"] == made[0]["metadata"]["uid"]
    assert now["spec"]["selector"] == {"app": "shop"}
    assert not now["metadata"].get("ownerReferences")
    assert FIELD_MANAGER not in _managers(now)
    assert "Service demo-brokers (no owner reference)" in (
        runtime.not_owned[cluster_key(ref)] or ""
    )
    assert ("v1", "Service", "demo-brokers") in runtime.held_by_others[cluster_key(ref)]
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)


async def test_the_clusters_own_object_without_its_labels_is_deleted_when_no_longer_wanted(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The user removed the cluster's labels from its proxy Deployment and Service, then
    turned the proxy off. Before, the pass found the objects its spec no longer wants by the
    cluster's labels: these were taken for none and stayed for good. Now each listed kind is
    listed whole and ownership is the owner reference: both go."""
    ns, kube = kube_namespace, kube_cluster
    with_proxy = {**MANAGED, "proxy": {"enabled": True, "replicas": 1}}
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, with_proxy))
    ref, settings = ClusterRef.from_body(body), operator_settings(kafscale_chart)
    proxy = [f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy", f"{SERVICES.format(ns=ns)}/demo-proxy"]
    client = Kube(load_configuration(settings), settings.api_timeout_s)
    await _apply_once(client, settings, ref, with_proxy)
    for path in proxy:
        assert _owned_by_cluster(kube.get(path), body)
        kube.merge_patch(path, {"metadata": {"labels": None}})
        assert not kube.get(path)["metadata"].get("labels")

    client = Kube(load_configuration(settings), settings.api_timeout_s)
    await _apply_once(client, settings, ref, {**with_proxy, "proxy": {"enabled": False}})
    assert [kube.get(path) for path in proxy] == [None, None]
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)


class CountingKube(Kube):
    """The operator's client, keeping each request it sends as (method, path), and the
    answer to each list (path → the decoded answer)."""

    def __init__(self, settings: OperatorSettings) -> None:
        super().__init__(load_configuration(settings), settings.api_timeout_s)
        self.sent: list[tuple[str, str]] = []
        self.lists: dict[str, dict[str, Any]] = {}

    async def _run(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        self.sent.append((method, path))
        answer = await super()._run(what, method, path, **kwargs)
        if what == "list":
            self.lists[path] = answer
        return answer


async def test_a_reconcile_reads_the_clusters_names_with_a_list_per_kind_not_a_get_per_name(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """Each apply judges every name by what holds it. Before, that was a GET per name: 11
    reads of a managed cluster on 1.20 before its 7 writes, again on every status interval
    while an object of another owner held one of its names. Now the kinds it has several
    objects of are listed once (metadata only); only the single ones (its etcd StatefulSet,
    its ConfigMap: never listed) are read by name. The status read after the apply (the
    brokers' Deployment, the etcd StatefulSet) takes them from the apply's answers: before,
    it read both again (a pass of 14 calls, now 12)."""
    ns, kube = kube_namespace, kube_cluster
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    settings = operator_settings(kafscale_chart)
    client = CountingKube(settings)
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    ref, spec = ClusterRef.from_body(body), parse_cluster_spec(body["spec"])

    async def one_pass() -> list[tuple[str, str]]:
        """The objects applied, then the status observed, as a change handler does."""
        client.sent.clear()
        applied = await reconcile.apply_cluster(runtime, ref, spec)
        observed = await reconcile.observe_cluster(runtime, ref, spec, written=applied.written)
        assert observed.broker_deployment is not None
        assert observed.broker_deployment["metadata"]["name"] == "demo-broker"
        assert observed.broker_deployment["spec"]["replicas"] == 3
        assert observed.etcd_statefulset is not None
        assert observed.etcd_statefulset["spec"]["replicas"] == 1
        return list(client.sent)

    try:
        first = await one_pass()
        again = await one_pass()
    finally:
        await runtime.close()
    print(f"API calls of a first pass: {len(first)}; of the next: {len(again)}")
    reads = sorted(path for method, path in again if method == "GET")
    assert reads == sorted(
        [
            f"/api/v1/namespaces/{ns}/configmaps/demo-config",
            f"/api/v1/namespaces/{ns}/services",
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd",
            f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
        ]
    )
    writes = [path for method, path in again if method != "GET"]
    assert len(writes) == len(set(writes)) == 7  # one apply per object, nothing else
    first_reads = [path for method, path in first if method == "GET"]
    assert f"{DEPLOYMENTS.format(ns=ns)}/demo-broker" not in first_reads  # created, answered


async def test_while_another_owner_holds_a_name_a_status_pass_reads_only_that_name(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """Before, while an object of another owner held one of the cluster's names, the status
    timer applied every object again each ``STATUS_INTERVAL_S`` (a GET per name and an apply
    per object) to notice the name being freed. Now it reads only the held name, and applies
    again once the object holding it is gone."""
    ns, kube = kube_namespace, kube_cluster
    _users_service(kube, ns, "demo-brokers")
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    settings = operator_settings(kafscale_chart)
    client = CountingKube(settings)
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    ref, spec = ClusterRef.from_body(body), parse_cluster_spec(body["spec"])
    service = f"{SERVICES.format(ns=ns)}/demo-brokers"
    try:
        await reconcile.apply_cluster(runtime, ref, spec)
        assert "Service demo-brokers" in (runtime.not_owned[cluster_key(ref)] or "")
        client.sent.clear()
        assert not await reconcile.needs_reapply(runtime, ref)
        assert client.sent == [("GET", service)]

        kube.delete(service)
        assert await reconcile.needs_reapply(runtime, ref)
        await reconcile.apply_cluster(runtime, ref, spec)
        assert runtime.not_owned[cluster_key(ref)] is None
        assert not await reconcile.needs_reapply(runtime, ref)
    finally:
        await runtime.close()
    assert _owned_by_cluster(kube.get(service), body)


async def test_a_setting_taken_out_of_the_spec_leaves_the_objects_the_operator_created(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The operator creates an object with a create (so that a name taken meanwhile is not
    taken over), which records its fields under an ``Update`` entry apart from server-side
    apply's; left there, a broker setting taken out of ``spec.brokers.config`` would stay in
    the brokers' ConfigMap for good. The apply after the create removes that entry."""
    ns, kube = kube_namespace, kube_cluster
    spec = {**MANAGED, "brokers": {"config": {"log.flush_interval_ms": "50"}}}
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    settings = operator_settings(kafscale_chart)
    client = Kube(load_configuration(settings), settings.api_timeout_s)
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    ref = ClusterRef.from_body(body)
    config = f"{CONFIG_MAPS.format(ns=ns)}/demo-config"
    try:
        await reconcile.apply_cluster(runtime, ref, parse_cluster_spec(spec))
        assert kube.get(config)["data"]["KAFSCALE_LOG__FLUSH_INTERVAL_MS"] == "50"
        await reconcile.apply_cluster(runtime, ref, parse_cluster_spec(MANAGED))
    finally:
        await runtime.close()
    assert "KAFSCALE_LOG__FLUSH_INTERVAL_MS" not in kube.get(config)["data"]


async def test_the_whole_kind_lists_carry_the_metadata_of_other_applications_not_their_specs(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A pass lists every Service and Deployment in the namespace, other applications' too, to
    know whose each name is. Before, each list carried every object whole: a Deployment of
    the user's with a large pod template (here ~200 KB of it) came with every pass. Now the
    lists ask for metadata only (``PartialObjectMetadataList``): the user's Deployment is
    known by its name, uid and owner, without its spec, and the pass still tells it from the
    cluster's own (its ``demo-proxy`` is left alone, the cluster's own are applied)."""
    ns, kube = kube_namespace, kube_cluster
    theirs = _users_deployment(kube, ns, "demo-proxy")
    large = {"name": "BLOB", "value": "x" * 200_000}
    container = {"name": "app", "image": "example.org/app:1", "env": [large]}
    kube.merge_patch(
        f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy",
        {"spec": {"template": {"spec": {"containers": [container]}}}},
    )
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    settings = operator_settings(kafscale_chart)
    client = CountingKube(settings)
    await _apply_once(client, settings, ClusterRef.from_body(body), MANAGED)

    listed = client.lists[DEPLOYMENTS.format(ns=ns)]
    assert listed["kind"] == "PartialObjectMetadataList"
    items = {item["metadata"]["name"]: item for item in listed["items"]}
    assert items["demo-proxy"]["metadata"]["uid"] == theirs["metadata"]["uid"]
    for answer in client.lists.values():
        for item in answer["items"] or []:  # null when none
            assert set(item) <= {"apiVersion", "kind", "metadata"}, item["metadata"]["name"]
    assert len(json.dumps(listed)) < 100_000  # the user's pod template is not in it
    kept = kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-proxy")
    assert kept["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert kept["spec"]["template"]["spec"]["containers"][0]["env"] == [large]
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)
    assert _owned_by_cluster(kube.get(f"{SERVICES.format(ns=ns)}/demo-brokers"), body)


# --- Secrets: the writers hold to what they read, as the applies do ------------------------------

WITH_SECRETS = {
    **MANAGED,
    "listeners": [{"name": "secure", "port": 9093, "tls": True}],
    "delegationTokens": {"enabled": True},
}


def _users_secret(
    kube: KubeCluster, ns: str, name: str, data: dict[str, str], **metadata: Any
) -> dict[str, Any]:
    """A Secret of the user's own, ``data`` as text."""
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    created: dict[str, Any] = kube.create(
        SECRETS.format(ns=ns), {"metadata": {"name": name, **metadata}, "data": encoded}
    )
    return created


def _assert_left_as_made(now: dict[str, Any] | None, made: dict[str, Any]) -> None:
    """``now`` is the Secret the user made, as they made it: not written over, not owned."""
    assert now is not None and now["metadata"]["uid"] == made["metadata"]["uid"]
    assert now["data"] == made["data"]
    assert not now["metadata"].get("ownerReferences")
    assert FIELD_MANAGER not in _managers(now)


async def test_a_secret_name_taken_before_the_operators_create_is_used_as_it_is(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The operator read ``demo-delegation-token`` as free; before it created the key Secret,
    the user made their own of that name. Before, the refused create (409) failed the whole
    pass (``ApplyFailed``, retried; nothing after the Secrets applied). Now the name is read
    again and the user's Secret is what a Secret of theirs found at the read is: their key,
    used as it is and never written over; the rest of the cluster is applied."""
    ns, kube = kube_namespace, kube_cluster
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, WITH_SECRETS))
    settings = operator_settings(kafscale_chart)
    made: list[dict[str, Any]] = []
    client = TakenBeforeTheWrite(
        settings,
        ("Secret", "demo-delegation-token"),
        lambda: made.append(_users_secret(kube, ns, "demo-delegation-token", {"secret-key": "k"})),
    )
    ref = ClusterRef.from_body(body)
    runtime = await _apply_once(client, settings, ref, WITH_SECRETS)
    assert made, "the key Secret was never written"
    _assert_left_as_made(kube.get(f"{SECRETS.format(ns=ns)}/demo-delegation-token"), made[0])
    assert cluster_key(ref) not in runtime.apply_errors
    assert _owned_by_cluster(kube.get(f"{SECRETS.format(ns=ns)}/demo-broker-tls"), body)
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)


async def test_a_certificate_secret_replaced_after_the_operator_read_it_is_used_as_it_is(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A pass read ``demo-broker-tls`` as the cluster's own certificate, due to be written
    again (its ``ca.crt`` not the CA's); before it wrote the new one, the user deleted it and
    made their own. Before, the write, held to the uid read, was refused and failed the pass
    (``ApplyFailed``, retried). Now the name is read again: the user's certificate, used as it
    is and never written over, as one made before the cluster is; the rest is applied."""
    ns, kube = kube_namespace, kube_cluster
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, WITH_SECRETS))
    ref, settings = ClusterRef.from_body(body), operator_settings(kafscale_chart)
    secret = f"{SECRETS.format(ns=ns)}/demo-broker-tls"
    plain = Kube(load_configuration(settings), settings.api_timeout_s)
    await _apply_once(plain, settings, ref, WITH_SECRETS)
    assert _owned_by_cluster(kube.get(secret), body)
    stale_ca = base64.b64encode(b"not the cluster's CA").decode()
    kube.merge_patch(secret, {"data": {"ca.crt": stale_ca}})  # so the pass writes it again

    made: list[dict[str, Any]] = []

    def replace() -> None:
        kube.delete(secret)
        pair = pki.make_ca("their own certificate", datetime.datetime.now(datetime.UTC))
        files = {"tls.crt": pair.cert.decode(), "tls.key": pair.key.decode()}
        made.append(_users_secret(kube, ns, "demo-broker-tls", files))

    client = TakenBeforeTheWrite(settings, ("Secret", "demo-broker-tls"), replace)
    runtime = await _apply_once(client, settings, ref, WITH_SECRETS)
    assert made, "the certificate was never written"
    _assert_left_as_made(kube.get(secret), made[0])
    assert cluster_key(ref) not in runtime.apply_errors
    assert runtime.unusable_secrets[cluster_key(ref)] is None  # usable: nothing to say
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)


async def test_a_users_secret_replaced_after_the_operator_read_it_is_a_conflict_naming_its_owner(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A reconcile of the KafScaleUser ``alice`` read her password Secret as hers; before it
    wrote it again, someone deleted it and made their own ``alice``. Before, the write, held
    to the uid read, was refused and reported as ``SecretNotWritten`` (retried every 5 s, a
    new Warning each time the reason flipped back). Now the name is read again and the Secret
    there is what one of another owner found at the read is: ``SecretConflict``, naming the
    Secret and its owner, and left as it is."""
    ns, kube = kube_namespace, kube_cluster
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    user = kube.create(
        USERS.format(ns=ns),
        {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafScaleUser",
            "metadata": {"name": "alice", "namespace": ns},
            "spec": {"cluster": "demo"},
        },
    )
    ref = ClusterRef.from_body(user)
    kube.create(SECRETS.format(ns=ns), build_user_secret(ref, f"{ns}.demo", "hers"))
    secret = f"{SECRETS.format(ns=ns)}/alice"
    shop = _users_deployment(kube, ns, "shop")
    made: list[dict[str, Any]] = []

    def replace() -> None:
        kube.delete(secret)
        owners = [_owner_of(shop)]
        made.append(
            _users_secret(kube, ns, "alice", {"password": "theirs"}, ownerReferences=owners)
        )

    settings = operator_settings(kafscale_chart)
    client = TakenBeforeTheWrite(settings, ("Secret", "alice"), replace)
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    try:
        with pytest.raises(UserNotReady) as stopped:
            await reconcile_user(runtime, user)
    finally:
        await runtime.close()
    assert made, "the Secret was never written"
    ready, reason, message = stopped.value.verdict
    assert (ready, reason) == (False, "SecretConflict"), message
    assert "Secret alice (owned by Deployment shop" in message
    now = kube.get(secret)
    assert now["metadata"]["uid"] == made[0]["metadata"]["uid"]
    assert now["data"] == made[0]["data"]
    assert now["metadata"]["ownerReferences"] == made[0]["metadata"]["ownerReferences"]


class ReplacedBeforeThePatch(Kube):
    """The operator's client, with ``replace`` run once just before the JSON patch that drops
    a create's ``Update`` entry from ``path``: between the apply and that patch."""

    def __init__(self, settings: OperatorSettings, path: str, replace: Any) -> None:
        super().__init__(load_configuration(settings), settings.api_timeout_s)
        self._path, self._replace = path, replace

    async def _run(self, what: str, method: str, path: str, **kwargs: Any) -> Any:
        if what == "patch" and path == self._path and self._replace:
            replace, self._replace = self._replace, None
            await asyncio.to_thread(replace)
        return await super()._run(what, method, path, **kwargs)


async def test_the_patch_after_a_create_never_touches_an_object_made_in_its_place(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The operator created ``demo-brokers`` and applied it; before the patch that removes the
    create's ``Update`` entry from it, the Service was deleted and another made in its place,
    made the way the operator makes one (a create, then an apply, under its field manager: a
    second operator process, an old replica during an upgrade), so its ``managedFields`` look
    alike. Before, the patch had no uid check and removed the newcomer's entry. Now it tests
    the uid first: the newcomer is left as it is and, read again, counts as another owner's."""
    ns, kube = kube_namespace, kube_cluster
    body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
    ref, settings = ClusterRef.from_body(body), operator_settings(kafscale_chart)
    service = f"{SERVICES.format(ns=ns)}/demo-brokers"
    made: list[dict[str, Any]] = []

    def replace() -> None:
        kube.delete(service)
        theirs = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "demo-brokers"},
            "spec": {
                "selector": {"app": "shop"},
                "ports": [{"name": "web", "port": 8080, "protocol": "TCP"}],  # 1.20: apply needs it
            },
        }
        manager = {"fieldManager": FIELD_MANAGER}
        kube.request("POST", SERVICES.format(ns=ns), theirs, params=manager)
        apply = "application/apply-patch+yaml"
        params = {**manager, "force": "true"}
        made.append(kube.request("PATCH", service, theirs, content_type=apply, params=params))

    client = ReplacedBeforeThePatch(settings, service, replace)
    runtime = await _apply_once(client, settings, ref, MANAGED)
    assert made, "no patch after the Service's create"
    now = kube.get(service)
    assert now["metadata"]["uid"] == made[0]["metadata"]["uid"]
    entries = [(e["manager"], e["operation"]) for e in now["metadata"]["managedFields"]]
    assert sorted(entries) == [(FIELD_MANAGER, "Apply"), (FIELD_MANAGER, "Update")]
    assert now["spec"]["selector"] == {"app": "shop"}
    assert "Service demo-brokers (no owner reference)" in (
        runtime.not_owned[cluster_key(ref)] or ""
    )
    assert _owned_by_cluster(kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"), body)
