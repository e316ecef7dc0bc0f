"""The kopf handlers end to end on the real API server (1.20.2, no kubelet) and a real etcd.

These ran against an emulator (kmock plus 426 lines of server-side behaviour: apply, the status
and scale subresources, generations, garbage collection) until the real server could run here.
Each test creates resources through the API as kubectl would, with the operator running as the
chart's ServiceAccount; where a test needs brokers it writes their registrations into etcd as a
broker's session would (``test_real_brokers.py`` runs real broker processes instead).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from harness.k8s_real import (
    CLUSTERS,
    DEPLOYMENTS,
    TOPICS,
    cluster_manifest,
    condition_of,
    events_of,
    live_pods,
    mark_ready,
    settle,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import closed_port
from harness.s3 import S3Endpoint

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd
from kafscale.operator.naming import FIELD_MANAGER, label_selector

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]


def external(etcd_server: EmbeddedEtcd, **extra: Any) -> dict[str, Any]:
    return {
        "storage": {"bucket": "bucket-1"},
        "etcd": {"mode": "External", "endpoints": [etcd_server.client_url]},
        **extra,
    }


def topic_manifest(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleTopic",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def status_of(kube: KubeCluster, path: str) -> dict[str, Any]:
    return dict((kube.get(path) or {}).get("status") or {})


def reason(kube: KubeCluster, path: str, type_: str) -> tuple[str, str] | None:
    found = condition_of(kube.get(path), type_)
    return None if found is None else (found[0], found[1])


def managers(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Field manager → the fields it owns (``metadata.managedFields``, server-side apply)."""
    return {
        entry["manager"]: {"operation": entry["operation"], **entry.get("fieldsV1", {})}
        for entry in obj["metadata"].get("managedFields") or []
    }


def applied(kube: KubeCluster, path: str) -> dict[str, Any] | None:
    """The object at ``path`` once the operator has applied it, not only created it: a create
    (``Kube.create``) records its fields under an ``Update`` entry of the operator's, removed
    by the apply that follows it."""
    obj = kube.get(path)
    entries = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    ours = [e["operation"] for e in entries if e["manager"] == FIELD_MANAGER]
    return obj if ours == ["Apply"] else None


async def register_broker(etcd: Etcd, cluster: str, node_id: int, pod: str) -> int:
    """A broker's registration: JSON bound to its session lease. Returns the lease id."""
    lease = await etcd.grant_lease(30)
    doc = {"node_id": node_id, "host": f"10.0.0.{node_id}", "port": 9092, "rack": None, "pod": pod}
    await etcd.put(keys.broker_key(cluster, node_id), json.dumps(doc).encode(), lease=lease)
    return int(lease)


async def put_topic(etcd: Etcd, cluster: str, name: str, partitions: int) -> None:
    doc = {"topic_id": uuid.uuid4().hex, "partitions": partitions, "configs": {}}
    await etcd.put(keys.topic_key(cluster, name), json.dumps(doc).encode())


async def assignment(etcd: Etcd, cluster: str) -> Assignment | None:
    kv = await etcd.get(keys.assignment_key(cluster))
    return None if kv is None else Assignment.from_json(kv.value)


async def test_create_applies_owned_objects_with_server_side_apply(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any, etcd_server: EmbeddedEtcd
) -> None:
    ns, kube = kube_namespace, kube_cluster
    created = kube.create(
        CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, external(etcd_server))
    )
    uid = created["metadata"]["uid"]
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    children = {
        "ConfigMap": f"/api/v1/namespaces/{ns}/configmaps/demo-config",
        "Service": f"/api/v1/namespaces/{ns}/services/demo-brokers",
        "Deployment": f"{DEPLOYMENTS.format(ns=ns)}/demo-broker",
    }
    for kind, child in children.items():
        obj = await settle(lambda child=child: applied(kube, child), what=kind)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
        # Server-side apply under the operator's own field manager.
        assert managers(obj)[FIELD_MANAGER]["operation"] == "Apply", kind
    deployment = kube.get(children["Deployment"])
    assert deployment["spec"]["replicas"] == 3  # the CRD's default, filled in by the server
    assert kube.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets")["items"] == []  # external etcd

    status = await settle(lambda: status_of(kube, path).get("phase"), what="a phase")
    assert status == "Provisioning"
    current = status_of(kube, path)
    assert current["observedGeneration"] == 1
    assert current["bootstrap"] == f"demo-brokers.{ns}.svc:9092"
    assert current["clusterName"] == f"{ns}.demo"
    assert current["leases"] == {
        "partitions": 0,
        "owned": 0,
        "unowned": 0,
        "perBroker": {},
        "draining": [],
    }


