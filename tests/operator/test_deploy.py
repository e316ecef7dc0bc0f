"""deploy/: the samples validate, and the Argo CD health checks say what they should.

The health checks run in a real Lua 5.1 interpreter (lupa), the Lua version of Argo CD's
gopher-lua, on resources shaped as the operator writes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from harness.cluster_specs import external_etcd

from kafscale.operator.models import ClusterRef, parse_cluster_spec
from kafscale.operator.status import (
    ClusterObservation,
    compute_cluster_status,
    compute_user_status,
)

pytestmark = pytest.mark.operator

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ARGOCD = DEPLOY / "argocd"
K8S_VERSION = "1.32.0"
BUILTIN_GROUPS = ("v1", "apps/", "autoscaling/", "policy/", "rbac.authorization.k8s.io/")


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return docs


def test_builtin_manifests_validate_strictly() -> None:
    checked = 0
    for doc in documents():
        if doc["apiVersion"].startswith(BUILTIN_GROUPS):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            checked += 1
    assert checked >= 3  # Secret, HPA, argocd-cm


def test_hpa_targets_the_cluster_scale_subresource() -> None:
    hpa = next(d for d in documents() if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "kafscale.io/v1alpha1",
        "kind": "KafScaleCluster",
        "name": "demo",
    }


def test_argocd_config_map_embeds_the_lua_files() -> None:
    cm = yaml.safe_load((ARGOCD / "argocd-cm-health.yaml").read_text())
    data = cm["data"]
    assert (
        data["resource.customizations.health.kafscale.io_KafScaleCluster"]
        == (ARGOCD / "health-kafscalecluster.lua").read_text()
    )
    assert (
        data["resource.customizations.health.kafscale.io_KafScaleTopic"]
        == (ARGOCD / "health-kafscaletopic.lua").read_text()
    )
    assert (
        data["resource.customizations.health.kafscale.io_KafScaleUser"]
        == (ARGOCD / "health-kafscaleuser.lua").read_text()
    )


def test_argocd_applications() -> None:
    apps = [d for d in documents() if d["kind"] == "Application"]
    assert {a["spec"]["source"]["path"] for a in apps} == {"deploy", "charts/kafscale"}
    for app in apps:
        assert app["apiVersion"] == "argoproj.io/v1alpha1"
        assert app["spec"]["destination"]["server"] == "https://kubernetes.default.svc"


def health(script: str, obj: dict[str, Any]) -> tuple[str, str]:
    lupa = pytest.importorskip("lupa.lua51")
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            return lua.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([to_lua(v) for v in value])
        return value

    run = lua.eval(f"function(obj)\n{(ARGOCD / script).read_text()}\nend")
    result = run(to_lua(obj))
    return str(result["status"]), str(result["message"])


def cluster_object(generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "demo", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    return obj


def operator_status(deployment: dict[str, Any] | None, **observed: Any) -> dict[str, Any]:
    ref = ClusterRef(name="demo", namespace="kafka", uid="u", generation=2)
    spec = parse_cluster_spec(external_etcd("http://e:1"))
    status = compute_cluster_status(
        ref,
        spec,
        ClusterObservation(broker_deployment=deployment, **observed),
        [],
        now="2026-01-01T00:00:00Z",
    )
    body: dict[str, Any] = status.to_api()
    return body


READY_DEPLOYMENT = {
    "metadata": {"generation": 1},
    "spec": {"replicas": 3},
    "status": {"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3},
}


@pytest.mark.parametrize(
    ("generation", "status", "expected"),
    [
        (1, None, "Progressing"),
        (3, operator_status(READY_DEPLOYMENT), "Progressing"),  # status is for generation 2
        (2, operator_status(READY_DEPLOYMENT), "Healthy"),
        (2, operator_status(None), "Progressing"),
        (2, operator_status(READY_DEPLOYMENT, apply_error="forbidden"), "Degraded"),
    ],
)
def test_cluster_health(generation: int, status: dict[str, Any] | None, expected: str) -> None:
    state, message = health("health-kafscalecluster.lua", cluster_object(generation, status))
    assert state == expected, message


def test_cluster_scaled_to_zero_is_suspended() -> None:
    status = operator_status(READY_DEPLOYMENT)
    status["conditions"][0] = {
        **status["conditions"][0],
        "status": "False",
        "reason": "ScaledToZero",
    }
    state, _ = health("health-kafscalecluster.lua", cluster_object(2, status))
    assert state == "Suspended"


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([{"type": "Ready", "status": "True", "reason": "TopicReady", "message": "3"}], "Healthy"),
        (
            [
                {"type": "Ready", "status": "True", "reason": "TopicReady"},
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "PartitionDecreaseRejected",
                    "message": "no",
                },
            ],
            "Degraded",
        ),
        (
            [{"type": "Ready", "status": "False", "reason": "ClusterNotFound", "message": "x"}],
            "Progressing",
        ),
    ],
)
def test_topic_health(conditions: list[dict[str, Any]], expected: str) -> None:
    obj = {
        "metadata": {"generation": 1},
        "status": {"observedGeneration": 1, "conditions": conditions},
    }
    state, _ = health("health-kafscaletopic.lua", obj)
    assert state == expected


def user_status(verdict: tuple[bool, str, str], generation: int = 1) -> dict[str, Any]:
    """A KafScaleUser's status as the operator writes it."""
    status = compute_user_status(
        generation,
        [],
        now="2026-01-01T00:00:00Z",
        ready=verdict,
        username="alice",
        secret="alice",
        acls=2,
    )
    body: dict[str, Any] = status.to_api()
    return body


@pytest.mark.parametrize(
    ("generation", "status", "expected"),
    [
        (1, None, "Progressing"),
        (2, user_status((True, "UserReady", "ok")), "Progressing"),  # status is for generation 1
        (1, user_status((True, "UserReady", "ok")), "Healthy"),
        (
            1,
            user_status((False, "ClusterNotFound", "KafScaleCluster demo not found")),
            "Progressing",
        ),
        (1, user_status((False, "EtcdUnavailable", "timeout")), "Progressing"),
        (1, user_status((False, "InvalidAcl", "prefixed *")), "Degraded"),
        (1, user_status((False, "SecretConflict", "not ours")), "Degraded"),
    ],
)
def test_user_health(generation: int, status: dict[str, Any] | None, expected: str) -> None:
    obj: dict[str, Any] = {"metadata": {"name": "alice", "generation": generation}, "spec": {}}
    if status is not None:
        obj["status"] = status
    state, _ = health("health-kafscaleuser.lua", obj)
    assert state == expected
