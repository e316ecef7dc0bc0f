"""Three surprises a Kubernetes user met, on the real API server (1.20.2, no kubelet).

A changed ``etcd.storageSize`` was a 422 that stopped the reconcile (later objects were never
applied); a failing handler said nothing in ``kubectl describe``; broker and proxy pods could
not run as a ServiceAccount of the user's (IRSA, workload identity). The operator runs as the
chart's ServiceAccount under the chart's RBAC.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    MANAGED,
    TOPICS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    events_of,
    operator_settings,
    pods_of,
    settle,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import closed_port

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.operator import naming, reconcile
from kafscale.operator.discovery import fetch_capabilities
from kafscale.operator.kube import Kube, load_configuration
from kafscale.operator.models import ClusterRef, KafScaleTopicSpec, parse_cluster_spec
from kafscale.operator.naming import label_selector
from kafscale.operator.runtime import EtcdPool, Runtime
from kafscale.operator.topics import reconcile_topic

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]


def _paths(ns: str) -> tuple[str, str, str]:
    return (
        f"{CLUSTERS.format(ns=ns)}/demo",
        f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd",
        f"/apis/apps/v1/namespaces/{ns}/deployments/demo-broker",
    )


def _config_hash(kube: KubeCluster, deployment: str) -> str | None:
    template = ((kube.get(deployment) or {}).get("spec") or {}).get("template") or {}
    return (template.get("metadata", {}).get("annotations") or {}).get(
        naming.ANNOTATION_CONFIG_HASH
    )


def _claim_size(kube: KubeCluster, statefulset: str) -> str:
    (claim,) = kube.get(statefulset)["spec"]["volumeClaimTemplates"]
    size: str = claim["spec"]["resources"]["requests"]["storage"]
    return size


async def test_a_changed_etcd_storage_size_is_refused_visibly_and_the_rest_still_applies(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """Before: the StatefulSet's 422 stopped the reconcile at the etcd objects, so the broker
    config change made in the same edit never rolled out, and the status said ``ApplyFailed``
    with the API server's words. Now the old size is kept, the brokers roll, and the cluster
    says what to do (``ImmutableFieldChanged``, with an Event). An etcd member-count change
    (no CEL transition rules on 1.20) applies nothing, since it would rewrite the brokers'
    etcd endpoints."""
    ns, kube = kube_namespace, kube_cluster
    cluster, statefulset, deployment = _paths(ns)
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        first = await settle(lambda: _config_hash(kube, deployment), what="the brokers")
        kube.merge_patch(
            cluster,
            {
                "spec": {
                    "etcd": {"storageSize": "2Gi"},
                    "brokers": {"config": {"log.flush_interval_ms": "50"}},
                }
            },
        )
        second = await settle(
            lambda: (h := _config_hash(kube, deployment)) != first and h,
            what="the broker config change applied",
        )
        assert _claim_size(kube, statefulset) == "1Gi"

        def refused() -> tuple[str, str, str] | None:
            degraded = condition_of(kube.get(cluster), "Degraded")
            return degraded if degraded and degraded[1] == "ImmutableFieldChanged" else None

        status, _, message = await settle(refused, what="Degraded: ImmutableFieldChanged")
        assert status == "True"
        assert "etcd.storageSize cannot change after creation: was 1Gi, now 2Gi" in message
        assert "set it back" in message
        ready = condition_of(kube.get(cluster), "Ready")
        assert ready is not None and ready[:2] == ("False", "ImmutableFieldChanged")

        def warned() -> list[tuple[str, str, str]]:
            return [e for e in events_of(kube, ns, "demo") if e[1] == "ImmutableFieldChanged"]

        (event,) = await settle(warned, what="an ImmutableFieldChanged Event")
        assert event[0] == "Warning" and "was 1Gi, now 2Gi" in event[2]

        # Set back, and in the same edit a member count 1.20 does not refuse: nothing applies.
        kube.merge_patch(
            cluster,
            {
                "spec": {
                    "etcd": {"storageSize": "1Gi", "replicas": 3},
                    "brokers": {"config": {"log.flush_interval_ms": "60"}},
                }
            },
        )

        def members_refused() -> str | None:
            degraded = condition_of(kube.get(cluster), "Degraded") or ("", "", "")
            return degraded[2] if "etcd.replicas" in degraded[2] else None

        message = await settle(members_refused, what="the member count refused")
        assert "was 1, now 3" in message and "storageSize" not in message
        assert kube.get(statefulset)["spec"]["replicas"] == 1
        assert _config_hash(kube, deployment) == second  # the brokers did not move

        kube.merge_patch(cluster, {"spec": {"etcd": {"replicas": 1}}})

        def cleared() -> bool:
            degraded = condition_of(kube.get(cluster), "Degraded")
            return degraded is not None and degraded[1] != "ImmutableFieldChanged"

        await settle(cleared, what="the refusal cleared once the spec is set back")
        await settle(
            lambda: _config_hash(kube, deployment) not in (first, second),
            what="the held broker change applied",
        )


async def test_a_failing_handler_posts_one_warning_event_not_one_per_retry(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A ResourceQuota forbids the broker Deployment: ``reconcile_cluster`` fails and kopf
    retries it every 5 s. Before, only the operator's log said why; now ``kubectl describe``
    shows one ``ReconcileFailed`` Warning with the API server's one-line answer, posted once
    while the same failure repeats."""
    ns, kube = kube_namespace, kube_cluster
    cluster, _, _ = _paths(ns)
    quota = f"/api/v1/namespaces/{ns}/resourcequotas"
    hard = {"count/deployments.apps": "0"}
    kube.create(quota, {"metadata": {"name": "no-deployments"}, "spec": {"hard": hard}})
    # Stand in for the quota controller (not run here): usage known, nothing used.
    kube.merge_patch(
        f"{quota}/no-deployments/status",
        {"status": {"hard": hard, "used": {"count/deployments.apps": "0"}}},
    )
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))

        def failed() -> list[tuple[str, str, str]]:
            return [e for e in events_of(kube, ns, "demo") if e[1] == "ReconcileFailed"]

        (event,) = await settle(failed, what="a ReconcileFailed Event")
        assert event[0] == "Warning"
        assert event[2].startswith("reconcile_cluster failed: applying objects:")
        assert "403" in event[2] and "retrying in 5 s" in event[2]
        assert "\n" not in event[2] and "Traceback" not in event[2]

        def retries() -> int:
            progress = (kube.get(cluster).get("status") or {}).get("kopf") or {}
            return max(
                (int(p.get("retries") or 0) for p in progress.values() if isinstance(p, dict)),
                default=0,
            )

        await settle(lambda: retries() >= 3, what="kopf retrying the handler")
        assert len(failed()) == 1
        described = kube.kubectl("describe", "kafscalecluster", "demo", "-n", ns).stdout
        assert "ReconcileFailed" in described