async def test_update_rolls_config_and_observed_generation(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any, etcd_server: EmbeddedEtcd
) -> None:
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    config_path = f"/api/v1/namespaces/{ns}/configmaps/demo-config"
    deployment_path = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, external(etcd_server)))
    first = await settle(lambda: kube.get(deployment_path), what="the Deployment")
    first_hash = first["spec"]["template"]["metadata"]["annotations"]["kafscale.io/config-hash"]
    await settle(lambda: status_of(kube, path).get("observedGeneration") == 1, what="generation 1")

    kube.merge_patch(path, {"spec": {"brokers": {"config": {"log.flush_interval_ms": "25"}}}})
    await settle(
        lambda: kube.get(config_path)["data"].get("KAFSCALE_LOG__FLUSH_INTERVAL_MS") == "25",
        what="the new setting in the ConfigMap",
    )
    await settle(
        lambda: (
            kube.get(deployment_path)["spec"]["template"]["metadata"]["annotations"][
                "kafscale.io/config-hash"
            ]
            != first_hash
        ),
        what="a rolling restart of the brokers",
    )
    await settle(lambda: status_of(kube, path).get("observedGeneration") == 2, what="generation 2")

    # The operator's many status writes never bumped the generation (GitOps sees no drift).
    cr = kube.get(path)
    assert cr["metadata"]["generation"] == 2
    assert cr["spec"]["brokers"]["config"] == {"log.flush_interval_ms": "25"}


async def test_invalid_config_is_reported_degraded(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any, etcd_server: EmbeddedEtcd
) -> None:
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    spec = external(etcd_server, brokers={"config": {"log.flush_interval": "25"}})
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    await settle(
        lambda: reason(kube, path, "Degraded") == ("True", "InvalidSpec"), what="InvalidSpec"
    )
    status = status_of(kube, path)
    assert status["phase"] == "Degraded"
    degraded = condition_of(kube.get(path), "Degraded")
    assert degraded is not None and "log.flush_interval" in degraded[2]
    assert kube.get(f"{DEPLOYMENTS.format(ns=ns)}/demo-broker") is None
    warnings = await settle(
        lambda: [e for e in events_of(kube, ns, "demo") if e[1] == "InvalidSpec"],
        what="an InvalidSpec Event",
    )
    assert warnings[0][0] == "Warning" and "log.flush_interval" in warnings[0][2]


async def test_unreachable_etcd_is_degraded_with_a_reason_and_an_event(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any
) -> None:
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    dead = f"http://127.0.0.1:{closed_port()}"  # on purpose: nothing listens there
    spec = {"storage": {"bucket": "bucket-1"}, "etcd": {"mode": "External", "endpoints": [dead]}}
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    await settle(
        lambda: reason(kube, path, "Degraded") == ("True", "EtcdUnavailable"),
        what="Degraded EtcdUnavailable",
    )
    assert status_of(kube, path)["phase"] == "Degraded"
    warnings = await settle(
        lambda: [e for e in events_of(kube, ns, "demo") if e[1] == "EtcdUnavailable"],
        what="an EtcdUnavailable Event",
    )
    assert warnings[0][0] == "Warning"


