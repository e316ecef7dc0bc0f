"""The operator on the real API server driving real broker processes that run beside it.

No kubelet runs: the Deployment controller makes the broker pods, and for each pod the test
starts a ``kafscale broker`` process configured from the operator's ConfigMap, with the pod's
name, as the pod's container would be. Scaling, pod deletion and operator restarts then go
through the real API server and controllers; the assignment the brokers follow is read back
from etcd.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    TOPICS,
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
from harness.s3 import S3Endpoint

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.operator.naming import label_selector

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

SELECTOR = label_selector("demo", "broker")


class PodBrokers:
    """One broker process per broker pod, configured from the operator's ConfigMap."""

    def __init__(self, kube: KubeCluster, namespace: str, brokers: BrokerCluster) -> None:
        self.kube, self.namespace, self.brokers = kube, namespace, brokers
        self.started: dict[str, Any] = {}

    def config(self) -> dict[str, str]:
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/demo-config"
        data: dict[str, str] = self.kube.get(path)["data"]
        # The pod's ports are the container's; beside each other, processes need their own.
        return {k: v for k, v in data.items() if not k.startswith("KAFSCALE_LISTENER__")}

    def follow(self, *, bind: bool = False) -> list[str]:
        """Start a broker for every live pod that has none yet; report the pods ready."""
        for pod in live_pods(self.kube, self.namespace, SELECTOR):
            name = pod["metadata"]["name"]
            if name not in self.started:
                self.started[name] = self.brokers.start(**self.config(), KAFSCALE_POD_NAME=name)
                mark_ready(self.kube, self.namespace, pod, bind=bind)
        return sorted(self.started)


async def assignment(etcd: Etcd, cluster: str) -> Assignment | None:
    kv = await etcd.get(keys.assignment_key(cluster))
    return None if kv is None else Assignment.from_json(kv.value)


async def registered_nodes(etcd: Etcd, cluster: str) -> dict[str, int]:
    """Pod name → node id of every registered broker."""
    entries = await etcd.get_prefix(keys.brokers_prefix(cluster))
    return {json.loads(e.value)["pod"]: json.loads(e.value)["node_id"] for e in entries}


def topic_manifest(namespace: str, partitions: int) -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleTopic",
        "metadata": {"name": "orders", "namespace": namespace},
        "spec": {"clusterRef": "demo", "partitions": partitions},
    }


@pytest.fixture
def pod_brokers(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    tmp_path: Path,
) -> Any:
    cluster = new_cluster(
        etcd_server.client_url, s3_server, tmp_path, "op", name=f"{kube_namespace}.demo"
    )
    create_s3_secret(kube_cluster, kube_namespace, s3_server)
    try:
        yield PodBrokers(kube_cluster, kube_namespace, cluster)
    finally:
        cluster.stop_all()


