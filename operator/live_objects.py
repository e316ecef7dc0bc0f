"""Reading what holds a cluster's object names now: one LIST per kind, GETs only for the rest.

An apply judges each wanted object by its live namesake (the cluster's own, another owner's,
or none: see :mod:`conflicts`), and deletes only the cluster's own of the names its spec no
longer wants. One GET per name made ~11 reads of a managed cluster on every apply (while an
object of another owner holds a name, the status timer applies again every interval). So the
kinds a cluster has several objects of are listed, once per kind, and only the kinds it has a
single name of are read by name (a LIST would cost the same call). The LIST is of every object
of its kind in the namespace, not of the cluster's labels: labels are not ownership (the owner
reference is, :func:`ownership.owned_by`), and a user may remove them (``kubectl label ...
app.kubernetes.io/instance-``). Listed by label, the cluster's own object without them was
taken for none among the names its spec no longer wants, and was never deleted; listed whole,
every name of a listed kind is known from its one LIST, whatever labels its object carries.
Only the kinds of :data:`LISTED_KINDS` (the kinds the chart grants ``list`` on) are listed:
ConfigMaps and Secrets, which may hold what other applications keep to themselves, never are.

A list asks for metadata only (:meth:`Kube.list_metadata`): a listed object is judged only by
whose it is (owner references, uid), and a namespace of other applications' Deployments would
otherwise send every pod template on every pass. So a listed object in the answer has no
``spec`` or ``status``; what needs them (the etcd StatefulSet's claims, the ConfigMap's etcd
endpoints) is of a kind read by name, and the status takes the objects the apply answered with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from kafscale.operator.kube import Kube
from kafscale.operator.manifests import ObjectId
from kafscale.operator.models import ClusterRef

Manifest = dict[str, Any]
Kind = tuple[str, str]  # (apiVersion, kind)

LISTED_KINDS: frozenset[Kind] = frozenset(
    {
        ("v1", "Service"),
        ("apps/v1", "Deployment"),
        ("policy/v1", "PodDisruptionBudget"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
        ("cert-manager.io/v1", "Certificate"),
        ("cert-manager.io/v1", "Issuer"),
    }
)


def plan_reads(ids: Iterable[ObjectId]) -> tuple[list[Kind], list[ObjectId]]:
    """Pure: the kinds to LIST (two or more of ``ids``, listable) and the ids to GET."""
    ids = list(dict.fromkeys(ids))
    names: dict[Kind, int] = {}
    for api_version, kind, _ in ids:
        names[(api_version, kind)] = names.get((api_version, kind), 0) + 1
    listed = [k for k, count in names.items() if count > 1 and k in LISTED_KINDS]
    return listed, [oid for oid in ids if oid[:2] not in listed]


async def read_live(
    kube: Kube, ref: ClusterRef, ids: Iterable[ObjectId]
) -> dict[ObjectId, Manifest | None]:
    """The live object of each id in the cluster's namespace (None: there is none); of a
    listed kind, its metadata only."""
    every = list(dict.fromkeys(ids))
    kinds, by_name = plan_reads(every)
    lists = await asyncio.gather(
        *(kube.list_metadata(api_version, kind, ref.namespace) for api_version, kind in kinds)
    )
    found: dict[ObjectId, Manifest | None] = {
        (api_version, kind, item["metadata"]["name"]): item
        for (api_version, kind), items in zip(kinds, lists, strict=True)
        for item in items
    }
    got = await asyncio.gather(
        *(kube.get(api_version, kind, ref.namespace, name) for api_version, kind, name in by_name)
    )
    found.update(zip(by_name, got, strict=True))
    return {oid: found.get(oid) for oid in every}
