"""Sample KafScaleCluster specs for the operator tests, and what the operator builds from them.

One builder, so the operator tests (pure builders and those on a real API server) describe a
secured cluster the same way, and a change to the spec's shape is made once.
"""

from __future__ import annotations

import copy
import datetime
from typing import Any

from kafscale.operator import manifests
from kafscale.operator.models import ClusterRef, parse_cluster_spec

REF = ClusterRef(name="demo", namespace="kafka", uid="0b7f3c1e-0000-4000-8000-000000000001")
NOW = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)

AUTHORIZER_CONFIG = {"authorizer.enabled": "true", "authorizer.super_users": '["User:admin"]'}
PLAIN_LISTENER: dict[str, Any] = {"name": "plain", "port": 9092}
SCRAM_LISTENER: dict[str, Any] = {
    "name": "external",
    "port": 9093,
    "tls": True,
    "authentication": {"type": "scram-sha-512"},
}
MTLS_LISTENER: dict[str, Any] = {
    "name": "mtls",
    "port": 9094,
    "tls": True,
    "authentication": {"type": "tls"},
}
THREE_LISTENERS = [PLAIN_LISTENER, SCRAM_LISTENER, MTLS_LISTENER]


def cluster_spec(
    *,
    listeners: list[dict[str, Any]] | None = None,
    proxy: dict[str, Any] | None = None,
    etcd: dict[str, Any] | None = None,
    brokers: dict[str, Any] | None = None,
    authorizer: bool = False,
    bucket: str = "bucket-1",
) -> dict[str, Any]:
    """A KafScaleCluster spec with only the sections given (the operator's defaults for the
    rest); ``authorizer`` turns ACLs on with ``User:admin`` as the super user. Every call
    returns a new dict, so a test may change its copy."""
    if authorizer:
        config = {**AUTHORIZER_CONFIG, **(brokers or {}).get("config", {})}
        brokers = {**(brokers or {}), "config": config}
    spec: dict[str, Any] = {"storage": {"bucket": bucket}}
    sections = {"brokers": brokers, "proxy": proxy, "etcd": etcd, "listeners": listeners}
    spec.update({key: value for key, value in sections.items() if value is not None})
    return copy.deepcopy(spec)


def external_etcd(endpoint: str) -> dict[str, Any]:
    """A cluster on an etcd the operator does not run (the tests' own)."""
    return cluster_spec(etcd={"mode": "External", "endpoints": [endpoint]})


def objects_of(raw: dict[str, Any], cert_manager: bool = False) -> list[dict[str, Any]]:
    """Every object the operator builds for cluster ``REF`` with spec ``raw``."""
    return manifests.build_cluster_objects(REF, parse_cluster_spec(raw), cert_manager=cert_manager)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def container_of(workload: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return container
