"""The kopf handlers end to end: the operator against the API emulator over HTTP, a real etcd.

Each test creates resources through the API as kubectl would, plays the part of the
controllers the emulator lacks (Deployment status, pods, broker registrations in etcd) and
checks what the operator wrote to the API and to etcd.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from harness.k8s_operator import (
    CLUSTERS,
    TOPICS,
    cluster_body,
    create,
    delete,
    eventually,
    merge_patch,
    topic_body,
)
from harness.kmock_k8s import KubeEmulator, api_request
from harness.s3 import S3Endpoint

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import Etcd

pytestmark = pytest.mark.operator

CLUSTER_RES = "kafscale.io/v1alpha1/kafscaleclusters"
TOPIC_RES = "kafscale.io/v1alpha1/kafscaletopics"
DEPLOYMENTS = "apps/v1/deployments"


def external(etcd_server: EmbeddedEtcd, **extra: Any) -> dict[str, Any]:
    return {
        "storage": {"bucket": "bucket-1"},
        "etcd": {"mode": "External", "endpoints": [etcd_server.client_url]},
        **extra,
    }


def status_of(kube: KubeEmulator, namespace: str, name: str, res: str = CLUSTER_RES) -> Any:
    obj = kube.read(res, namespace, name) or {}
    return obj.get("status") or {}


def condition(status: dict[str, Any], type_: str) -> tuple[str, str] | None:
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


async def make_deployment_ready(kube: KubeEmulator, namespace: str, name: str) -> None:
    """What the Deployment controller would report once every pod is ready."""
    deployment = kube.read(DEPLOYMENTS, namespace, name)
    assert deployment is not None
    replicas = deployment["spec"].get("replicas", 1)
    await kube.set_status(
        DEPLOYMENTS,
        namespace,
        name,
        {
            "observedGeneration": deployment["metadata"]["generation"],
            "replicas": replicas,
            "readyReplicas": replicas,
            "updatedReplicas": replicas,
            "availableReplicas": replicas,
        },
    )


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


async def test_create_applies_objects_and_reports_status(
    kube_api: KubeEmulator, running_operator: Any, namespace: str, etcd_server: EmbeddedEtcd
) -> None:
    created = await create(
        kube_api,
        CLUSTERS.format(ns=namespace),
        cluster_body("demo", namespace, external(etcd_server)),
    )
    uid = created["metadata"]["uid"]
    deployment = await eventually(lambda: kube_api.read(DEPLOYMENTS, namespace, "demo-broker"))
    for res, name in [
        ("v1/configmaps", "demo-config"),
        ("v1/services", "demo-brokers"),
        ("policy/v1/poddisruptionbudgets", "demo-broker"),
    ]:
        # Applied one after another: the Deployment being there does not mean the rest is yet.
        obj = await eventually(
            lambda res=res, name=name: kube_api.read(res, namespace, name), what=f"{res} {name}"
        )
        assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert deployment["spec"]["replicas"] == 3
    assert kube_api.names("apps/v1/statefulsets", namespace) == set()  # external etcd

    # Server-side apply with the operator's field manager.
    applies = [
        r
        for r in kube_api.requests
        if r.method == "PATCH" and r.headers.get("Content-Type") == "application/apply-patch+yaml"
    ]
    assert applies and all(r.params.get("fieldManager") == "kafscale-operator" for r in applies)

    status = await eventually(lambda: status_of(kube_api, namespace, "demo").get("phase"))
    assert status == "Provisioning"
    current = status_of(kube_api, namespace, "demo")
    assert current["observedGeneration"] == 1
    assert current["bootstrap"] == f"demo-brokers.{namespace}.svc:9092"
    assert current["clusterName"] == f"{namespace}.demo"

    await make_deployment_ready(kube_api, namespace, "demo-broker")
    await eventually(lambda: status_of(kube_api, namespace, "demo").get("phase") == "Running")
    ready = status_of(kube_api, namespace, "demo")
    assert condition(ready, "Ready") == ("True", "AllBrokersReady")
    assert condition(ready, "Progressing") == ("False", "ReconcileComplete")
    assert condition(ready, "Degraded") == ("False", "AsExpected")
    assert ready["brokers"]["readyReplicas"] == 3
    assert ready["leases"] == {
        "partitions": 0,
        "owned": 0,
        "unowned": 0,
        "perBroker": {},
        "draining": [],
    }


async def test_update_rolls_config_and_observed_generation(
    kube_api: KubeEmulator, running_operator: Any, namespace: str, etcd_server: EmbeddedEtcd
) -> None:
    path = CLUSTERS.format(ns=namespace)
    await create(kube_api, path, cluster_body("demo", namespace, external(etcd_server)))
    first = await eventually(lambda: kube_api.read(DEPLOYMENTS, namespace, "demo-broker"))
    first_hash = first["spec"]["template"]["metadata"]["annotations"]["kafscale.io/config-hash"]
    await eventually(lambda: status_of(kube_api, namespace, "demo").get("observedGeneration") == 1)

    await merge_patch(
        kube_api, f"{path}/demo", {"spec": {"brokers": {"config": {"log.flush_interval_ms": "25"}}}}
    )
    await eventually(
        lambda: (
            (kube_api.read("v1/configmaps", namespace, "demo-config") or {})
            .get("data", {})
            .get("KAFSCALE_LOG__FLUSH_INTERVAL_MS")
            == "25"
        )
    )
    second = kube_api.read(DEPLOYMENTS, namespace, "demo-broker")
    assert second is not None
    assert (
        second["spec"]["template"]["metadata"]["annotations"]["kafscale.io/config-hash"]
        != first_hash
    )
    await eventually(lambda: status_of(kube_api, namespace, "demo").get("observedGeneration") == 2)

    # Status writes never bump the generation (Argo CD sees no drift from them).
    cr = kube_api.read(CLUSTER_RES, namespace, "demo")
    assert cr is not None and cr["metadata"]["generation"] == 2
    assert cr["spec"] == {
        **external(etcd_server),
        "brokers": {"config": {"log.flush_interval_ms": "25"}},
    }


async def test_invalid_config_is_reported_degraded(
    kube_api: KubeEmulator, running_operator: Any, namespace: str, etcd_server: EmbeddedEtcd
) -> None:
    spec = external(etcd_server, brokers={"config": {"log.flush_interval": "25"}})
    await create(kube_api, CLUSTERS.format(ns=namespace), cluster_body("demo", namespace, spec))
    await eventually(
        lambda: (
            condition(status_of(kube_api, namespace, "demo"), "Degraded") == ("True", "InvalidSpec")
        )
    )
    status = status_of(kube_api, namespace, "demo")
    assert status["phase"] == "Degraded"
    assert "log.flush_interval" in next(
        c["message"] for c in status["conditions"] if c["type"] == "Degraded"
    )
    assert kube_api.read(DEPLOYMENTS, namespace, "demo-broker") is None


async def test_scale_subresource_and_rebalance_on_scale(
    kube_api: KubeEmulator,
    running_operator: Any,
    namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    path = CLUSTERS.format(ns=namespace)
    # (The API server would fill in the schema's default of 3; the emulator does not default.)
    spec = external(etcd_server, brokers={"replicas": 3})
    await create(kube_api, path, cluster_body("demo", namespace, spec))
    cluster = f"{namespace}.demo"
    await eventually(lambda: kube_api.read(DEPLOYMENTS, namespace, "demo-broker"))
    await put_topic(etcd, cluster, "orders", 6)
    for node_id in (1, 2, 3):
        await register_broker(etcd, cluster, node_id, f"demo-broker-{node_id}")

    # The lease balancer writes a balanced assignment over the registered brokers.
    first = await eventually(lambda: assignment(etcd, cluster), what="assignment")
    assert sorted(first.owners.values()) == [1, 1, 2, 2, 3, 3]

    # kubectl scale kafscalecluster/demo --replicas=5 (GET + PATCH on /scale).
    status, scale = await api_request(kube_api, "GET", f"{path}/demo/scale")
    assert status == 200 and scale["spec"]["replicas"] == 3
    status, _ = await api_request(
        kube_api,
        "PATCH",
        f"{path}/demo/scale",
        {"spec": {"replicas": 5}},
        content_type="application/merge-patch+json",
    )
    assert status == 200
    await eventually(
        lambda: (
            (kube_api.read(DEPLOYMENTS, namespace, "demo-broker") or {})["spec"]["replicas"] == 5
        )
    )
    await make_deployment_ready(kube_api, namespace, "demo-broker")
    await eventually(
        lambda: status_of(kube_api, namespace, "demo").get("brokers", {}).get("replicas") == 5
    )
    _, scale = await api_request(kube_api, "GET", f"{path}/demo/scale")
    assert scale["status"]["replicas"] == 5
    assert scale["status"]["selector"].endswith("app.kubernetes.io/component=broker")

    # The new pods register; the assignment moves only what the newcomers must take.
    for node_id in (4, 5):
        await register_broker(etcd, cluster, node_id, f"demo-broker-{node_id}")

    async def spread_over_five() -> Assignment | None:
        current = await assignment(etcd, cluster)
        return current if current and len(set(current.owners.values())) == 5 else None

    second = await eventually(spread_over_five, what="assignment over five brokers")
    assert second.generation > first.generation
    moved = [tp for tp in first.owners if first.owners[tp] != second.owners[tp]]
    assert len(moved) == 2

    status_now = await eventually(
        lambda: (
            status_of(kube_api, namespace, "demo").get("brokers", {}).get("registered") == 5
            and status_of(kube_api, namespace, "demo")
        )
    )
    assert status_now["leases"]["partitions"] == 6
    assert status_now["leases"]["assignmentGeneration"] == second.generation


async def test_pod_termination_drains_its_broker(
    kube_api: KubeEmulator,
    running_operator: Any,
    namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    await create(
        kube_api,
        CLUSTERS.format(ns=namespace),
        cluster_body("demo", namespace, external(etcd_server)),
    )
    cluster = f"{namespace}.demo"
    await eventually(lambda: kube_api.read(DEPLOYMENTS, namespace, "demo-broker"))
    await put_topic(etcd, cluster, "orders", 4)
    leases = {}
    for node_id in (1, 2):
        leases[node_id] = await register_broker(etcd, cluster, node_id, f"demo-broker-{node_id}")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"demo-broker-{node_id}",
                "namespace": namespace,
                "labels": {
                    "app.kubernetes.io/name": "kafscale",
                    "app.kubernetes.io/instance": "demo",
                    "app.kubernetes.io/component": "broker",
                    "app.kubernetes.io/managed-by": "kafscale-operator",
                },
                # Stands in for the kubelet: the pod stays Terminating until released.
                "finalizers": ["test.kafscale.io/kubelet"],
            },
            "spec": {"containers": [{"name": "broker", "image": "kafscale"}]},
        }
        await create(kube_api, f"/api/v1/namespaces/{namespace}/pods", pod)
    before = await eventually(lambda: assignment(etcd, cluster), what="assignment over two brokers")
    assert set(before.owners.values()) == {1, 2}

    # kubectl delete pod demo-broker-2: the pod gets a deletionTimestamp.
    await delete(kube_api, f"/api/v1/namespaces/{namespace}/pods/demo-broker-2")
    draining = await eventually(lambda: etcd.get(keys.draining_key(cluster, 2)), what="draining")
    assert json.loads(draining.value)["reason"].startswith(f"pod {namespace}/demo-broker-2")
    assert draining.lease == leases[2]  # goes away with the broker's session

    async def without_two() -> Assignment | None:
        current = await assignment(etcd, cluster)
        return current if current and set(current.owners.values()) == {1} else None

    after = await eventually(without_two, what="partitions moved off the draining broker")
    assert after.generation > before.generation
    assert kube_api.read("v1/pods", namespace, "demo-broker-2") is not None  # still terminating
    await eventually(
        lambda: status_of(kube_api, namespace, "demo").get("leases", {}).get("draining") == [2]
    )

    # The broker's session ends: its registration and draining mark go with the lease.
    await etcd.revoke_lease(leases[2])
    assert await etcd.get(keys.draining_key(cluster, 2)) is None


async def test_operator_owned_hpa(
    kube_api: KubeEmulator, running_operator: Any, namespace: str, etcd_server: EmbeddedEtcd
) -> None:
    path = CLUSTERS.format(ns=namespace)
    spec = external(etcd_server, autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    await create(kube_api, path, cluster_body("demo", namespace, spec))
    hpa = await eventually(
        lambda: kube_api.read("autoscaling/v2/horizontalpodautoscalers", namespace, "demo-broker")
    )
    assert hpa["spec"]["scaleTargetRef"]["name"] == "demo-broker"
    applied = [
        r.data
        for r in kube_api.requests
        if r.method == "PATCH" and r.url.path.endswith("/deployments/demo-broker")
    ]
    assert applied and all("replicas" not in body["spec"] for body in applied)

    await merge_patch(kube_api, f"{path}/demo", {"spec": {"autoscaling": {"enabled": False}}})
    await eventually(
        lambda: (
            kube_api.read("autoscaling/v2/horizontalpodautoscalers", namespace, "demo-broker")
            is None
        ),
        what="HPA removed",
    )
    deployment = kube_api.read(DEPLOYMENTS, namespace, "demo-broker")
    assert deployment is not None and deployment["spec"]["replicas"] == 3


async def test_managed_etcd_objects(
    kube_api: KubeEmulator, running_operator: Any, namespace: str
) -> None:
    spec = {"storage": {"bucket": "bucket-1"}, "etcd": {"replicas": 3}}
    await create(kube_api, CLUSTERS.format(ns=namespace), cluster_body("demo", namespace, spec))
    await eventually(lambda: kube_api.read("apps/v1/statefulsets", namespace, "demo-etcd"))
    # The operator applies its objects one after another: the brokers' Service may land after
    # the etcd StatefulSet.
    expected_services = {"demo-etcd", "demo-etcd-client", "demo-brokers"}
    await eventually(
        lambda: kube_api.names("v1/services", namespace) >= expected_services,
        what="the three Services",
    )
    assert kube_api.names("v1/services", namespace) == expected_services
    assert kube_api.read("policy/v1/poddisruptionbudgets", namespace, "demo-etcd") is not None
    # etcd is not reachable here (no DNS for the Service): the cluster waits, not degraded.
    await eventually(
        lambda: (
            condition(status_of(kube_api, namespace, "demo"), "Progressing")
            == ("True", "EtcdStarting")
        )
    )
    assert condition(status_of(kube_api, namespace, "demo"), "Degraded") == ("False", "AsExpected")


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
async def test_delete_honours_deletion_policy(
    kube_api: KubeEmulator,
    running_operator: Any,
    namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
    s3_server: S3Endpoint,
    policy: str,
) -> None:
    store = await s3_server.open_store()
    try:
        cluster = f"{namespace}.demo"
        object_key = keys.segment_object_key(cluster, "orders", "tid", 0, 0, 1)
        await store.put(object_key, b"batch")
        other_key = keys.segment_object_key(f"{namespace}.other", "orders", "tid", 0, 0, 1)
        await store.put(other_key, b"batch")
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3", "namespace": namespace},
            "data": {
                "AWS_ACCESS_KEY_ID": _b64(s3_server.access_key_id),
                "AWS_SECRET_ACCESS_KEY": _b64(s3_server.secret_access_key),
            },
        }
        await create(kube_api, f"/api/v1/namespaces/{namespace}/secrets", secret)
        spec = external(etcd_server, deletionPolicy=policy)
        spec["storage"] = {
            "bucket": store.bucket,
            "endpoint": s3_server.url,
            "credentialsSecret": {"name": "s3"},
        }
        path = CLUSTERS.format(ns=namespace)
        await create(kube_api, path, cluster_body("demo", namespace, spec))
        await put_topic(etcd, cluster, "orders", 2)
        await eventually(lambda: kube_api.read(DEPLOYMENTS, namespace, "demo-broker"))
        await eventually(
            lambda: (
                "kafscale.io/finalizer"
                in (kube_api.read(CLUSTER_RES, namespace, "demo") or {})["metadata"].get(
                    "finalizers", []
                )
            )
        )

        await delete(kube_api, f"{path}/demo")
        await eventually(
            lambda: kube_api.read(CLUSTER_RES, namespace, "demo") is None, what="cluster deleted"
        )
        # Owned objects are garbage-collected with their owner.
        assert kube_api.read(DEPLOYMENTS, namespace, "demo-broker") is None
        remaining = await etcd.get_prefix(keys.cluster_prefix(cluster))
        objects = {info.key for info in await store.list("")}
        if policy == "Retain":
            assert [kv.key for kv in remaining] == [keys.topic_key(cluster, "orders")]
            assert object_key in objects
        else:
            assert remaining == []
            assert object_key not in objects
        assert other_key in objects  # never another cluster's data
    finally:
        await store.close()


def _b64(value: str) -> str:
    import base64

    return base64.b64encode(value.encode()).decode()


async def test_topic_lifecycle(
    kube_api: KubeEmulator,
    running_operator: Any,
    namespace: str,
    etcd_server: EmbeddedEtcd,
    etcd: Etcd,
) -> None:
    await create(
        kube_api,
        CLUSTERS.format(ns=namespace),
        cluster_body("demo", namespace, external(etcd_server)),
    )
    cluster = f"{namespace}.demo"
    await register_broker(etcd, cluster, 1, "demo-broker-1")
    path = TOPICS.format(ns=namespace)
    await create(
        kube_api,
        path,
        topic_body(
            "orders",
            namespace,
            {"clusterRef": "demo", "partitions": 3, "configs": {"retention.ms": "60000"}},
        ),
    )

    record_kv = await eventually(lambda: etcd.get(keys.topic_key(cluster, "orders")))
    record = json.loads(record_kv.value)
    assert record["partitions"] == 3 and record["configs"] == {"retention.ms": "60000"}
    assert len(record["topic_id"]) == 32
    await eventually(
        lambda: status_of(kube_api, namespace, "orders", TOPIC_RES).get("phase") == "Ready"
    )
    assert status_of(kube_api, namespace, "orders", TOPIC_RES)["topicId"] == record["topic_id"]
    first = await eventually(lambda: assignment(etcd, cluster))
    assert len(first.owners) == 3

    # Grow: allowed, same topic id.
    await merge_patch(kube_api, f"{path}/orders", {"spec": {"partitions": 5}})

    async def partitions() -> int:
        kv = await etcd.get(keys.topic_key(cluster, "orders"))
        return int(json.loads(kv.value)["partitions"]) if kv else 0

    await eventually(lambda: _equals(partitions(), 5))
    grown_kv = await etcd.get(keys.topic_key(cluster, "orders"))
    assert grown_kv is not None
    grown = json.loads(grown_kv.value)
    assert grown["topic_id"] == record["topic_id"]
    await eventually(lambda: _assigned(etcd, cluster, 5), what="new partitions assigned")

    # Shrink: refused and reported; etcd keeps 5.
    await merge_patch(kube_api, f"{path}/orders", {"spec": {"partitions": 2}})
    await eventually(
        lambda: (
            condition(status_of(kube_api, namespace, "orders", TOPIC_RES), "Degraded")
            == ("True", "PartitionDecreaseRejected")
        )
    )
    assert await partitions() == 5

    # Delete: the record, partition states and leases go.
    await etcd.put(keys.partition_state_key(cluster, "orders", 0), b"{}")
    await etcd.put(keys.partition_lease_key(cluster, "orders", 0), b"1")
    await delete(kube_api, f"{path}/orders")
    await eventually(lambda: kube_api.read(TOPIC_RES, namespace, "orders") is None)
    assert await etcd.get(keys.topic_key(cluster, "orders")) is None
    assert await etcd.get_prefix(keys.partition_states_prefix(cluster, "orders")) == []
    assert await etcd.get_prefix(keys.partition_leases_prefix(cluster, "orders")) == []


async def test_topic_waits_for_its_cluster(
    kube_api: KubeEmulator, running_operator: Any, namespace: str
) -> None:
    await create(
        kube_api,
        TOPICS.format(ns=namespace),
        topic_body("orders", namespace, {"clusterRef": "missing", "partitions": 1}),
    )
    await eventually(
        lambda: (
            condition(status_of(kube_api, namespace, "orders", TOPIC_RES), "Ready")
            == ("False", "ClusterNotFound")
        )
    )


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _assigned(etcd: Etcd, cluster: str, count: int) -> bool:
    current = await assignment(etcd, cluster)
    return current is not None and len(current.owners) == count
