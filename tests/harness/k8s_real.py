"""The operator on the real API server, as a user installs it: the Helm chart, its RBAC.

* ``kafscale_chart`` (session): ``helm install`` of ``charts/kafscale`` (CRDs, ServiceAccount,
  RBAC, the operator Deployment, whose pod stays Pending: there is no kubelet) and a kubeconfig
  holding the token of the chart's ServiceAccount;
* ``real_operator`` (function): the operator in-process, authenticated as that ServiceAccount,
  so whatever the chart's RBAC does not grant fails here as it would in a cluster;
* ``kube_namespace`` (function): a fresh namespace, removed afterwards.

Helpers stand in for what is missing without nodes: ``mark_ready`` reports a pod ready (and
binds it to a node object first if asked), as scheduler and kubelet would.
"""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from harness.k8s_operator import eventually, operator_thread
from harness.k8s_tools import run_helm
from harness.kube_apiserver import ApiError, KubeCluster
from harness.s3 import S3Endpoint
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.operator.settings import OperatorSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASE = "kafscale"
OPERATOR_NAMESPACE = "kafscale-system"
CLUSTERS = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaleclusters"
TOPICS = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaletopics"
USERS = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaleusers"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments"
PODS = "/api/v1/namespaces/{ns}/pods"
SECRETS = "/api/v1/namespaces/{ns}/secrets"
SERVICES = "/api/v1/namespaces/{ns}/services"
CONFIG_MAPS = "/api/v1/namespaces/{ns}/configmaps"
STATEFULSETS = "/apis/apps/v1/namespaces/{ns}/statefulsets"
MANAGED = {"storage": {"bucket": "bucket-1"}, "etcd": {"replicas": 1, "storageSize": "1Gi"}}
"""A cluster spec's storage and a one-member managed etcd: what a test adds its own fields to."""


@dataclass(frozen=True)
class InstalledChart:
    namespace: str
    service_account: str
    token: str
    kubeconfig: Path


