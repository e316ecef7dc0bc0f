"""Pure: which of a cluster's object names are held by objects that are not the cluster's.

The operator names its objects after the cluster (``<name>-config``, ``<name>-brokers``...), so
a namespace may already hold an object of that name: a user's own Service, another tool's
Deployment, the leftovers of a deleted cluster of the same name that the garbage collector has
not removed yet. Server-side apply with ``force`` would take such an object over (its fields,
and with the owner reference, its life: it would go with the cluster), and deleting by name
would delete it. As Strimzi and the Prometheus operator do, the operator touches only what it
owns (an owner reference naming the cluster's uid, which every object it ever made carries):
a foreign object is neither applied over nor deleted, and the cluster says which one and whose
it is (``Degraded`` with reason :data:`REASON`, and its Warning Event).

The rest is applied, except where that is unsafe: a foreign ConfigMap or managed-etcd object
would tell the cluster's pods where their metadata lives (a user's ``<name>-etcd-client``
Service pointing at the user's etcd), so while one is foreign no pods are started or changed
(the Deployments and the StatefulSet are held back until it is gone). Likewise the pod
workloads that read a Secret of another owner that they cannot use (:mod:`secret_usability`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafscale.operator import naming
from kafscale.operator.manifests import ObjectId, object_id
from kafscale.operator.models import ClusterRef
from kafscale.operator.ownership import describe_owner, owned_by
from kafscale.operator.secret_usability import UnusableSecrets, secrets_read

Manifest = dict[str, Any]

REASON = "ObjectNotOwned"
POD_KINDS = frozenset({"Deployment", "StatefulSet"})


def foundation_ids(ref: ClusterRef) -> frozenset[ObjectId]:
    """The objects that tell the cluster's pods where their configuration and metadata are."""
    name = ref.name
    return frozenset(
        {
            ("v1", "ConfigMap", naming.config_map_name(name)),
            ("v1", "Service", naming.etcd_name(name)),
            ("v1", "Service", naming.etcd_client_service_name(name)),
            ("apps/v1", "StatefulSet", naming.etcd_name(name)),
        }
    )


def foreign(live: Manifest | None, ref: ClusterRef) -> bool:
    """An object exists under the name and is not this cluster's."""
    return live is not None and not owned_by(live, ref.uid)


def held_by_others(
    ref: ClusterRef, ids: Iterable[ObjectId], live: Mapping[ObjectId, Manifest | None]
) -> dict[ObjectId, str]:
    """The names of ``ids`` that another owner's object holds, each with that object's uid."""
    return {
        oid: str(((live.get(oid) or {}).get("metadata") or {}).get("uid"))
        for oid in ids
        if foreign(live.get(oid), ref)
    }


def freed(held: Mapping[ObjectId, str], now: Mapping[ObjectId, Manifest | None]) -> bool:
    """Whether a name that another owner's object held (``held``: name → its uid) is held by
    it no more: deleted (the operator can make its own), or replaced by another object."""
    return any(
        str(((now.get(oid) or {}).get("metadata") or {}).get("uid")) != uid
        for oid, uid in held.items()
    )


@dataclass(frozen=True)
class ApplyPlan:
    """What to apply of the wanted objects, and what is left alone and why."""

    apply: list[Manifest]
    not_owned: list[str] = field(default_factory=list)  # "Service demo-brokers (no owner…)"
    held: list[str] = field(default_factory=list)  # pod workloads held back: "Deployment x"
    unusable: list[str] = field(default_factory=list)  # "Secret demo-ca (…): no tls.crt"
    waiting: list[str] = field(default_factory=list)  # pod workloads held back for those

    @property
    def message(self) -> str | None:
        """The ``Degraded`` condition's message (None: every object is the cluster's)."""
        if not self.not_owned:
            return None
        text = (
            f"not this cluster's, so left as they are: {'; '.join(self.not_owned)}; delete them "
            "and the operator makes its own (or give the cluster another name)"
        )
        if self.held:
            text += (
                f"; until then no pods are started or changed ({', '.join(self.held)} held "
                "back: the cluster's configuration or etcd is among them)"
            )
        return text

    @property
    def secrets_message(self) -> str | None:
        """The ``Degraded`` message for Secrets of other owners the pods cannot use
        (:data:`secret_usability.REASON`; None: none)."""
        if not self.unusable:
            return None
        text = (
            f"not this cluster's and not usable, so left as they are: {'; '.join(self.unusable)}"
            "; fix them, or delete them and the operator makes its own"
        )
        if self.waiting:
            text += f"; until then {', '.join(self.waiting)} held back (their pods read them)"
        return text


def plan_apply(
    ref: ClusterRef,
    wanted: list[Manifest],
    live: Mapping[ObjectId, Manifest | None],
    secrets: UnusableSecrets | None = None,
) -> ApplyPlan:
    """Split ``wanted`` by whether its live namesake (``live``, None: absent) is the cluster's;
    hold back the pod workloads that read a Secret of another owner that is not usable
    (``secrets``)."""
    secrets = secrets or UnusableSecrets()
    not_owned = [m for m in wanted if foreign(live.get(object_id(m)), ref)]
    blocked = {object_id(m) for m in not_owned}
    hold_pods = bool(blocked & foundation_ids(ref))
    pods = [m for m in wanted if m["kind"] in POD_KINDS and object_id(m) not in blocked]
    held = pods if hold_pods else []
    waiting = [m for m in pods if not hold_pods and secrets_read(m) & secrets.blocked]
    skipped = blocked | {object_id(m) for m in [*held, *waiting]}
    return ApplyPlan(
        apply=[m for m in wanted if object_id(m) not in skipped],
        not_owned=[
            f"{m['kind']} {m['metadata']['name']} ({describe_owner(live[object_id(m)] or {})})"
            for m in not_owned
        ],
        held=[f"{m['kind']} {m['metadata']['name']}" for m in held],
        unusable=list(secrets.problems.values()),
        waiting=[f"{m['kind']} {m['metadata']['name']}" for m in waiting],
    )
