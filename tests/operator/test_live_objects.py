"""Pure parts of reading what holds a cluster's names (``live_objects``) and of owning what the
operator creates as server-side apply owns it (``kube.stray_update_entries``)."""

from __future__ import annotations

import pytest

from kafscale.operator.kube import stray_update_entries
from kafscale.operator.live_objects import plan_reads, unlisted
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
    found = {("v1", "Service", "demo-etcd"): {"metadata": {"name": "demo-etcd"}}}
    assert unlisted(ids[:2], found) == [("v1", "Service", "demo-brokers")]


def test_only_the_operators_update_entries_are_removed_each_guarded() -> None:
    """A create leaves its fields under the operator's ``Update`` entry, which would keep a
    field the operator later stops applying; others' entries and its ``Apply`` one stay."""
    entries = [
        {"manager": FIELD_MANAGER, "operation": "Apply"},
        {"manager": "kubectl-edit", "operation": "Update"},
        {"manager": FIELD_MANAGER, "operation": "Update"},
    ]
    assert stray_update_entries(entries) == [
        {"op": "test", "path": "/metadata/managedFields/2/manager", "value": FIELD_MANAGER},
        {"op": "test", "path": "/metadata/managedFields/2/operation", "value": "Update"},
        {"op": "remove", "path": "/metadata/managedFields/2"},
    ]
    assert stray_update_entries(entries[:2]) == []
    assert stray_update_entries(None) == []