def _service_account(kube: KubeCluster, ns: str, name: str, **fields: Any) -> None:
    kube.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}, **fields})


async def test_broker_and_proxy_pods_run_as_the_service_account_the_spec_names(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """IRSA / workload identity give S3 access to a pod by its ServiceAccount: the pods the
    Deployment controller makes carry the one the spec names (the API server's CRD schema
    kept the field, ``kubectl explain`` describes it); the ServiceAccount's own
    ``automountServiceAccountToken`` decides about a token."""
    ns, kube = kube_namespace, kube_cluster
    _service_account(kube, ns, "s3-reader", automountServiceAccountToken=False)
    _service_account(kube, ns, "proxy-id", automountServiceAccountToken=False)
    spec = {
        **MANAGED,
        "brokers": {"replicas": 1, "serviceAccountName": "s3-reader"},
        "proxy": {"enabled": True, "replicas": 1, "serviceAccountName": "proxy-id"},
    }
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        for component, account in ((naming.BROKER, "s3-reader"), (naming.PROXY, "proxy-id")):
            selector = label_selector("demo", component)
            (pod,) = await settle(
                lambda selector=selector: pods_of(kube, ns, selector) or None,
                what=f"a {component} pod",
            )
            assert pod["spec"]["serviceAccountName"] == account
            volumes = [v["name"] for v in pod["spec"].get("volumes") or []]
            assert not any("token" in v or "kube-api-access" in v for v in volumes), volumes
    explained = kube.kubectl("explain", "kafscalecluster.spec.brokers.serviceAccountName")
    assert "IRSA" in " ".join(explained.stdout.split())


async def test_a_proxy_service_type_change_back_to_cluster_ip_applies(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """The other immutable-looking field a spec reaches: a Service's allocated node ports.
    ``LoadBalancer`` → ``ClusterIP`` applies on 1.20 (the server drops the node ports the
    operator never owned), so the operator needs no refusal for it."""
    ns, kube = kube_namespace, kube_cluster
    cluster, _, _ = _paths(ns)
    service = f"/api/v1/namespaces/{ns}/services/demo-proxy"
    spec = {**MANAGED, "proxy": {"enabled": True, "serviceType": "LoadBalancer"}}
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        await settle(
            lambda: ((kube.get(service) or {}).get("spec") or {}).get("type") == "LoadBalancer",
            what="the proxy Service",
        )
        kube.merge_patch(cluster, {"spec": {"proxy": {"serviceType": "ClusterIP"}}})
        await settle(
            lambda: kube.get(service)["spec"]["type"] == "ClusterIP",
            what="the proxy Service back to ClusterIP",
        )
        ports = kube.get(service)["spec"]["ports"]
        assert all("nodePort" not in port for port in ports), ports
        degraded = condition_of(kube.get(cluster), "Degraded")
        assert degraded is None or degraded[1] != "ApplyFailed", degraded


def _brokers_etcd(kube: KubeCluster, ns: str, name: str) -> str | None:
    config_map = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{name}-config") or {}
    endpoints: str | None = (config_map.get("data") or {}).get("KAFSCALE_ETCD__ENDPOINTS")
    return endpoints


def _observed(kube: KubeCluster, cluster: str) -> bool:
    body = kube.get(cluster)
    return bool(
        (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]
    )


def _mode_refused(kube: KubeCluster, cluster: str) -> str | None:
    degraded = condition_of(kube.get(cluster), "Degraded") or ("", "", "")
    return (
        degraded[2]
        if degraded[1] == "ImmutableFieldChanged" and "etcd.mode" in degraded[2]
        else None
    )


async def test_an_etcd_mode_switch_is_refused_and_the_cluster_keeps_its_etcd(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """Before, ``etcd.mode`` Managed → External deleted the managed etcd StatefulSet (the
    cluster's topics, offsets and leases) and pointed the brokers at the new, empty etcd;
    External → Managed did the same the other way. Now neither is applied: the managed etcd,
    its claim template and the brokers' etcd endpoints stay, and the cluster says why and how
    to move, until the spec is set back."""
    ns, kube = kube_namespace, kube_cluster
    cluster, statefulset, deployment = _paths(ns)
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        first = await settle(lambda: _config_hash(kube, deployment), what="the brokers")
        etcd_before = kube.get(statefulset)
        endpoints = _brokers_etcd(kube, ns, "demo")
        assert endpoints is not None and "demo-etcd-client" in endpoints

        external = {"mode": "External", "endpoints": ["http://etcd.elsewhere.example:2379"]}
        kube.merge_patch(cluster, {"spec": {"etcd": external}})
        await settle(lambda: _observed(kube, cluster), what="the switch to External handled")
        etcd_now = kube.get(statefulset)
        assert etcd_now is not None, "the managed etcd StatefulSet was deleted"
        assert etcd_now["metadata"]["uid"] == etcd_before["metadata"]["uid"]
        assert (
            etcd_now["spec"]["volumeClaimTemplates"] == etcd_before["spec"]["volumeClaimTemplates"]
        )
        assert _brokers_etcd(kube, ns, "demo") == endpoints
        assert _config_hash(kube, deployment) == first  # the brokers did not move
        message = await settle(lambda: _mode_refused(kube, cluster), what="the switch refused")
        assert "was Managed, now External" in message and "snapshot" in message
        ready = condition_of(kube.get(cluster), "Ready")
        assert ready is not None and ready[:2] == ("False", "ImmutableFieldChanged")
        (event,) = await settle(
            lambda: [e for e in events_of(kube, ns, "demo") if "etcd.mode" in e[2]],
            what="an Event on the refused switch",
        )
        assert event[:2] == ("Warning", "ImmutableFieldChanged")

        kube.merge_patch(cluster, {"spec": {"etcd": {"mode": "Managed", "endpoints": None}}})
        await settle(lambda: _mode_refused(kube, cluster) is None, what="the refusal cleared")
        assert kube.get(statefulset)["metadata"]["uid"] == etcd_before["metadata"]["uid"]

        # The other way: a cluster on an external etcd is not moved to an empty managed one.
        other = f"{CLUSTERS.format(ns=ns)}/ext"
        kube.create(
            CLUSTERS.format(ns=ns),
            cluster_manifest("ext", ns, {"storage": {"bucket": "bucket-1"}, "etcd": external}),
        )
        on_external = await settle(lambda: _brokers_etcd(kube, ns, "ext"), what="ext's brokers")
        kube.merge_patch(other, {"spec": {"etcd": {"mode": "Managed", "replicas": 1}}})
        await settle(lambda: _observed(kube, other), what="the switch to Managed handled")
        message = await settle(lambda: _mode_refused(kube, other), what="the switch refused")
        assert "was External, now Managed" in message
        assert kube.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/ext-etcd") is None
        assert _brokers_etcd(kube, ns, "ext") == on_external


async def test_after_a_restart_the_operator_keeps_to_the_etcd_of_a_refused_mode_switch(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    """A cluster on an external etcd is switched to Managed, which is refused: its metadata is
    in the external etcd. Before, only the operator process knew that (from the cluster's last
    reconcile): restarted, its topic, user and lease handlers, which may run before the
    cluster's first reconcile, used the refused spec's etcd (the empty managed one). Now which
    etcd is in use is read from the cluster's live objects (its ConfigMap and etcd
    StatefulSet): a restarted operator, before any reconcile, writes a topic to the external
    etcd, and so does its topic handler. Nor does the restarted operator's status timer clear
    the refusal before its first pass over the cluster (it did, then the pass set it again: a
    Recovered Event and the Warning once more)."""
    ns, kube = kube_namespace, kube_cluster
    cluster = f"{CLUSTERS.format(ns=ns)}/ext"
    url = etcd_server.client_url
    external = {"storage": {"bucket": "bucket-1"}, "etcd": {"mode": "External", "endpoints": [url]}}
    settings = operator_settings(kafscale_chart)
    async with operator_thread(settings):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("ext", ns, external))
        await settle(lambda: _brokers_etcd(kube, ns, "ext"), what="ext's brokers")
        kube.merge_patch(cluster, {"spec": {"etcd": {"mode": "Managed", "replicas": 1}}})
        await settle(lambda: _mode_refused(kube, cluster), what="the switch refused")

    # A restarted operator, before its first reconcile of the cluster: nothing in memory.
    kube_client = Kube(load_configuration(settings), settings.api_timeout_s)
    runtime = Runtime(settings, kube_client, EtcdPool(settings.etcd_timeout_s))
    try:
        found = await reconcile.find_cluster(runtime, ns, "ext")
        assert found is not None and found[1].etcd.mode == "Managed"
        ref, spec = found
        name = naming.kafscale_cluster_name(ref, spec)
        async with runtime.cluster_etcd(ref, spec) as cluster_etcd:
            await reconcile_topic(
                cluster_etcd, name, "orders", KafScaleTopicSpec(cluster_ref="ext")
            )
        assert runtime.in_effect(ref, spec).etcd.mode == "External"
    finally:
        await runtime.close()
    assert await etcd.get(keys.topic_key(name, "orders")) is not None

    async with operator_thread(settings):  # and the restarted operator's topic handler
        topic = {"apiVersion": "kafscale.io/v1alpha1", "kind": "KafScaleTopic"}
        topic["metadata"] = {"name": "payments", "namespace": ns}
        topic["spec"] = {"clusterRef": "ext", "partitions": 2}
        kube.create(TOPICS.format(ns=ns), topic)
        await settle(
            lambda: etcd.get(keys.topic_key(name, "payments")), what="the topic in the old etcd"
        )
        # Its status timer does not clear the refusal before its first pass (and the pass does
        # not post the Warning again): one Warning over both lives, no Recovered between.
        assert _mode_refused(kube, cluster)
        said = [e[:2] for e in events_of(kube, ns, "ext") if e[1] != "NotServed"]
        assert said.count(("Warning", "ImmutableFieldChanged")) == 1, said
        assert ("Normal", "Recovered") not in said, said


async def test_a_cluster_made_again_under_a_deleted_ones_name_is_not_held_to_its_etcd(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    """``demo`` (managed etcd) is switched to an external etcd, which is refused: the operator
    keeps to the managed one. ``demo`` is then deleted without its finalizer having run in
    this operator (removed by hand from a deletion that hung, or given up after its tries) and
    made again on the external etcd, as the refusal's hint says to move. Before, which etcd is
    in use was remembered by namespace and name: until the new cluster's first pass, the
    operator held it to the deleted one's managed etcd, and a topic handled meanwhile went
    there (here: nowhere, that etcd has no pods). Now it is remembered by the cluster's uid:
    the topic is written to the etcd the new cluster's spec names."""
    ns, kube = kube_namespace, kube_cluster
    settings = operator_settings(kafscale_chart)
    client = Kube(load_configuration(settings), settings.api_timeout_s)
    runtime = Runtime(settings, client, EtcdPool(2.0), await fetch_capabilities(client))
    external = {
        "storage": {"bucket": "bucket-1"},
        "etcd": {"mode": "External", "endpoints": [etcd_server.client_url]},
    }
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    try:
        body = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, MANAGED))
        old = ClusterRef.from_body(body)
        await reconcile.apply_cluster(runtime, old, parse_cluster_spec(MANAGED))
        refused = await reconcile.apply_cluster(runtime, old, parse_cluster_spec(external))
        assert [r.field for r in refused.refusals] == ["etcd.mode"]
        kube.delete(cluster)
        await settle(lambda: kube.get(cluster) is None, what="the cluster deleted")

        again = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, external))
        ref, spec = ClusterRef.from_body(again), parse_cluster_spec(external)
        name = naming.kafscale_cluster_name(ref, spec)
        async with runtime.cluster_etcd(ref, spec) as cluster_etcd:  # before its first pass
            await reconcile_topic(
                cluster_etcd, name, "orders", KafScaleTopicSpec(cluster_ref="demo")
            )
        assert runtime.in_effect(ref, spec).etcd.mode == "External"
    finally:
        await runtime.close()
    assert await etcd.get(keys.topic_key(name, "orders")) is not None


