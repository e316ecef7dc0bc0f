"""The operator against a real Kubernetes API server (1.20.2, built from source; no kubelet).

Installed as a user installs it (``helm install`` of the chart), running as the chart's
ServiceAccount under the chart's RBAC, with real etcd, moto's S3 server and, where the test says
so, real broker processes beside it. What the emulation could not show shows here: schema
defaulting and pruning, subresources, server-side apply field ownership, RBAC, the garbage
collector, the Deployment controller, discovery of what the server serves.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    RELEASE,
    TOPICS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    create_s3_secret,
    external_spec,
    live_pods,
    mark_ready,
    operator_settings,
    settle,
)
from harness.kube_apiserver import ApiError, KubeCluster
from harness.s3 import S3Endpoint

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.operator.kube import Kube, KubeError, load_configuration
from kafscale.operator.naming import label_selector

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


# --- install ------------------------------------------------------------------------------------


async def test_chart_installs_and_the_operator_authenticates_as_its_service_account(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart
) -> None:
    for crd in (
        "kafscaleclusters.kafscale.io",
        "kafscaletopics.kafscale.io",
        "kafscaleusers.kafscale.io",
    ):
        established = condition_of(kube_cluster.get(f"{CRDS}/{crd}"), "Established")
        assert established is not None and established[0] == "True", crd
    deployment = kube_cluster.get(
        f"{DEPLOYMENTS.format(ns=kafscale_chart.namespace)}/{RELEASE}-operator"
    )
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"{RELEASE}-operator"
    assert kafscale_chart.service_account == f"{RELEASE}-operator"

    # The operator's own Kubernetes client, from a kubeconfig holding the ServiceAccount's token:
    # kubernetes 36.0.0 sent no token (401 here, anonymous auth is off).
    kube = Kube(load_configuration(operator_settings(kafscale_chart)), timeout_s=10)
    try:
        assert await kube.list("kafscale.io/v1alpha1", "KafScaleCluster", "default") == []
        assert await kube.get_path("/api/v1/pods") is not None  # kopf watches broker pods
        assert await kube.get_path("/api/v1/secrets") is not None  # the Secret watch
        # Least privilege: get, not list, on configmaps; of the objects it applies only the
        # kinds a cluster has several of are listed (one call per kind, not per name).
        for unlisted in ("/apis/apps/v1/statefulsets", "/api/v1/configmaps"):
            with pytest.raises(KubeError) as refused:
                await kube.get_path(unlisted)
            assert refused.value.status == 403, unlisted
    finally:
        kube.close()


def test_the_shipped_crds_apply_with_the_servers_kubectl(kube_cluster: KubeCluster) -> None:
    """``kubectl apply -f crds/``: the 1.20 server refused ``default: ''`` for a string.

    kubectl 1.20's client-side schema does not know ``x-kubernetes-validations`` (CEL, 1.25),
    so on such a server the documented command turns that check off; the server drops the rules.
    """
    result = kube_cluster.kubectl("apply", "--validate=false", "-f", "crds/", check=False)
    assert result.returncode == 0, result.stderr
    crd = kube_cluster.get(f"{CRDS}/kafscaleclusters.kafscale.io")
    assert "x-kubernetes-validations" not in json.dumps(crd["spec"])


# --- schemas --------------------------------------------------------------------------------------


def test_the_server_defaults_prunes_and_validates_the_custom_resources(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    path = CLUSTERS.format(ns=kube_namespace)
    spec = {"storage": {"bucket": "bucket-1", "notAField": 1}, "brokers": {"bogus": 2}, "x": 1}
    created = kube_cluster.create(
        path, cluster_manifest("demo", kube_namespace, spec), dry_run=True
    )
    stored = created["spec"]
    assert "x" not in stored and "notAField" not in stored["storage"]  # pruned
    assert "bogus" not in stored["brokers"]
    assert stored["brokers"]["replicas"] == 3  # defaulted, nested objects included
    assert stored["deletionPolicy"] == "Retain"
    assert stored["etcd"]["mode"] == "Managed"
    assert "prefix" not in stored["storage"]  # no default: the model supplies ''

    bad_specs = [
        {"storage": {"bucket": "ab"}},
        {"storage": {"bucket": "bucket-1"}, "brokers": {"replicas": -1}},
        {"storage": {"bucket": "bucket-1"}, "deletionPolicy": "Shred"},
        {"brokers": {"replicas": 1}},
    ]
    for index, bad in enumerate(bad_specs):
        with pytest.raises(ApiError) as refused:
            kube_cluster.create(
                path, cluster_manifest(f"bad-{index}", kube_namespace, bad), dry_run=True
            )
        assert refused.value.status == 422, bad
    topic = {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleTopic",
        "metadata": {"name": "orders"},
        "spec": {"clusterRef": "demo", "partitions": 0},
    }
    with pytest.raises(ApiError) as refused:
        kube_cluster.create(TOPICS.format(ns=kube_namespace), topic, dry_run=True)
    assert refused.value.status == 422


# --- a cluster's life -------------------------------------------------------------------------


async def test_cluster_objects_status_drift_repair_finalizer_and_garbage_collection(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    store = await s3_server.open_store()
    settings = operator_settings(kafscale_chart, resync_interval_s=1.5)
    async with operator_thread(settings):
        create_s3_secret(kube, ns, s3_server)
        spec = external_spec(
            etcd_server, s3_server, store.bucket, brokers={"replicas": 2}, deletionPolicy="Delete"
        )
        path = f"{CLUSTERS.format(ns=ns)}/demo"
        uid = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))["metadata"][
            "uid"
        ]
        cluster = f"{ns}.demo"
        children = {
            "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps/demo-config",
            "Service": f"/api/v1/namespaces/{ns}/services/demo-brokers",
            "Deployment": f"{DEPLOYMENTS.format(ns=ns)}/demo-broker",
        }
        for kind, child in children.items():
            obj = await settle(lambda child=child: kube.get(child), what=kind)
            owner = obj["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["uid"], owner["controller"]) == (
                "KafScaleCluster",
                uid,
                True,
            )

        # 1.20 serves no policy/v1: no PDB, a condition and an Event say so.
        features = await settle(
            lambda: condition_of(kube.get(path), "FeaturesSupported"), what="FeaturesSupported"
        )
        assert features[:2] == ("False", "NotServed")
        assert "PodDisruptionBudget demo-broker (policy/v1 is not served)" in features[2]
        assert "v1.20.2" in features[2]

        def not_served_event() -> bool:
            events = kube.get(f"/api/v1/namespaces/{ns}/events")["items"]
            return any(
                e["reason"] == "NotServed" and e["involvedObject"]["name"] == "demo" for e in events
            )

        await settle(not_served_event, what="a NotServed Event")

        # The Deployment controller creates the pods; we play their kubelet.
        selector = label_selector("demo", "broker")
        pods = await settle(
            lambda: len(live_pods(kube, ns, selector)) == 2 and live_pods(kube, ns, selector),
            what="two broker pods",
        )
        for pod in pods:
            mark_ready(kube, ns, pod)
        await settle(lambda: (kube.get(path).get("status") or {}).get("phase") == "Running")
        ready = condition_of(kube.get(path), "Ready")
        assert ready is not None and ready[:2] == ("True", "AllBrokersReady")
        table = kube.kubectl("get", "kafscalecluster", "demo", "-n", ns).stdout.split("\n")
        assert table[0].split() == ["NAME", "PHASE", "READY", "DESIRED", "BOOTSTRAP", "AGE"]
        assert table[1].split()[:5] == ["demo", "Running", "2", "2", f"demo-brokers.{ns}.svc:9092"]

        # A user's edit of an owned field is put back; a user's own annotation stays.
        config = children["ConfigMap"]
        kube.merge_patch(
            config,
            {
                "metadata": {"annotations": {"team": "streaming"}},
                "data": {"KAFSCALE_STORAGE__BUCKET": "hijacked"},
            },
        )
        await settle(
            lambda: kube.get(config)["data"]["KAFSCALE_STORAGE__BUCKET"] == store.bucket,
            what="the bucket put back",
        )
        assert kube.get(config)["metadata"]["annotations"]["team"] == "streaming"

        # Deleting the cluster runs the finalizer (deletionPolicy Delete), then the GC.
        object_key = keys.segment_object_key(cluster, "orders", "tid", 0, 0, 1)
        await store.put(object_key, b"batch")
        await etcd.put(keys.topic_key(cluster, "orders"), b'{"partitions": 1}')
        kube.kubectl("delete", "kafscalecluster", "demo", "-n", ns, "--wait=false")
        await settle(lambda: kube.get(path) is None, what="cluster deleted")
        assert await etcd.get_prefix(keys.cluster_prefix(cluster)) == []
        assert object_key not in {info.key for info in await store.list("")}
        for kind, child in children.items():
            await settle(lambda child=child: kube.get(child) is None, what=kind)
        await settle(lambda: pods_gone(kube, ns, selector), what="pods collected")
    await store.close()


async def test_a_brokers_config_value_the_brokers_refuse_is_invalid_spec_and_not_rolled_out(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
) -> None:
    """An etcd user without its password is a key the broker knows with a value it refuses at
    start (exit 2): rendered, every broker pod of the new ReplicaSet crash-looped. The operator
    now says why and leaves the running Deployment and its ConfigMap as they were."""
    ns, kube = kube_namespace, kube_cluster
    create_s3_secret(kube, ns, s3_server)
    spec = external_spec(etcd_server, s3_server, "bucket-1", brokers={"replicas": 1, "config": {}})
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    deployment_path = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    config_path = f"/api/v1/namespaces/{ns}/configmaps/demo-config"
    await settle(
        lambda: (kube.get(path).get("status") or {}).get("observedGeneration") == 1,
        what="the valid cluster reconciled",
    )
    deployment, config_map = kube.get(deployment_path), kube.get(config_path)

    kube.merge_patch(path, {"spec": {"brokers": {"config": {"etcd.username": "kafscale"}}}})
    ready = await settle(
        lambda: (
            (found := condition_of(kube.get(path), "Ready")) and found[1] == "InvalidSpec" and found
        ),
        what="Ready=False InvalidSpec",
    )
    assert ready[0] == "False"
    assert ready[2] == (
        "the brokers would refuse their settings and not start: brokers.config['etcd.username'] "
        "is set without brokers.config['etcd.password']: give both or neither"
    )
    assert kube.get(path)["status"]["observedGeneration"] == 2
    after = kube.get(deployment_path)
    assert after["metadata"]["generation"] == deployment["metadata"]["generation"]
    assert after["spec"]["template"] == deployment["spec"]["template"]
    assert kube.get(config_path)["data"] == config_map["data"]
    assert "KAFSCALE_ETCD__USERNAME" not in kube.get(config_path)["data"]


def pods_gone(kube: KubeCluster, ns: str, selector: str) -> bool:
    replicasets = kube.request(
        "GET", f"/apis/apps/v1/namespaces/{ns}/replicasets", params={"labelSelector": selector}
    )["items"]
    pods = kube.request("GET", f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector})
    return not replicasets and not pods["items"]


# --- discovery ------------------------------------------------------------------------------------


async def test_an_api_installed_later_is_seen_without_a_restart(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The operator re-reads what the server serves (``discovery_interval_s``), no restart."""
    caplog.set_level(logging.INFO, logger="kafscale.operator.discovery")
    ns, kube = kube_namespace, kube_cluster
    group = f"{ns}.kafscale-test.io"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    settings = operator_settings(kafscale_chart, discovery_interval_s=0.5)
    create_s3_secret(kube, ns, s3_server)
    try:
        async with operator_thread(settings):
            path = f"{CLUSTERS.format(ns=ns)}/demo"
            spec = external_spec(etcd_server, s3_server, "bucket-1")
            kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
            await settle(
                lambda: (kube.get(path).get("status") or {}).get("observedGeneration") == 1,
                what="the cluster reconciled",
            )
            kube.create(CRDS, crd)
            wanted = f"the API server now serves {group}/v1"
            await settle(
                lambda: any(wanted in r.getMessage() for r in caplog.records),
                what="the operator seeing the new API",
            )
    finally:
        kube.delete(f"{CRDS}/widgets.{group}")
