"""The spec changes a managed etcd cannot take, decided against its live StatefulSet (pure).

Kubernetes 1.20 drops the CRD's transition rules and refuses any change of a StatefulSet's
claim templates (422): the operator decides what to keep and what to say.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from harness.cluster_specs import REF, cluster_spec

from kafscale.operator import immutable, manifest_config, manifest_etcd
from kafscale.operator.immutable import (
    apply_summary,
    config_endpoints,
    etcd_refusals,
    keep_live_claims,
    mode_refusals,
    refusal_message,
)
from kafscale.operator.manifest_config import ETCD_ENDPOINTS_KEY
from kafscale.operator.models import parse_cluster_spec

pytestmark = pytest.mark.operator


def statefulset(**etcd: Any) -> dict[str, Any]:
    spec = parse_cluster_spec(cluster_spec(etcd={"replicas": 3, **etcd}))
    built: dict[str, Any] = manifest_etcd.build_etcd_statefulset(REF, spec)
    return built


def as_live(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: the same fields plus the ones it fills in."""
    live: dict[str, Any] = json.loads(json.dumps(manifest))
    for claim in live["spec"]["volumeClaimTemplates"]:
        claim["spec"]["volumeMode"] = "Filesystem"
        claim["status"] = {"phase": "Pending"}
    return live


def test_an_unchanged_or_new_statefulset_refuses_nothing() -> None:
    desired = statefulset(storageSize="1Gi")
    assert etcd_refusals(desired, None) == []
    assert etcd_refusals(None, as_live(desired)) == []
    assert etcd_refusals(desired, as_live(desired)) == []
    # The server may write a quantity another way: the same size is no change.
    assert etcd_refusals(statefulset(storageSize="1024Mi"), as_live(desired)) == []
    assert refusal_message([]) is None


def test_a_changed_storage_size_keeps_the_live_claim_and_says_what_to_do() -> None:
    live = as_live(statefulset(storageSize="1Gi"))
    desired = statefulset(storageSize="2Gi", image="quay.io/coreos/etcd:v3.5.18")
    (refusal,) = etcd_refusals(desired, live)
    assert refusal.field == "etcd.storageSize" and not refusal.whole_cluster
    message = refusal_message([refusal]) or ""
    assert message.startswith("etcd.storageSize cannot change after creation: was 1Gi, now 2Gi;")
    assert "set it back" in message and immutable.DOCS in message
    assert not immutable.blocks_cluster([refusal])
    kept = keep_live_claims(desired, live)
    (claim,) = kept["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"] == {"storage": "1Gi"}
    assert "status" not in claim and "volumeMode" not in claim["spec"]  # not ours to own
    # Everything else of the StatefulSet is still applied (a new etcd image rolls out).
    assert kept["spec"]["template"] == desired["spec"]["template"]
    assert etcd_refusals(kept, live) == []