async def test_a_cluster_made_again_under_a_deleted_ones_name_gets_its_own_events(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """``demo`` (``deletionPolicy: Delete``, its etcd unreachable) is degraded
    (``EtcdUnavailable``) and, on 1.20, runs without what the server does not serve
    (``NotServed``): a Warning Event says each. Its data cannot be deleted, so its deletion
    hangs, and the user removes the finalizer by hand (as the docs say): the operator never
    handles that deletion. ``demo`` made again with the same spec is another cluster in the
    same state. Before, the operator judged its first status against the deleted one's last
    reported conditions (kept by namespace and name), found nothing changed and posted no
    Event: ``kubectl describe`` of the new cluster did not say why it is degraded. Now what
    was reported is kept by the cluster's uid: the new cluster gets Events of its own."""
    ns, kube = kube_namespace, kube_cluster
    cluster = f"{CLUSTERS.format(ns=ns)}/demo"
    unreachable = {"mode": "External", "endpoints": [f"http://127.0.0.1:{closed_port()}"]}
    spec = {"storage": {"bucket": "bucket-1"}, "etcd": unreachable}
    warnings = {("Warning", "EtcdUnavailable"), ("Warning", "NotServed")}

    def said(uid: str) -> set[tuple[str, str]]:
        return {(kind, reason) for kind, reason, _ in events_of(kube, ns, "demo", uid=uid)}

    async with operator_thread(operator_settings(kafscale_chart)):
        manifest = cluster_manifest("demo", ns, {**spec, "deletionPolicy": "Delete"})
        old = kube.create(CLUSTERS.format(ns=ns), manifest)["metadata"]["uid"]
        await settle(lambda: warnings <= said(old), what="the first cluster's Warnings")
        kube.kubectl("delete", "kafscalecluster", "demo", "-n", ns, "--wait=false")
        await settle(
            lambda: ("Warning", "DeletionFailed") in said(old), what="its deletion failing"
        )
        unfinalized = json.dumps({"metadata": {"finalizers": None}})
        kube.kubectl(
            "patch", "kafscalecluster", "demo", "-n", ns, "--type=merge", "-p", unfinalized
        )
        await settle(lambda: kube.get(cluster) is None, what="the first cluster gone")

        again = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        new = again["metadata"]["uid"]
        await settle(lambda: warnings <= said(new), what="the new cluster's own Warnings")
        degraded = condition_of(kube.get(cluster), "Degraded")
        assert degraded is not None and degraded[:2] == ("True", "EtcdUnavailable")
        assert ("Normal", "Recovered") not in said(new)
