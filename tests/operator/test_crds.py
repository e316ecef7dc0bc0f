"""The CRDs: generated from the models without drift, valid, and enforcing the schema."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from kafscale.operator import crd_gen
from kafscale.operator.models import parse_cluster_spec, parse_topic_spec, parse_user_spec

pytestmark = pytest.mark.operator

K8S_VERSION = "1.32.0"
REPO = Path(__file__).resolve().parents[2]


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def validator(crd: dict[str, Any]) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(crd_gen.crd_schema(crd))


def test_generated_crds_match_the_committed_files() -> None:
    stale = crd_gen.drifted()
    assert not stale, f"run `python -m kafscale.operator.crd_gen`; out of date: {stale}"


def test_chart_crds_are_the_generated_ones() -> None:
    for name, text in crd_gen.render_all().items():
        assert (REPO / "charts" / "kafscale" / "crds" / name).read_text() == text


@pytest.mark.parametrize("crd", [crd_gen.cluster_crd(), crd_gen.topic_crd(), crd_gen.user_crd()])
def test_crds_validate_strictly(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, K8S_VERSION, strict=True)


def test_cluster_crd_scale_subresource_and_columns() -> None:
    version = crd_gen.cluster_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.brokers.replicas",
        "statusReplicasPath": ".status.brokers.replicas",
        "labelSelectorPath": ".status.brokers.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Ready"] == ".status.brokers.readyReplicas"
    # The operator's view: with spec.autoscaling.enabled the HPA decides, not the spec.
    assert columns["Desired"] == ".status.brokers.desired"
    assert columns["Bootstrap"] == ".status.bootstrap"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _undescribed_fields(node: dict[str, Any], path: str = "") -> list[str]:
    """Named fields (at any depth, list items' fields included) without a description.

    ``metadata`` excepted: the API server refuses a CRD that describes it.
    """
    missing = [] if "description" in node or path == ".metadata" else [path or "<root>"]
    for name, child in (node.get("properties") or {}).items():
        missing += _undescribed_fields(child, f"{path}.{name}")
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        missing += [m for m in _undescribed_fields(items, f"{path}[]") if m != f"{path}[]"]
    return missing


@pytest.mark.parametrize("crd", [crd_gen.cluster_crd(), crd_gen.topic_crd(), crd_gen.user_crd()])
def test_kubectl_explain_has_a_description_for_the_kind_and_every_field(
    crd: dict[str, Any],
) -> None:
    """`kubectl explain kafscalecluster` showed `DESCRIPTION: <empty>`, as did `.spec`."""
    schema = crd_gen.crd_schema(crd)
    assert _undescribed_fields(schema) == []
    kind = crd["spec"]["names"]["kind"]
    short = crd["spec"]["names"]["shortNames"][0]
    assert f"short name {short}" in schema["description"], kind


def _no_forbidden_keywords(node: Any, path: str = "") -> list[str]:
    """Structural-schema rules: no $ref, no null types, no additionalProperties: false."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$defs", "title", "const", "propertyNames"):
                found.append(f"{path}/{key}")
            if key == "type" and value == "null":
                found.append(f"{path}/type=null")
            if key == "additionalProperties" and value is False:
                found.append(f"{path}/additionalProperties=false")
            if key == "anyOf" and not node.get("x-kubernetes-int-or-string"):
                found.append(f"{path}/anyOf")
            found += _no_forbidden_keywords(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found += _no_forbidden_keywords(item, f"{path}/{i}")
    return found


@pytest.mark.parametrize("crd", [crd_gen.cluster_crd(), crd_gen.topic_crd(), crd_gen.user_crd()])
def test_schemas_are_structural(crd: dict[str, Any]) -> None:
    schema = crd_gen.crd_schema(crd)
    assert _no_forbidden_keywords(schema) == []
    assert schema["properties"]["status"]["x-kubernetes-preserve-unknown-fields"] is True


def test_sample_resources_validate_against_the_schema() -> None:
    cluster_v = validator(crd_gen.cluster_crd())
    topic_v = validator(crd_gen.topic_crd())
    user_v = validator(crd_gen.user_crd())
    seen = 0
    for path in (REPO / "deploy").glob("*.yaml"):
        for doc in load_all(path):
            if doc.get("kind") == "KafScaleCluster":
                cluster_v.validate(doc)
                parse_cluster_spec(doc["spec"])
                seen += 1
            elif doc.get("kind") == "KafScaleTopic":
                topic_v.validate(doc)
                parse_topic_spec(doc["spec"])
                seen += 1
            elif doc.get("kind") == "KafScaleUser":
                user_v.validate(doc)
                parse_user_spec(doc["spec"])
                seen += 1
    assert seen >= 3


GOOD_CLUSTER: dict[str, Any] = {
    "apiVersion": "kafscale.io/v1alpha1",
    "kind": "KafScaleCluster",
    "metadata": {"name": "x"},
    "spec": {"storage": {"bucket": "bucket-1"}},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "brokers", "replicas"), -1),
        (("spec", "brokers", "replicas"), "three"),
        (("spec", "deletionPolicy"), "Forget"),
        (("spec", "etcd", "mode"), "Embedded"),
        (("spec", "etcd", "replicas"), 9),
        (("spec", "storage", "bucket"), "b"),
        (("spec", "storage", "endpoint"), "s3.example.com"),
        (("spec", "proxy", "serviceType"), "Ingress"),
        (("spec", "clusterName"), "Upper_Case"),
        (("spec", "brokers", "unknownField"), 1),
    ],
)
def test_schema_rejects_bad_clusters(path: tuple[str, ...], value: Any) -> None:
    doc = copy.deepcopy(GOOD_CLUSTER)
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    schema = crd_gen.crd_schema(crd_gen.cluster_crd())
    # The API server prunes unknown fields; jsonschema needs additionalProperties for that check.
    if path[-1] == "unknownField":
        assert path[-1] not in schema["properties"]["spec"]["properties"]["brokers"]["properties"]
        return
    with pytest.raises(jsonschema.ValidationError):
        validator(crd_gen.cluster_crd()).validate(doc)