@pytest.fixture(scope="session")
def kafscale_chart(kube_cluster: KubeCluster) -> InstalledChart:
    result = run_helm(
        "--kubeconfig",
        str(kube_cluster.admin_kubeconfig),
        "install",
        RELEASE,
        str(REPO_ROOT / "charts" / "kafscale"),
        "--namespace",
        OPERATOR_NAMESPACE,
        "--create-namespace",
        timeout_s=300,
    )
    assert result.returncode == 0, f"helm install failed:\n{result.stdout}{result.stderr}"
    (deployment,) = kube_cluster.get(DEPLOYMENTS.format(ns=OPERATOR_NAMESPACE))["items"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = kube_cluster.service_account_token(OPERATOR_NAMESPACE, account, timeout_s=60)
    kubeconfig = kube_cluster.kubeconfig_for(token, "operator", OPERATOR_NAMESPACE)
    return InstalledChart(OPERATOR_NAMESPACE, account, token, kubeconfig)


def operator_settings(chart: InstalledChart, **overrides: Any) -> OperatorSettings:
    values: dict[str, Any] = {
        "kubeconfig": chart.kubeconfig,
        "status_interval_s": 0.5,
        "rebalance_interval_s": 1.0,
        "resync_interval_s": 3600.0,
        "etcd_timeout_s": 2.0,
        "api_timeout_s": 10.0,
        "s3_timeout_s": 10.0,
        "liveness_endpoint": None,
        "metrics_port": 0,  # no /metrics unless a test asks (never the fixed default port)
    }
    values.update(overrides)
    return OperatorSettings(**values)


@pytest_asyncio.fixture
async def real_operator(kafscale_chart: InstalledChart) -> AsyncIterator[OperatorSettings]:
    async with operator_thread(operator_settings(kafscale_chart)) as settings:
        yield settings


@pytest.fixture
def kube_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_cluster.create_namespace(name)
    try:
        yield name
    finally:
        release_finalizers(kube_cluster, name)
        kube_cluster.delete(f"/api/v1/namespaces/{name}")


def release_finalizers(kube: KubeCluster, namespace: str) -> None:
    """Let the namespace go even if a test stopped the operator before its finalizers ran."""
    for plural in (CLUSTERS, TOPICS, USERS):
        path = plural.format(ns=namespace)
        for item in (kube.get(path) or {}).get("items") or []:
            name = item["metadata"]["name"]
            try:
                kube.merge_patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
            except ApiError as exc:
                if exc.status != 404:
                    raise


def _b64(value: str) -> str:
    return base64.b64encode(value.encode()).decode()


def cluster_manifest(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def external_spec(
    etcd_server: EmbeddedEtcd, s3: S3Endpoint, bucket: str, **extra: Any
) -> dict[str, Any]:
    return {
        "storage": {"bucket": bucket, "endpoint": s3.url, "credentialsSecret": {"name": "s3"}},
        "etcd": {"mode": "External", "endpoints": [etcd_server.client_url]},
        **extra,
    }


def secret_files(kube: KubeCluster, ns: str, name: str) -> dict[str, bytes] | None:
    """A Secret's keys and decoded values (None while it does not exist)."""
    secret = kube.get(f"{SECRETS.format(ns=ns)}/{name}")
    if secret is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def write_files(directory: Path, files: dict[str, bytes]) -> Path:
    """Files named by ``files``' keys in ``directory``, as a Secret mounted there would be."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, data in files.items():
        (directory / key).write_bytes(data)
    return directory


def create_s3_secret(kube: KubeCluster, namespace: str, s3: S3Endpoint) -> None:
    kube.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "metadata": {"name": "s3"},
            "data": {
                "AWS_ACCESS_KEY_ID": _b64(s3.access_key_id),
                "AWS_SECRET_ACCESS_KEY": _b64(s3.secret_access_key),
            },
        },
    )


async def settle(probe: Any, *, what: str = "condition", timeout_s: float = 90.0) -> Any:
    """``eventually`` with room for a loaded machine: a bound on waiting, not a timing claim."""
    return await eventually(probe, timeout_s=timeout_s, what=what)


# --- standing in for scheduler and kubelet ---------------------------------------------------


def pods_of(kube: KubeCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    listed = kube.request("GET", PODS.format(ns=namespace), params={"labelSelector": selector})
    return list(listed.get("items") or [])


def live_pods(kube: KubeCluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return [
        p for p in pods_of(kube, namespace, selector) if not p["metadata"].get("deletionTimestamp")
    ]


def mark_ready(
    kube: KubeCluster, namespace: str, pod: dict[str, Any], *, bind: bool = False
) -> None:
    """Report ``pod`` running and ready, as its kubelet would.

    ``bind``: first bind it to the node without kubelet, so that a graceful delete leaves it
    terminating (an unbound pod is deleted at once; so is one the garbage collector removes).
    """
    name = pod["metadata"]["name"]
    if bind and not pod["spec"].get("nodeName"):
        kube.bind_pod(namespace, name, kube.ensure_node())
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    kube.merge_patch(
        f"{PODS.format(ns=namespace)}/{name}/status",
        {"status": {"phase": "Running", "conditions": conditions}},
    )


def condition_of(obj: dict[str, Any] | None, type_: str) -> tuple[str, str, str] | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"], c.get("message", "")
    return None


def events_of(
    kube: KubeCluster,
    namespace: str,
    name: str,
    kind: str = "KafScaleCluster",
    uid: str | None = None,
) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event posted on one object, oldest first (with
    ``uid``: on that object only, not on another of its name deleted before)."""
    items = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    mine = [
        e
        for e in items
        if e["involvedObject"].get("kind") == kind
        and e["involvedObject"].get("name") == name
        and uid in (None, e["involvedObject"].get("uid"))
    ]
    mine.sort(key=lambda e: (e.get("firstTimestamp") or "", e["metadata"]["creationTimestamp"]))
    return [(e["type"], e["reason"], e.get("message", "")) for e in mine]


def reasons_of(kube: KubeCluster, namespace: str, name: str) -> list[str]:
    return [reason for _, reason, _ in events_of(kube, namespace, name)]
