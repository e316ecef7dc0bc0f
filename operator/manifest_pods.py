"""What every pod the operator runs shares, and the type its builders return.

Security contexts that pass Pod Security Admission's "restricted" profile, a spread over nodes
and zones, pull secrets, container resources with the operator's defaults, a disruption
budget. Pure; the broker, proxy and etcd builders (``manifest_brokers``, ``manifest_proxy``,
``manifest_etcd``) use it.
"""

from __future__ import annotations

from typing import Any

from kafscale.operator import naming
from kafscale.operator.model_base import ResourceRequirements
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

Manifest = dict[str, Any]

RUN_AS_USER = 10001


def container_resources(
    value: ResourceRequirements | None, default: dict[str, Any]
) -> dict[str, Any]:
    return default if value is None else value.to_api()


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_spread(ref: ClusterRef, component: str) -> dict[str, Any]:
    """Anti-affinity over nodes and a soft spread over zones."""
    selector = {"matchLabels": naming.selector_labels(ref.name, component)}
    return {
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": selector,
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": selector,
            }
        ],
    }


def pod_disruption_budget(
    ref: ClusterRef, name: str, component: str, budget: dict[str, Any]
) -> Manifest:
    """A PodDisruptionBudget over one component's pods; ``budget``: ``maxUnavailable`` or
    ``minAvailable``."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_metadata(ref, name, component),
        "spec": {
            **budget,
            "selector": {"matchLabels": naming.selector_labels(ref.name, component)},
        },
    }


def pod_common(spec: KafScaleClusterSpec, service_account: str | None = None) -> dict[str, Any]:
    """Fields every pod shares. No ServiceAccount token by default: no pod of a cluster calls
    the Kubernetes API. A pod given ``service_account`` (IRSA, GKE or Azure workload identity:
    S3 access by the pod's identity) runs as it, and that ServiceAccount's own
    ``automountServiceAccountToken`` decides about the token (the identity webhooks project
    their own token volume either way)."""
    common: dict[str, Any] = {
        "securityContext": pod_security_context(),
        "enableServiceLinks": False,
    }
    if service_account:
        common["serviceAccountName"] = service_account
    else:
        common["automountServiceAccountToken"] = False
    if spec.image_pull_secrets:
        common["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    return common