async def test_autoscaled_brokers_leave_replicas_to_the_autoscaler(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any, etcd_server: EmbeddedEtcd
) -> None:
    """The operator never owns ``replicas`` while autoscaling is on; 1.20 gets no HPA.

    Kubernetes 1.20 serves no ``autoscaling/v2``, so the HPA is left out and said so; the
    Deployment's replicas belong to whoever scales it (here ``kubectl scale``), and drift
    repair does not take them back. Autoscaling off: the operator owns them again.
    """
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    deployment_path = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
    spec = external(etcd_server, autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    deployment = await settle(lambda: applied(kube, deployment_path), what="the Deployment")
    owned = json.dumps(managers(deployment)[FIELD_MANAGER])
    assert '"f:replicas"' not in owned
    features = await settle(
        lambda: condition_of(kube.get(path), "FeaturesSupported"), what="FeaturesSupported"
    )
    assert "HorizontalPodAutoscaler demo-broker (autoscaling/v2 is not served)" in features[2]

    kube.kubectl("scale", "deployment", "demo-broker", "-n", ns, "--replicas=5")
    # Another reconcile (a spec change) applies the Deployment again: replicas stay the scaler's.
    kube.merge_patch(path, {"spec": {"brokers": {"config": {"log.flush_interval_ms": "25"}}}})
    await settle(lambda: status_of(kube, path).get("observedGeneration") == 2, what="generation 2")
    config = kube.get(f"/api/v1/namespaces/{ns}/configmaps/demo-config")
    assert config["data"]["KAFSCALE_LOG__FLUSH_INTERVAL_MS"] == "25"
    assert kube.get(deployment_path)["spec"]["replicas"] == 5

    def desired_column() -> str:
        table = kube.kubectl("get", "ksc", "demo", "-n", ns).stdout.split("\n")
        return table[1].split()[3]  # NAME PHASE READY DESIRED BOOTSTRAP AGE

    # kubectl get's DESIRED is the scaler's 5, not the ignored spec.brokers.replicas (3).
    await settle(lambda: desired_column() == "5", what="DESIRED 5")

    kube.merge_patch(path, {"spec": {"autoscaling": {"enabled": False}}})
    await settle(
        lambda: kube.get(deployment_path)["spec"]["replicas"] == 3,
        what="replicas back to spec.brokers.replicas",
    )
    assert '"f:replicas"' in json.dumps(managers(kube.get(deployment_path))[FIELD_MANAGER])


async def test_managed_etcd_objects(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any
) -> None:
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    spec = {"storage": {"bucket": "bucket-1"}, "etcd": {"replicas": 3}}
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    statefulset = await settle(
        lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd"),
        what="the etcd StatefulSet",
    )
    assert statefulset["spec"]["replicas"] == 3
    expected_services = {"demo-etcd", "demo-etcd-client", "demo-brokers"}

    def services() -> set[str]:
        items = kube.get(f"/api/v1/namespaces/{ns}/services")["items"]
        return {s["metadata"]["name"] for s in items}

    await settle(lambda: services() >= expected_services, what="the three Services")
    assert services() == expected_services
    # etcd is not reachable here (no DNS, no pods run): the cluster waits, it is not degraded.
    await settle(
        lambda: reason(kube, path, "Progressing") == ("True", "EtcdStarting"), what="EtcdStarting"
    )
    assert reason(kube, path, "Degraded") == ("False", "AsExpected")
    # 1.20: neither PDB (policy/v1) nor the StatefulSet's PVC retention field (1.23) exist.
    features = condition_of(kube.get(path), "FeaturesSupported")
    assert features is not None and features[:2] == ("False", "NotServed")
    assert "PodDisruptionBudget demo-etcd (policy/v1 is not served)" in features[2]
    assert "persistentVolumeClaimRetentionPolicy" in features[2]


async def test_delete_with_retain_keeps_the_data(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_operator: Any,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
) -> None:
    """``deletionPolicy: Retain`` (the default): objects go, etcd records and segments stay.

    (``Delete`` runs in ``test_real_api.py``'s cluster life test.)
    """
    ns, kube = kube_namespace, kube_cluster
    store = await s3_server.open_store()
    try:
        cluster = f"{ns}.demo"
        object_key = keys.segment_object_key(cluster, "orders", "tid", 0, 0, 1)
        await store.put(object_key, b"batch")
        spec = external(etcd_server)
        spec["storage"] = {"bucket": store.bucket, "endpoint": s3_server.url}
        path = f"{CLUSTERS.format(ns=ns)}/demo"
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
        await put_topic(etcd, cluster, "orders", 2)
        deployment_path = f"{DEPLOYMENTS.format(ns=ns)}/demo-broker"
        await settle(lambda: kube.get(deployment_path), what="the Deployment")
        await settle(
            lambda: "kafscale.io/finalizer" in kube.get(path)["metadata"].get("finalizers", []),
            what="the finalizer",
        )

        kube.kubectl("delete", "kafscalecluster", "demo", "-n", ns, "--wait=false")
        await settle(lambda: kube.get(path) is None, what="cluster deleted")
        await settle(lambda: kube.get(deployment_path) is None, what="Deployment collected")
        remaining = await etcd.get_prefix(keys.cluster_prefix(cluster))
        assert [kv.key for kv in remaining] == [keys.topic_key(cluster, "orders")]
        assert object_key in {info.key for info in await store.list("")}
    finally:
        await store.close()


async def test_topic_lifecycle(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_operator: Any,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, external(etcd_server)))
    cluster = f"{ns}.demo"
    await register_broker(etcd, cluster, 1, "demo-broker-1")
    selector = label_selector("demo", "broker")
    pods = await settle(
        lambda: len(live_pods(kube, ns, selector)) == 3 and live_pods(kube, ns, selector),
        what="three broker pods",
    )
    for pod in pods:
        mark_ready(kube, ns, pod)
    path = f"{TOPICS.format(ns=ns)}/orders"
    spec = {"clusterRef": "demo", "partitions": 3, "configs": {"retention.ms": "60000"}}
    kube.create(TOPICS.format(ns=ns), topic_manifest("orders", ns, spec))

    record_kv = await settle(lambda: etcd.get(keys.topic_key(cluster, "orders")), what="record")
    record = json.loads(record_kv.value)
    assert record["partitions"] == 3 and record["configs"] == {"retention.ms": "60000"}
    assert len(record["topic_id"]) == 32
    await settle(lambda: status_of(kube, path).get("phase") == "Ready", what="topic Ready")
    assert status_of(kube, path)["topicId"] == record["topic_id"]
    first = await settle(lambda: assignment(etcd, cluster), what="an assignment")
    assert len(first.owners) == 3
    # The registered broker is no process: it never takes its leases, and the cluster says so.
    await settle(
        lambda: (
            condition_of(kube.get(f"{CLUSTERS.format(ns=ns)}/demo"), "Progressing")
            == ("True", "PartitionsUnowned", "3/3 partitions have no live owner")
        ),
        what="Progressing PartitionsUnowned",
    )

    async def partitions() -> int:
        kv = await etcd.get(keys.topic_key(cluster, "orders"))
        return int(json.loads(kv.value)["partitions"]) if kv else 0

    async def assigned() -> int:
        current = await assignment(etcd, cluster)
        return 0 if current is None else len(current.owners)

    # Grow: allowed, same topic id, the new partitions assigned.
    kube.merge_patch(path, {"spec": {"partitions": 5}})
    await settle(lambda: _equals(partitions(), 5), what="five partitions")
    grown_kv = await etcd.get(keys.topic_key(cluster, "orders"))
    assert grown_kv is not None and json.loads(grown_kv.value)["topic_id"] == record["topic_id"]
    await settle(lambda: _equals(assigned(), 5), what="new partitions assigned")

    # Shrink: refused and reported; etcd keeps 5.
    kube.merge_patch(path, {"spec": {"partitions": 2}})
    await settle(
        lambda: reason(kube, path, "Degraded") == ("True", "PartitionDecreaseRejected"),
        what="PartitionDecreaseRejected",
    )
    assert await partitions() == 5

    # Delete: the record, partition states and leases go.
    await etcd.put(keys.partition_state_key(cluster, "orders", 0), b"{}")
    await etcd.put(keys.partition_lease_key(cluster, "orders", 0), b"1")
    kube.kubectl("delete", "kafscaletopic", "orders", "-n", ns, "--wait=false")
    await settle(lambda: kube.get(path) is None, what="topic deleted")
    assert await etcd.get(keys.topic_key(cluster, "orders")) is None
    assert await etcd.get_prefix(keys.partition_states_prefix(cluster, "orders")) == []
    assert await etcd.get_prefix(keys.partition_leases_prefix(cluster, "orders")) == []


