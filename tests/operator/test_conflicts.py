"""Which of a cluster's object names are held by objects that are not the cluster's (pure).

The real-API-server side (the objects left as they are, the condition and Event) is
``test_real_ownership.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from harness.cluster_specs import REF, cluster_spec

from kafscale.operator import manifests
from kafscale.operator.conflicts import (
    describe_owner,
    foreign,
    freed,
    held_by_others,
    plan_apply,
)
from kafscale.operator.models import parse_cluster_spec
from kafscale.operator.status import ClusterObservation, compute_cluster_status

pytestmark = pytest.mark.operator

SPEC = parse_cluster_spec(cluster_spec(etcd={"replicas": 1}))
OTHER = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "shop", "uid": "9f1c-other"}


def wanted() -> list[dict[str, Any]]:
    return manifests.build_cluster_objects(REF, SPEC)


def live_as(manifest: dict[str, Any], owners: list[dict[str, Any]] | None) -> dict[str, Any]:
    live = copy.deepcopy(manifest)
    live["metadata"]["uid"] = "live-uid"
    if owners is None:
        live["metadata"].pop("ownerReferences", None)
    else:
        live["metadata"]["ownerReferences"] = owners
    return live


def ids(objects: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [manifests.object_id(m) for m in objects]


def test_absent_and_own_objects_are_all_applied_and_nothing_is_said() -> None:
    objects = wanted()
    live = {manifests.object_id(m): None for m in objects}
    live[manifests.object_id(objects[0])] = live_as(
        objects[0], objects[0]["metadata"]["ownerReferences"]
    )
    plan = plan_apply(REF, objects, live)
    assert ids(plan.apply) == ids(objects)
    assert plan.message is None


def test_an_object_of_another_owner_is_left_alone_and_named_with_its_owner() -> None:
    objects = wanted()
    service = next(m for m in objects if m["metadata"]["name"] == "demo-brokers")
    live = {manifests.object_id(service): live_as(service, [OTHER])}
    plan = plan_apply(REF, objects, live)
    assert manifests.object_id(service) not in ids(plan.apply)
    assert ids(plan.apply) == [i for i in ids(objects) if i != manifests.object_id(service)]
    assert plan.held == []  # a bootstrap Service says nothing about where the data is
    message = plan.message or ""
    assert "Service demo-brokers (owned by Deployment shop (uid 9f1c-other))" in message
    assert "delete them and the operator makes its own" in message and "no pods" not in message


@pytest.mark.parametrize(
    ("kind", "name"),
    [("ConfigMap", "demo-config"), ("Service", "demo-etcd-client"), ("StatefulSet", "demo-etcd")],
)
def test_a_foreign_config_or_etcd_object_holds_back_every_pod_workload(
    kind: str, name: str
) -> None:
    objects = wanted()
    taken = next(m for m in objects if (m["kind"], m["metadata"]["name"]) == (kind, name))
    plan = plan_apply(REF, objects, {manifests.object_id(taken): live_as(taken, None)})
    applied = {(m["kind"], m["metadata"]["name"]) for m in plan.apply}
    assert not applied & {("Deployment", "demo-broker"), ("StatefulSet", "demo-etcd")}
    assert ("Service", "demo-brokers") in applied
    assert f"{kind} {name} (no owner reference)" in (plan.message or "")
    assert "Deployment demo-broker" in plan.held and "no pods are started" in (plan.message or "")


def test_a_deleted_namesake_clusters_object_is_not_this_clusters() -> None:
    """A KafScaleCluster deleted and re-created under the same name has a new uid: the old
    one's objects (until the garbage collector removes them) are not the new one's."""
    objects = wanted()
    old_owner = {**objects[0]["metadata"]["ownerReferences"][0], "uid": "old-uid"}
    live = live_as(objects[0], [old_owner])
    assert foreign(live, REF)
    assert "KafScaleCluster demo (uid old-uid)" in describe_owner(live)
    assert not foreign(None, REF)
    assert not foreign(live_as(objects[0], objects[0]["metadata"]["ownerReferences"]), REF)


def test_objects_left_to_others_make_the_cluster_degraded_and_not_ready() -> None:
    message = "not this cluster's, so left as they are: Service demo-brokers (no owner reference)"
    status = compute_cluster_status(
        REF, SPEC, ClusterObservation(not_owned=message), [], now="2026-11-28T00:00:00Z"
    )
    conditions = {c.type: (c.status, c.reason, c.message) for c in status.conditions}
    assert conditions["Degraded"] == ("True", "ObjectNotOwned", message)
    assert conditions["Ready"][:2] == ("False", "ObjectNotOwned")


def test_a_held_name_counts_as_freed_once_its_object_is_gone_or_replaced() -> None:
    """The status timer applies again only when a name another owner held is free (or held
    by another object since, which the next apply judges again)."""
    objects = wanted()
    theirs, ours = objects[0], objects[1]
    live = {
        manifests.object_id(theirs): live_as(theirs, [OTHER]),
        manifests.object_id(ours): live_as(ours, ours["metadata"]["ownerReferences"]),
    }
    held = held_by_others(REF, live, live)
    assert held == {manifests.object_id(theirs): "live-uid"}
    assert not freed(held, live)
    assert freed(held, {})  # deleted
    replaced = live_as(theirs, None)
    replaced["metadata"]["uid"] = "another-uid"
    assert freed(held, {manifests.object_id(theirs): replaced})
    assert held_by_others(REF, [manifests.object_id(ours)], live) == {}
