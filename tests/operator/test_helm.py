"""The Helm chart, with a real helm binary: lint --strict, template, strict validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from harness.k8s_tools import run_helm

from kafscale.operator import crd_gen

pytestmark = pytest.mark.operator

K8S_VERSION = "1.32.0"
CHART = Path(__file__).resolve().parents[2] / "charts" / "kafscale"


def helm(*args: str) -> str:
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def render(*values: str) -> list[dict[str, Any]]:
    flags = [arg for value in values for arg in ("--set", value)]
    out = helm(
        "template",
        "kafscale",
        str(CHART),
        "--namespace",
        "kafscale-system",
        "--include-crds",
        *flags,
    )
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("values", [(), ("watchNamespaces={team-a,team-b}",)])
def test_lint_strict(values: tuple[str, ...]) -> None:
    flags = [arg for value in values for arg in ("--set", value)]
    out = helm("lint", "--strict", str(CHART), *flags)
    assert "0 chart(s) failed" in out


def test_lint_rejects_bad_values() -> None:
    result = run_helm("lint", "--strict", str(CHART), "--set", "image.pullPolicy=Sometimes")
    assert result.returncode != 0


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("watchNamespaces={team-a,team-b}",),
        ("serviceAccount.create=false", "rbac.create=false"),
    ],
)
def test_rendered_manifests_validate_strictly(values: tuple[str, ...]) -> None:
    docs = render(*values)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "CustomResourceDefinition"} <= kinds


def test_crds_in_the_chart_are_the_generated_ones() -> None:
    docs = [d for d in render() if d["kind"] == "CustomResourceDefinition"]
    assert sorted(docs, key=lambda d: d["metadata"]["name"]) == [
        crd_gen.cluster_crd(),
        crd_gen.topic_crd(),
        crd_gen.user_crd(),
    ]


def test_operator_deployment() -> None:
    docs = render("image.tag=dev", "watchNamespaces={team-a}")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/kafscale/kafscale:dev"
    assert container["args"] == ["operator"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["KAFSCALE_OPERATOR_NAMESPACES"] == '["team-a"]'
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    default = next(d for d in render() if d["kind"] == "Deployment")
    assert default["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":0.1.0")


def rules_of(doc: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in doc["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


# Exactly the verbs the operator uses (kopf: list/watch/patch of its resources, patch of their
# status, POST of core Events; the operator: server-side apply = create + patch, delete of what a
# spec no longer wants, get of what it reads by name, and of every kind it makes: it applies
# over or deletes an object only when it is the cluster's). `update` and `list`/`watch` of the
# objects it owns were granted and never used.
EXPECTED_RULES = {
    ("kafscale.io", "kafscaleclusters"): {"get", "list", "watch", "patch"},
    ("kafscale.io", "kafscaletopics"): {"get", "list", "watch", "patch"},
    ("kafscale.io", "kafscaleusers"): {"get", "list", "watch", "patch"},
    ("kafscale.io", "kafscaleclusters/status"): {"patch"},
    ("kafscale.io", "kafscaletopics/status"): {"patch"},
    ("kafscale.io", "kafscaleusers/status"): {"patch"},
    ("kafscale.io", "kafscaleclusters/finalizers"): {"update"},
    ("kafscale.io", "kafscaletopics/finalizers"): {"update"},
    ("kafscale.io", "kafscaleusers/finalizers"): {"update"},
    ("", "configmaps"): {"get", "create", "patch", "delete"},  # get: the brokers' etcd
    # list: a cluster's several objects of a kind (its labels) in one call, not a get per name
    ("", "services"): {"get", "list", "create", "patch", "delete"},
    ("apps", "deployments"): {"get", "list", "create", "patch", "delete"},
    ("apps", "statefulsets"): {"get", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "create", "patch", "delete"},
    ("autoscaling", "horizontalpodautoscalers"): {"get", "create", "patch", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "create", "patch", "delete"},
    ("cert-manager.io", "issuers"): {"get", "list", "create", "patch", "delete"},
    ("cert-manager.io", "certificates"): {"get", "list", "create", "patch", "delete"},
    # get: S3 credentials, certificate and password Secrets by name; list/watch: the Secret
    # watch (a cluster's Secret broken, fixed or deleted is acted on at once).
    ("", "secrets"): {"get", "list", "watch", "create", "patch"},
    ("", "pods"): {"list", "watch"},
    ("", "events"): {"create"},
}


def test_rbac_is_least_privilege() -> None:
    docs = render()
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert rules_of(roles["kafscale-operator"]) == EXPECTED_RULES
    discovery = rules_of(roles["kafscale-operator-discovery"])
    assert discovery == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
        ("", "namespaces"): {"list", "watch"},
    }
    (crd_get,) = [r for r in roles["kafscale-operator-discovery"]["rules"] if "get" in r["verbs"]]
    assert crd_get["resourceNames"] == ["kafscaleclusters.kafscale.io"]
    namespaced = render("watchNamespaces={team-a}")
    (role,) = [d for d in namespaced if d["kind"] == "Role"]
    assert rules_of(role) == EXPECTED_RULES


def test_watched_namespaces_get_roles_not_cluster_roles() -> None:
    docs = render("watchNamespaces={team-a,team-b}")
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_roles = [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"]
    assert cluster_roles == ["kafscale-operator-discovery"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert all(b["subjects"][0]["namespace"] == "kafscale-system" for b in bindings)