def test_schema_requires_storage_and_topic_cluster_ref() -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator(crd_gen.cluster_crd()).validate({**GOOD_CLUSTER, "spec": {}})
    with pytest.raises(jsonschema.ValidationError):
        validator(crd_gen.topic_crd()).validate({"spec": {"partitions": 3}})
    with pytest.raises(jsonschema.ValidationError):
        validator(crd_gen.topic_crd()).validate({"spec": {"clusterRef": "x", "partitions": 0}})


def test_cel_rules_are_declared() -> None:
    spec = crd_gen.crd_schema(crd_gen.cluster_crd())["properties"]["spec"]["properties"]
    etcd_rules = [r["rule"] for r in spec["etcd"]["x-kubernetes-validations"]]
    assert any("External" in rule for rule in etcd_rules)
    auto_rules = [r["rule"] for r in spec["autoscaling"]["x-kubernetes-validations"]]
    assert auto_rules == ["self.minReplicas <= self.maxReplicas"]


def test_models_apply_the_same_rules() -> None:
    with pytest.raises(ValueError, match="External"):
        parse_cluster_spec({"storage": {"bucket": "abc"}, "etcd": {"mode": "External"}})
    with pytest.raises(ValueError, match="minReplicas"):
        parse_cluster_spec(
            {"storage": {"bucket": "abc"}, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}}
        )
    spec = parse_cluster_spec({"storage": {"bucket": "abc"}})
    assert spec.brokers.replicas == 3
    assert spec.deletion_policy == "Retain"
    assert spec.etcd.mode == "Managed"


def test_managed_etcd_replicas_are_odd_and_fixed_after_creation() -> None:
    """A replicas change would start members from a different initial cluster and break etcd:
    the API server refuses it (CEL transition rule), and refuses even counts."""
    schema = crd_gen.crd_schema(crd_gen.cluster_crd())
    replicas = schema["properties"]["spec"]["properties"]["etcd"]["properties"]["replicas"]
    rules = {rule["rule"] for rule in replicas["x-kubernetes-validations"]}
    assert rules == {"self % 2 == 1", "self == oldSelf"}


def _defaults(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, list):
        return [d for i, item in enumerate(node) for d in _defaults(item, f"{path}[{i}]")]
    if not isinstance(node, dict):
        return []
    found = [(path, node["default"])] if "default" in node else []
    return found + [d for k, v in node.items() for d in _defaults(v, f"{path}.{k}")]


@pytest.mark.parametrize("crd", [crd_gen.cluster_crd(), crd_gen.topic_crd()])
def test_no_empty_string_defaults_which_some_servers_refuse(crd: dict[str, Any]) -> None:
    """1.20 built with Go >= 1.18 reads ``default: ''`` as null and refuses the whole CRD."""
    empty = [path for path, value in _defaults(crd_gen.crd_schema(crd)) if value == ""]
    assert not empty


def test_the_storage_prefix_still_defaults_to_empty_in_the_model() -> None:
    spec = parse_cluster_spec({"storage": {"bucket": "bucket-1"}})
    assert spec.storage.prefix == ""


def test_the_etcd_mode_is_fixed_after_creation_where_the_server_enforces_rules() -> None:
    """A switch between the managed etcd and an external one would point the brokers at an
    etcd without the cluster's metadata: from Kubernetes 1.25 the API server refuses the edit
    (CEL transition rule); an older one drops the rule and the operator refuses the switch
    (``immutable.mode_refusals``, tested on 1.20 in ``test_real_changes``)."""
    schema = crd_gen.crd_schema(crd_gen.cluster_crd())
    mode = schema["properties"]["spec"]["properties"]["etcd"]["properties"]["mode"]
    (rule,) = mode["x-kubernetes-validations"]
    assert rule["rule"] == "self == oldSelf"
    assert "cannot change after creation" in rule["message"]