def test_a_changed_storage_class_is_refused_and_the_live_one_kept() -> None:
    live = as_live(statefulset(storageClassName="fast"))
    (refusal,) = etcd_refusals(statefulset(), live)
    assert (refusal.field, refusal.was, refusal.now) == (
        "etcd.storageClassName",
        "fast",
        immutable.DEFAULT_CLASS,
    )
    kept = keep_live_claims(statefulset(), live)
    assert kept["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    unset = as_live(statefulset())
    kept = keep_live_claims(statefulset(storageClassName="fast"), unset)
    assert "storageClassName" not in kept["spec"]["volumeClaimTemplates"][0]["spec"]


@pytest.mark.parametrize(
    ("before", "after", "field", "was", "now"),
    [
        ({"replicas": 3}, {"replicas": 5}, "etcd.replicas", "3", "5"),
        ({"tls": False}, {"tls": True}, "etcd.tls", "false", "true"),
        ({"tls": True}, {"tls": False}, "etcd.tls", "true", "false"),
    ],
)
def test_a_changed_member_list_or_scheme_blocks_the_whole_cluster(
    before: dict[str, Any], after: dict[str, Any], field: str, was: str, now: str
) -> None:
    """The brokers' etcd endpoints would change with it: nothing may be applied."""
    refusals = etcd_refusals(statefulset(**after), as_live(statefulset(**before)))
    (refusal,) = [r for r in refusals if r.field == field]
    assert (refusal.was, refusal.now) == (was, now)
    assert immutable.blocks_cluster(refusals)


def test_several_refusals_are_said_in_one_message() -> None:
    live = as_live(statefulset(replicas=3, storageSize="1Gi"))
    refusals = etcd_refusals(statefulset(replicas=5, storageSize="5Gi"), live)
    assert [r.field for r in refusals] == ["etcd.replicas", "etcd.storageSize"]
    message = refusal_message(refusals) or ""
    assert "was 3, now 5" in message and "was 1Gi, now 5Gi" in message


def test_a_statefulset_made_by_someone_else_is_judged_only_on_what_it_has() -> None:
    live = {"spec": {"template": {"spec": {"containers": [{"name": "etcd"}]}}}}
    assert etcd_refusals(statefulset(), live) == []
    assert keep_live_claims(statefulset(), live) == statefulset()


MANAGED_HOST = "demo-etcd-client.kafka.svc"


def config_map(**etcd: Any) -> dict[str, Any]:
    """The brokers' ConfigMap as built for a cluster with this ``etcd`` section."""
    spec = parse_cluster_spec(cluster_spec(etcd=etcd))
    built: dict[str, Any] = manifest_config.build_config_map(REF, spec)
    return built


EXTERNAL = {"mode": "External", "endpoints": ["http://etcd-a.db:2379", "http://etcd-b.db:2379"]}


def test_managed_to_external_is_refused_while_the_managed_etcd_exists() -> None:
    """Its StatefulSet holds the cluster's metadata: switching would delete it and point the
    brokers at an etcd without their topics and offsets."""
    (refusal,) = mode_refusals("External", True, None, MANAGED_HOST)
    assert (refusal.field, refusal.was, refusal.now) == ("etcd.mode", "Managed", "External")
    assert immutable.blocks_cluster([refusal])
    message = refusal_message([refusal]) or ""
    assert message.startswith("etcd.mode cannot change after creation: was Managed, now External")
    assert "managed etcd and its volumes are kept" in message and "snapshot" in message
    assert "deletionPolicy Retain" in message and immutable.DOCS in message
    # No managed etcd (never made, or the cluster was re-created): External is no switch.
    assert mode_refusals("External", False, config_endpoints(config_map()), MANAGED_HOST) == []


def test_external_to_managed_is_refused_while_the_brokers_use_another_etcd() -> None:
    brokers_on = config_endpoints(config_map(**EXTERNAL))
    assert brokers_on == EXTERNAL["endpoints"]
    (refusal,) = mode_refusals("Managed", False, brokers_on, MANAGED_HOST)
    assert (refusal.was, refusal.now) == ("External", "Managed")
    assert refusal.whole_cluster and "stay on the external etcd" in refusal.message


@pytest.mark.parametrize(
    "brokers_on",
    [
        None,  # a new cluster: no ConfigMap yet
        config_endpoints(config_map()),  # StatefulSet deleted with --cascade=orphan (resize)
        config_endpoints(config_map(tls=True)),  # the scheme is etcd.tls's business
    ],
)
def test_managed_without_a_statefulset_is_no_switch_when_brokers_name_the_managed_etcd(
    brokers_on: list[str] | None,
) -> None:
    assert mode_refusals("Managed", False, brokers_on, MANAGED_HOST) == []
    assert mode_refusals("Managed", True, brokers_on, MANAGED_HOST) == []


def test_a_config_map_without_a_readable_endpoint_list_says_nothing() -> None:
    assert config_endpoints(None) is None
    assert config_endpoints({"data": {}}) is None
    assert config_endpoints({"data": {ETCD_ENDPOINTS_KEY: "not json"}}) is None
    assert config_endpoints({"data": {ETCD_ENDPOINTS_KEY: '"http://x:2379"'}}) is None


def test_the_log_line_says_what_was_applied_of_the_generation() -> None:
    """Before, a refused change was logged as ``applied the objects of generation N``."""
    assert apply_summary(4, []) == "applied the objects of generation 4"
    live = as_live(statefulset(storageSize="1Gi"))
    claim = etcd_refusals(statefulset(storageSize="2Gi"), live)
    assert apply_summary(5, claim) == (
        "applied the objects of generation 5 except etcd.storageSize (kept as it was)"
    )
    members = etcd_refusals(statefulset(replicas=5, storageSize="2Gi"), live)
    assert apply_summary(6, members) == (
        "applied nothing of generation 6: refused the change of etcd.replicas, etcd.storageSize"
    )
    mode = mode_refusals("External", True, None, MANAGED_HOST)
    assert (
        apply_summary(7, mode) == "applied nothing of generation 7: refused the change of etcd.mode"
    )