async def test_topic_waits_for_its_cluster(
    kube_cluster: KubeCluster, kube_namespace: str, real_operator: Any
) -> None:
    ns, kube = kube_namespace, kube_cluster
    spec = {"clusterRef": "missing", "partitions": 1}
    kube.create(TOPICS.format(ns=ns), topic_manifest("orders", ns, spec))
    await settle(
        lambda: (
            reason(kube, f"{TOPICS.format(ns=ns)}/orders", "Ready") == ("False", "ClusterNotFound")
        ),
        what="ClusterNotFound",
    )


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def test_while_a_switch_to_managed_etcd_is_refused_the_operator_keeps_to_the_brokers_etcd(
    kube_cluster: KubeCluster,
    kube_namespace: str,
    real_operator: Any,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    """``etcd.mode`` External → Managed is refused (the brokers keep the external etcd, which
    holds the cluster's metadata); a topic created meanwhile goes where the brokers read
    topics, not to the managed etcd the spec now names (which does not exist)."""
    ns, kube = kube_namespace, kube_cluster
    path = f"{CLUSTERS.format(ns=ns)}/demo"
    kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, external(etcd_server)))
    await settle(lambda: status_of(kube, path).get("observedGeneration") == 1, what="reconciled")
    kube.merge_patch(path, {"spec": {"etcd": {"mode": "Managed", "replicas": 1}}})

    def refused() -> str | None:
        found = condition_of(kube.get(path), "Degraded") or ("", "", "")
        return found[2] if found[1] == "ImmutableFieldChanged" else None

    message = await settle(refused, what="the switch refused")
    assert "etcd.mode cannot change after creation: was External, now Managed" in message
    assert kube.get(f"/apis/apps/v1/namespaces/{ns}/statefulsets/demo-etcd") is None
    spec = {"clusterRef": "demo", "partitions": 2}
    kube.create(TOPICS.format(ns=ns), topic_manifest("orders", ns, spec))
    record = await settle(
        lambda: etcd.get(keys.topic_key(f"{ns}.demo", "orders")), what="the topic in etcd"
    )
    assert json.loads(record.value)["partitions"] == 2
