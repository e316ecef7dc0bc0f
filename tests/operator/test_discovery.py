"""Pure: what the operator creates on a server that serves less (Kubernetes 1.20 and the like)."""

from __future__ import annotations

import uuid

import pytest

from kafscale.operator import crd_gen, manifests
from kafscale.operator.discovery import (
    ASSUME_EVERYTHING,
    ServerCapabilities,
    capabilities_from,
    cel_rules_kept,
    fit_to_server,
    newly_served,
    parse_version,
    refresh_due,
)
from kafscale.operator.models import ClusterRef, parse_cluster_spec

pytestmark = pytest.mark.unit

REF = ClusterRef(namespace="kafka", name="demo", uid=str(uuid.uuid4()), generation=1)
# What a 1.20.2 API server answers (abridged to what matters).
VERSION_1_20 = {"major": "1", "minor": "20", "gitVersion": "v1.20.2"}
CORE = {"versions": ["v1"]}
GROUPS_1_20 = {
    "groups": [
        {"name": "apps", "versions": [{"groupVersion": "apps/v1"}]},
        {"name": "policy", "versions": [{"groupVersion": "policy/v1beta1"}]},
        {"name": "networking.k8s.io", "versions": [{"groupVersion": "networking.k8s.io/v1"}]},
        {
            "name": "autoscaling",
            "versions": [
                {"groupVersion": "autoscaling/v1"},
                {"groupVersion": "autoscaling/v2beta2"},
            ],
        },
    ]
}


def spec(**extra: object) -> object:
    return parse_cluster_spec({"storage": {"bucket": "bucket-1"}, **extra})


def test_on_1_20_pdbs_hpas_and_the_pvc_retention_field_are_left_out() -> None:
    old = capabilities_from(VERSION_1_20, CORE, GROUPS_1_20, crd=None)
    cluster = spec(
        autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 4}, deletionPolicy="Delete"
    )
    wanted = manifests.build_cluster_objects(REF, cluster)  # type: ignore[arg-type]
    kept, left_out = fit_to_server(wanted, old)
    kinds = {m["kind"] for m in kept}
    assert "PodDisruptionBudget" not in kinds and "HorizontalPodAutoscaler" not in kinds
    assert {"Deployment", "StatefulSet", "ConfigMap", "Service"} <= kinds
    statefulset = next(m for m in kept if m["kind"] == "StatefulSet")
    assert "persistentVolumeClaimRetentionPolicy" not in statefulset["spec"]
    assert any(
        "persistentVolumeClaimRetentionPolicy" in m["spec"]
        for m in wanted
        if m["kind"] == "StatefulSet"
    )
    assert "HorizontalPodAutoscaler demo-broker (autoscaling/v2 is not served)" in left_out
    assert "PodDisruptionBudget demo-broker (policy/v1 is not served)" in left_out
    assert len(left_out) == 4  # two PDBs, the HPA, the StatefulSet field


def test_a_current_server_gets_everything() -> None:
    groups = {
        "groups": [
            {"versions": [{"groupVersion": v}]}
            for v in ("apps/v1", "policy/v1", "autoscaling/v2", "networking.k8s.io/v1")
        ]
    }
    current = capabilities_from(
        {"major": "1", "minor": "31+", "gitVersion": "v1.31.2-eks-1"},
        CORE,
        groups,
        crd=crd_gen.cluster_crd(),
    )
    wanted = manifests.build_cluster_objects(REF, spec())  # type: ignore[arg-type]
    assert fit_to_server(wanted, current) == (wanted, [])
    assert fit_to_server(wanted, ASSUME_EVERYTHING) == (wanted, [])


def test_dropped_validation_rules_are_reported() -> None:
    crd = crd_gen.cluster_crd()
    assert cel_rules_kept(crd) is True
    stripped = {"spec": {"versions": [{"schema": {"openAPIV3Schema": {"type": "object"}}}]}}
    assert cel_rules_kept(stripped) is False
    assert cel_rules_kept(None) is None
    old = capabilities_from(VERSION_1_20, CORE, GROUPS_1_20, crd=stripped)
    _, left_out = fit_to_server([], old)
    assert left_out == ["CRD validation rules (not enforced by this server; the operator checks)"]


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"major": "1", "minor": "20"}, (1, 20)),
        ({"major": "1", "minor": "27+"}, (1, 27)),
        ({"major": "", "minor": ""}, None),
        ({}, None),
    ],
)
def test_parse_version(info: dict[str, str], expected: tuple[int, int] | None) -> None:
    assert parse_version(info) == expected


def test_capabilities_are_read_again_after_the_interval() -> None:
    assert refresh_due(0.0, 5.0, 60.0)  # never read
    assert not refresh_due(100.0, 159.0, 60.0)
    assert refresh_due(100.0, 160.0, 60.0)
    old = ServerCapabilities(group_versions=frozenset({"v1", "apps/v1"}))
    new = ServerCapabilities(
        group_versions=frozenset({"v1", "apps/v1", "monitoring.coreos.com/v1"})
    )
    assert newly_served(old, new) == ["monitoring.coreos.com/v1"]
    assert newly_served(new, old) == []
