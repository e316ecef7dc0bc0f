"""A Kubernetes user's first day, on the real API server: the commands the docs tell them to run.

``docs/operations-kubernetes.md`` promises what ``kubectl explain``, ``kubectl wait``,
``kubectl get`` and ``kubectl delete`` show; each test runs the command a user would (the
server's own kubectl 1.20) against the chart's CRDs and the operator running as the chart's
ServiceAccount.
"""

from __future__ import annotations

import json

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    TOPICS,
    USERS,
    InstalledChart,
    cluster_manifest,
    condition_of,
    create_s3_secret,
    events_of,
    external_spec,
    live_pods,
    mark_ready,
    operator_settings,
    settle,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import closed_port
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.operator import handlers, naming
from kafscale.operator.naming import label_selector

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

FINALIZER = "kafscale.io/finalizer"


def _explained(kube: KubeCluster, target: str, words: str) -> bool:
    """``kubectl explain target`` shows ``words`` (kubectl wraps lines: compare flattened).

    The server publishes a CRD's schema to its OpenAPI document a moment after the CRD is
    stored, so callers poll.
    """
    result = kube.kubectl("explain", target, check=False)
    return result.returncode == 0 and words in " ".join(result.stdout.split())


async def test_kubectl_explain_describes_each_resource_and_its_fields(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart
) -> None:
    """It said ``DESCRIPTION: <empty>`` for each kind, its ``spec`` and its ``status``."""
    expected = {
        "kafscalecluster": "A KafScale cluster (short name ksc)",
        "kafscaletopic": "A Kafka topic (short name kst)",
        "kafscaleuser": "A SASL/SCRAM user (short name ksu)",
        "ksc.spec": "Desired state, written by you",
        "ksc.status": "Observed state, written by the operator",
        "ksc.spec.brokers.replicas": "Number of broker pods",
    }
    for target, words in expected.items():
        await settle(
            lambda target=target, words=words: _explained(kube_cluster, target, words),
            what=f"kubectl explain {target} to say {words!r}",
        )


