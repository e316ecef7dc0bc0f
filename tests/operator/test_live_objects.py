"""Pure parts of reading what holds a cluster's names (``live_objects``), of owning what the
operator creates as server-side apply owns it (``kube.stray_update_entries``) and of telling
an apply that found its object replaced (``kube.uid_precondition_failed``)."""

from __future__ import annotations

import json

import pytest

from kafscale.operator.kube import (
    KubeError,
    refused_fields,
    stray_update_entries,
    uid_precondition_failed,
)
from kafscale.operator.live_objects import plan_reads
from kafscale.operator.naming import FIELD_MANAGER

pytestmark = pytest.mark.operator


def test_kinds_of_several_names_are_listed_single_ones_and_secrets_read_by_name() -> None:
    ids = [
        ("v1", "Service", "demo-etcd"),
        ("v1", "Service", "demo-brokers"),
        ("apps/v1", "StatefulSet", "demo-etcd"),
        ("v1", "ConfigMap", "demo-config"),
        ("v1", "ConfigMap", "demo-other"),  # never listed: may hold others' settings
        ("v1", "Secret", "demo-ca"),
        ("v1", "Secret", "demo-broker-tls"),
        ("apps/v1", "Deployment", "demo-broker"),
        ("apps/v1", "Deployment", "demo-proxy"),
        ("v1", "Service", "demo-brokers"),  # asked twice, read once
    ]
    listed, by_name = plan_reads(ids)
    assert listed == [("v1", "Service"), ("apps/v1", "Deployment")]
    assert by_name == [
        ("apps/v1", "StatefulSet", "demo-etcd"),
        ("v1", "ConfigMap", "demo-config"),
        ("v1", "ConfigMap", "demo-other"),
        ("v1", "Secret", "demo-ca"),
        ("v1", "Secret", "demo-broker-tls"),
    ]


def test_only_the_operators_update_entries_are_removed_each_guarded() -> None:
    """A create leaves its fields under the operator's ``Update`` entry, which would keep a
    field the operator later stops applying; others' entries and its ``Apply`` one stay. The
    patch tests the uid first: it runs after the apply, when the name may hold another object."""
    entries = [
        {"manager": FIELD_MANAGER, "operation": "Apply"},
        {"manager": "kubectl-edit", "operation": "Update"},
        {"manager": FIELD_MANAGER, "operation": "Update"},
    ]
    assert stray_update_entries("uid-1", entries) == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-1"},  # never on a replacement
        {"op": "test", "path": "/metadata/managedFields/2/manager", "value": FIELD_MANAGER},
        {"op": "test", "path": "/metadata/managedFields/2/operation", "value": "Update"},
        {"op": "remove", "path": "/metadata/managedFields/2"},
    ]
    assert stray_update_entries("uid-1", entries[:2]) == []
    assert stray_update_entries("uid-1", None) == []


def test_an_apply_refused_for_its_uid_is_told_from_the_objects_own_errors() -> None:
    """What 1.20.2 answers an apply carrying the uid of an object the name no longer holds:
    409 when it holds none, 422 on ``metadata.uid`` when it holds another. A 422 on the spec
    (a StatefulSet's claims) is the object's own error, not a replacement."""
    another = {
        "kind": "Status",
        "reason": "Invalid",
        "details": {
            "causes": [
                {
                    "reason": "FieldValueInvalid",
                    "message": 'Invalid value: "0000": field is immutable',
                    "field": "metadata.uid",
                }
            ]
        },
    }
    assert refused_fields(json.dumps(another).encode()) == ("metadata.uid",)
    assert refused_fields(b"not json") == refused_fields(None) == refused_fields("{}") == ()
    assert uid_precondition_failed(KubeError("gone", 409))
    assert uid_precondition_failed(KubeError("another", 422, ("metadata.uid",)))
    assert not uid_precondition_failed(KubeError("claims", 422, ("spec.volumeClaimTemplates",)))
    assert not uid_precondition_failed(KubeError("forbidden", 403))