async def test_a_topic_and_kubectl_scale_replan_the_assignment_of_real_brokers(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
    pod_brokers: PodBrokers,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    cluster, path = f"{ns}.demo", f"{CLUSTERS.format(ns=ns)}/demo"
    bucket = pod_brokers.brokers.bucket
    spec = external_spec(etcd_server, s3_server, bucket, brokers={"replicas": 2})
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    kube.create(TOPICS.format(ns=ns), topic_manifest(ns, 6))

    # The KafScaleTopic becomes a topic: its record in etcd, its status.
    topic = await settle(
        lambda: (kube.get(f"{TOPICS.format(ns=ns)}/orders").get("status") or {}).get("topicId"),
        what="topic status",
    )
    record = await etcd.get(keys.topic_key(cluster, "orders"))
    assert record is not None and topic in record.value.decode()

    await settle(lambda: len(live_pods(kube, ns, SELECTOR)) == 2, what="two broker pods")
    assert len(pod_brokers.follow()) == 2
    nodes = await settle(lambda: _n_registered(etcd, cluster, 2), what="two brokers registered")
    first = await settle(
        lambda: _spread_over(etcd, cluster, set(nodes.values())),
        what="assignment over two brokers",
    )
    assert sorted(first.owners.values()).count(min(nodes.values())) == 3

    # kubectl scale through the scale subresource; the Deployment follows, a pod appears.
    kube.kubectl("scale", "kafscalecluster", "demo", "-n", ns, "--replicas=3")
    scale = kube.get(f"{path}/scale")
    assert scale["spec"]["replicas"] == 3
    await settle(
        lambda: kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker")["spec"]["replicas"] == 3,
        what="Deployment scaled",
    )
    await settle(lambda: len(live_pods(kube, ns, SELECTOR)) == 3, what="three broker pods")
    assert len(pod_brokers.follow()) == 3
    nodes = await settle(lambda: _n_registered(etcd, cluster, 3), what="three brokers registered")
    second = await settle(
        lambda: _spread_over(etcd, cluster, set(nodes.values())),
        what="assignment over three brokers",
    )
    assert second.generation > first.generation
    assert sorted(list(second.owners.values()).count(n) for n in nodes.values()) == [2, 2, 2]
    moved = [tp for tp in first.owners if first.owners[tp] != second.owners[tp]]
    assert len(moved) == 2  # only what the newcomer takes

    status = await settle(
        lambda: (
            (kube.get(path).get("status") or {}).get("brokers", {}).get("registered") == 3
            and kube.get(path)["status"]
        ),
        what="status with three registered brokers",
    )
    assert status["brokers"]["replicas"] == 3
    scale = kube.get(f"{path}/scale")  # what an HPA targeting the cluster reads
    assert scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == SELECTOR
    assert status["leases"]["partitions"] == 6


async def _n_registered(etcd: Etcd, cluster: str, count: int) -> dict[str, int] | None:
    nodes = await registered_nodes(etcd, cluster)
    return nodes if len(nodes) == count else None


async def _spread_over(etcd: Etcd, cluster: str, nodes: set[int]) -> Assignment | None:
    current = await assignment(etcd, cluster)
    return current if current and set(current.owners.values()) == nodes else None


async def test_a_terminating_broker_pod_is_drained(
    kube_cluster: KubeCluster,
    real_operator: Any,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
    pod_brokers: PodBrokers,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    cluster = f"{ns}.demo"
    spec = external_spec(
        etcd_server, s3_server, pod_brokers.brokers.bucket, brokers={"replicas": 2}
    )
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    kube.create(TOPICS.format(ns=ns), topic_manifest(ns, 4))
    await settle(lambda: len(live_pods(kube, ns, SELECTOR)) == 2, what="two broker pods")
    pods = pod_brokers.follow(bind=True)
    nodes = await settle(lambda: _n_registered(etcd, cluster, 2), what="two brokers registered")
    before = await settle(
        lambda: _spread_over(etcd, cluster, set(nodes.values())),
        what="assignment over two brokers",
    )

    # kubectl delete pod, with the pod's grace period: no kubelet confirms, so it stays.
    leaving, staying = pods[1], pods[0]
    kube.kubectl("delete", "pod", leaving, "-n", ns, "--wait=false")
    pod_path = f"/api/v1/namespaces/{ns}/pods/{leaving}"
    assert kube.get(pod_path)["metadata"]["deletionTimestamp"]
    draining = await settle(
        lambda: etcd.get(keys.draining_key(cluster, nodes[leaving])),
        what="the broker marked draining",
    )
    assert leaving in draining.value.decode()
    # The mark goes away with the broker's session: it is bound to the registration's lease.
    registration = await etcd.get(keys.broker_key(cluster, nodes[leaving]))
    assert registration is not None and draining.lease == registration.lease != 0
    after = await settle(
        lambda: _spread_over(etcd, cluster, {nodes[staying]}),
        what="partitions moved off the draining broker",
    )
    assert after.generation > before.generation
    assert kube.get(pod_path) is not None  # still terminating
    await settle(
        lambda: (
            (kube.get(f"{CLUSTERS.format(ns=ns)}/demo").get("status") or {})
            .get("leases", {})
            .get("draining")
            == [nodes[leaving]]
        ),
        what="status lists the draining broker",
    )
    # kubectl describe tells what the operator did.
    events = await settle(
        lambda: [e for e in events_of(kube, ns, "demo") if e[1] == "Draining"],
        what="a Draining Event",
    )
    assert events == [
        (
            "Normal",
            "Draining",
            f"pod {leaving} is terminating: broker {nodes[leaving]} draining, "
            "its partitions reassigned",
        )
    ]
    await settle(  # posted by the rebalance, which may report after the drain's Event
        lambda: any(
            f"over brokers [{nodes[staying]}]" in e[2]
            for e in events_of(kube, ns, "demo")
            if e[1] == "Rebalanced"
        ),
        what="a Rebalanced Event over the staying broker",
    )


async def test_an_operator_restarted_mid_way_resumes_without_duplicate_work(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    deployment_path = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    config_path = f"/api/v1/namespaces/{ns}/configmaps/demo-config"
    create_s3_secret(kube, ns, s3_server)
    settings = operator_settings(kafscale_chart)
    async with operator_thread(settings):
        spec = external_spec(etcd_server, s3_server, "bucket-1", brokers={"replicas": 2})
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        kube.create(TOPICS.format(ns=ns), topic_manifest(ns, 3))
        await settle(
            lambda: (kube.get(path).get("status") or {}).get("observedGeneration") == 1,
            what="generation 1 reconciled",
        )
        topic_id = await settle(
            lambda: (kube.get(f"{TOPICS.format(ns=ns)}/orders").get("status") or {}).get("topicId"),
            what="topic created",
        )
        deployment = kube.get(deployment_path)
        config_version = kube.get(config_path)["metadata"]["resourceVersion"]
        await settle(
            lambda: "NotServed" in [e[1] for e in events_of(kube, ns, "demo")],
            what="a NotServed Event (no policy/v1 PDB on 1.20)",
        )

    # While the operator is down, the user scales the cluster.
    kube.kubectl("scale", "kafscalecluster", "demo", "-n", ns, "--replicas=4")
    async with operator_thread(settings):
        await settle(
            lambda: (kube.get(path).get("status") or {}).get("observedGeneration") == 2,
            what="generation 2 reconciled after the restart",
        )
        resumed = kube.get(deployment_path)
        assert resumed["spec"]["replicas"] == 4
        # Exactly one change to the Deployment; the unchanged ConfigMap was not rewritten.
        assert resumed["metadata"]["generation"] == deployment["metadata"]["generation"] + 1
        assert kube.get(config_path)["metadata"]["resourceVersion"] == config_version
        cr = kube.get(path)
        assert cr["metadata"]["finalizers"] == ["kafscale.io/finalizer"]
        topic = kube.get(f"{TOPICS.format(ns=ns)}/orders")
        assert topic["status"]["topicId"] == topic_id  # the topic was not made again
        record = await etcd.get(keys.topic_key(f"{ns}.demo", "orders"))
        assert record is not None and topic_id in record.value.decode()
        assert condition_of(cr, "Ready") is not None
        scaled = await settle(
            lambda: [e for e in events_of(kube, ns, "demo") if e[1] == "Scaled"],
            what="a Scaled Event",
        )
        assert scaled == [("Normal", "Scaled", "broker replicas 2 → 4")]
        # The condition did not change, so the restart posted no second NotServed Event.
        assert [e[1] for e in events_of(kube, ns, "demo")].count("NotServed") == 1