async def test_kubectl_wait_for_ready_and_a_deletion_that_cannot_finish_says_so(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``kubectl wait --for=condition=Ready`` returns once the brokers are ready; a cluster
    whose data cannot be deleted (``deletionPolicy: Delete``, its etcd gone) shows phase
    ``Terminating`` and Warning Events while its finalizer retries, then is let go.

    The phase stayed ``Running`` (or ``Degraded``) and nothing told ``kubectl describe`` why
    the resource did not go away.
    """
    monkeypatch.setattr(
        handlers, "DELETE_ATTEMPTS", 4, raising=False
    )  # 20 in production: 1 minute or more
    ns, kube = kube_namespace, kube_cluster
    store = await s3_server.open_store()
    async with operator_thread(operator_settings(kafscale_chart)):
        create_s3_secret(kube, ns, s3_server)
        spec = external_spec(etcd_server, s3_server, store.bucket, brokers={"replicas": 1})
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        selector = label_selector("demo", "broker")
        (pod,) = await settle(lambda: live_pods(kube, ns, selector), what="a broker pod")
        mark_ready(kube, ns, pod)
        waited = kube.kubectl(
            "wait",
            "--for=condition=Ready",
            "kafscalecluster/demo",
            "-n",
            ns,
            "--timeout=180s",
            timeout_s=200,
        )
        assert "condition met" in waited.stdout
        demo = kube.get(f"{CLUSTERS.format(ns=ns)}/demo")
        assert demo["status"]["observedGeneration"] == demo["metadata"]["generation"]

        lost = external_spec(etcd_server, s3_server, store.bucket, deletionPolicy="Delete")
        lost["etcd"]["endpoints"] = [f"http://127.0.0.1:{closed_port()}"]
        path = f"{CLUSTERS.format(ns=ns)}/lost"
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("lost", ns, lost))
        await settle(
            lambda: FINALIZER in (kube.get(path)["metadata"].get("finalizers") or []),
            what="the finalizer",
        )
        kube.kubectl("delete", "kafscalecluster", "lost", "-n", ns, "--wait=false")

        def terminating() -> bool:
            table = kube.kubectl("get", "ksc", "lost", "-n", ns, check=False).stdout.split("\n")
            return len(table) > 1 and table[1].split()[:2] == ["lost", "Terminating"]

        await settle(terminating, what="kubectl get ksc to show Terminating")
        await settle(
            lambda: "DeletionFailed" in [r for _, r, _ in events_of(kube, ns, "lost")],
            what="a DeletionFailed Event",
        )
        # After the last attempt the operator lets it go (a namespace deletion never hangs on
        # it) and says what it left behind.
        await settle(lambda: kube.get(path) is None, what="the resource let go", timeout_s=180)
        abandoned = [m for _, r, m in events_of(kube, ns, "lost") if r == "DeletionAbandoned"]
        assert abandoned and "gave up after 4 attempts" in abandoned[0]
        assert f"/kafscale/{ns}.lost/" in abandoned[0]
        types = {(t, r) for t, r, _ in events_of(kube, ns, "lost")}
        assert ("Warning", "DeletionFailed") in types
    await store.close()


async def test_without_the_operator_a_namespace_waits_for_the_finalizer_until_it_is_removed(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
) -> None:
    """What the docs say for ``helm uninstall`` before the clusters were deleted: the
    namespace stays ``Terminating`` (its finalizer named in its conditions) until the
    documented ``kubectl patch`` removes the finalizer."""
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    async with operator_thread(operator_settings(kafscale_chart)):
        spec = external_spec(etcd_server, s3_server, "bucket-1")
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        await settle(
            lambda: FINALIZER in (kube.get(path)["metadata"].get("finalizers") or []),
            what="the finalizer",
        )
    kube.kubectl("delete", "namespace", ns, "--wait=false")

    def finalizer_remaining() -> bool:
        namespace = kube.get(f"/api/v1/namespaces/{ns}") or {}
        remaining = condition_of(namespace, "NamespaceFinalizersRemaining")
        return remaining is not None and remaining[0] == "True" and FINALIZER in remaining[2]

    await settle(finalizer_remaining, what="the namespace to wait on the finalizer", timeout_s=120)
    assert kube.get(path)["metadata"].get("deletionTimestamp")
    patch = json.dumps({"metadata": {"finalizers": None}})
    kube.kubectl("patch", "kafscalecluster", "demo", "-n", ns, "--type=merge", "-p", patch)
    await settle(
        lambda: kube.get(f"/api/v1/namespaces/{ns}") is None,
        what="the namespace gone",
        timeout_s=120,
    )


async def test_kubectl_describe_of_a_topic_or_user_says_why_it_is_not_ready(
    kube_cluster: KubeCluster, kafscale_chart: InstalledChart, kube_namespace: str
) -> None:
    """A topic or user naming a cluster that does not exist: a Warning Event (reason
    ``ClusterNotFound``) on it, once. Only the status said so before."""
    ns, kube = kube_namespace, kube_cluster
    async with operator_thread(operator_settings(kafscale_chart)):
        topic = {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafScaleTopic",
            "metadata": {"name": "orders"},
            "spec": {"clusterRef": "nope", "partitions": 3},
        }
        user = {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafScaleUser",
            "metadata": {"name": "orders-app"},
            "spec": {"cluster": "nope", "authentication": {"type": "scram-sha-512"}},
        }
        kube.create(TOPICS.format(ns=ns), topic)
        kube.create(USERS.format(ns=ns), user)
        for kind, name in (("KafScaleTopic", "orders"), ("KafScaleUser", "orders-app")):

            def warned(kind: str = kind, name: str = name) -> list[tuple[str, str, str]]:
                return [e for e in events_of(kube, ns, name, kind) if e[1] == "ClusterNotFound"]

            (event,) = await settle(warned, what=f"a ClusterNotFound Event on the {kind}")
            assert event[0] == "Warning" and "nope" in event[2]
        described = kube.kubectl("describe", "kafscaletopic", "orders", "-n", ns).stdout
        assert "ClusterNotFound" in described


async def test_an_operator_upgrade_reapplies_managed_etcd_and_rolls_no_pod(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``helm upgrade`` to a new operator version: the operator resumes every cluster and
    applies its objects again. The etcd StatefulSet's claim template carried the operator's
    version, the API server refused the changed template (422), the cluster turned
    ``Degraded``/``ApplyFailed`` and nothing after it was applied; the broker pod template
    carried it too, so every pod rolled."""
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    statefulset = f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd"
    deployment = f"/apis/apps/v1/namespaces/{ns}/deployments/demo-broker"
    spec = {"storage": {"bucket": "bucket-1"}, "etcd": {"replicas": 3}}

    def version_of(obj_path: str) -> str | None:
        obj = kube.get(obj_path) or {}
        return (obj.get("metadata", {}).get("labels") or {}).get("app.kubernetes.io/version")

    monkeypatch.setattr(naming, "__version__", "0.0.9")
    async with operator_thread(operator_settings(kafscale_chart)):
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        await settle(lambda: version_of(deployment) == "0.0.9", what="the broker Deployment")
    generation = kube.get(deployment)["metadata"]["generation"]

    monkeypatch.setattr(naming, "__version__", "0.0.10")
    async with operator_thread(operator_settings(kafscale_chart)):
        # The last object applied carries the new version only if everything before it went.
        await settle(lambda: version_of(deployment) == "0.0.10", what="objects re-applied")
        assert version_of(statefulset) == "0.0.10"
        degraded = condition_of(kube.get(path), "Degraded")
        assert degraded is None or degraded[0] == "False", degraded
    assert kube.get(deployment)["metadata"]["generation"] == generation  # no rollout
