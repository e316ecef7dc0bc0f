"""What the API server serves, and what the operator leaves out where it serves less.

Older Kubernetes versions lack APIs a cluster's objects use: ``policy/v1`` PodDisruptionBudgets
(served since 1.21), ``autoscaling/v2`` HorizontalPodAutoscalers (1.23), the StatefulSet field
``persistentVolumeClaimRetentionPolicy`` (1.23) and CEL validation rules in CRDs (1.25). Applying
an object of an API the server does not serve fails, and one failed apply would keep the whole
cluster Degraded. So the operator asks the server what it serves (at start-up, then again every
``discovery_interval_s``: an API or CRD installed later is used without a restart), creates
only that, and says what it left out (a condition and an Event) instead of failing.

:func:`fetch_capabilities` is the I/O; everything else here is pure.
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass
from typing import Any

from kafscale.operator.kube import Kube, KubeError
from kafscale.operator.models import CLUSTER_PLURAL, GROUP

log = logging.getLogger(__name__)

Manifest = dict[str, Any]

CLUSTER_CRD = f"{CLUSTER_PLURAL}.{GROUP}"
PVC_RETENTION_FIELD = "persistentVolumeClaimRetentionPolicy"
PVC_RETENTION_SINCE = (1, 23)


@dataclass(frozen=True)
class ServerCapabilities:
    """What one API server serves. ``None`` fields are unknown (assumed served)."""

    version: str = "unknown"
    group_versions: frozenset[str] | None = None
    minor_version: tuple[int, int] | None = None
    cel_rules: bool | None = None

    def serves(self, api_version: str) -> bool:
        return self.group_versions is None or api_version in self.group_versions

    @property
    def pvc_retention_policy(self) -> bool:
        return self.minor_version is None or self.minor_version >= PVC_RETENTION_SINCE


ASSUME_EVERYTHING = ServerCapabilities()


def parse_version(info: dict[str, Any]) -> tuple[int, int] | None:
    """(major, minor) of a ``/version`` answer; managed clusters say e.g. minor ``"27+"``."""
    try:
        major = int(re.sub(r"\D", "", str(info.get("major", ""))))
        minor = int(re.sub(r"\D", "", str(info.get("minor", ""))))
    except ValueError:
        return None
    return major, minor


def served_group_versions(core: dict[str, Any], groups: dict[str, Any]) -> frozenset[str]:
    """Every ``group/version`` of the ``/api`` and ``/apis`` discovery answers (core as ``v1``)."""
    served = set(core.get("versions") or [])
    for group in groups.get("groups") or []:
        served.update(v["groupVersion"] for v in group.get("versions") or [])
    return frozenset(served)


def _has_cel_rules(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_cel_rules(item) for item in node)
    if not isinstance(node, dict):
        return False
    return "x-kubernetes-validations" in node or any(_has_cel_rules(v) for v in node.values())


def cel_rules_kept(crd: dict[str, Any] | None) -> bool | None:
    """Whether the server kept the CRD's validation rules (one that cannot drops them)."""
    if crd is None:
        return None
    return _has_cel_rules(crd.get("spec", {}).get("versions"))


def capabilities_from(
    version: dict[str, Any],
    core: dict[str, Any],
    groups: dict[str, Any],
    crd: dict[str, Any] | None,
) -> ServerCapabilities:
    return ServerCapabilities(
        version=str(version.get("gitVersion") or "unknown"),
        group_versions=served_group_versions(core, groups),
        minor_version=parse_version(version),
        cel_rules=cel_rules_kept(crd),
    )


def fit_to_server(
    manifests: list[Manifest], capabilities: ServerCapabilities
) -> tuple[list[Manifest], list[str]]:
    """The manifests the server can take, and a description of each thing left out."""
    kept: list[Manifest] = []
    left_out: list[str] = []
    for manifest in manifests:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        if not capabilities.serves(manifest["apiVersion"]):
            left_out.append(f"{kind} {name} ({manifest['apiVersion']} is not served)")
            continue
        spec = manifest.get("spec") or {}
        if (
            kind == "StatefulSet"
            and PVC_RETENTION_FIELD in spec
            and not capabilities.pvc_retention_policy
        ):
            manifest = copy.deepcopy(manifest)
            del manifest["spec"][PVC_RETENTION_FIELD]
            left_out.append(f"StatefulSet {name} {PVC_RETENTION_FIELD} (needs Kubernetes 1.23)")
        kept.append(manifest)
    if capabilities.cel_rules is False:
        left_out.append("CRD validation rules (not enforced by this server; the operator checks)")
    return kept, left_out


def refresh_due(read_at_s: float, now_s: float, interval_s: float) -> bool:
    """Whether capabilities read at ``read_at_s`` (0: never) should be read again at ``now_s``."""
    return read_at_s == 0.0 or now_s - read_at_s >= interval_s


def newly_served(old: ServerCapabilities, new: ServerCapabilities) -> list[str]:
    """Group versions ``new`` serves that ``old`` did not (for the log)."""
    if old.group_versions is None or new.group_versions is None:
        return []
    return sorted(new.group_versions - old.group_versions)


async def fetch_capabilities(
    kube: Kube, fallback: ServerCapabilities = ASSUME_EVERYTHING
) -> ServerCapabilities:
    """Ask the server (discovery, version, our CRD); on failure keep ``fallback``.

    At start-up the fallback is to assume everything is served; later, the last reading.
    """
    try:
        version = await kube.get_path("/version") or {}
        core = await kube.get_path("/api") or {}
        groups = await kube.get_path("/apis") or {}
    except KubeError as exc:
        log.warning("API discovery failed, keeping what was known: %s", exc)
        return fallback
    try:
        crd = await kube.get_path(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CLUSTER_CRD}"
        )
    except KubeError as exc:  # e.g. no permission: say nothing about validation rules
        log.info("could not read CRD %s: %s", CLUSTER_CRD, exc)
        crd = None
    capabilities = capabilities_from(version, core, groups, crd)
    if capabilities == fallback:
        return fallback
    added = newly_served(fallback, capabilities)
    if added:
        log.info("the API server now serves %s", ", ".join(added))
    log.info(
        "Kubernetes %s; policy/v1 %s, autoscaling/v2 %s, CRD validation rules %s",
        capabilities.version,
        capabilities.serves("policy/v1"),
        capabilities.serves("autoscaling/v2"),
        capabilities.cel_rules,
    )
    return capabilities
