"""Reading what holds a cluster's object names now: one LIST per kind, GETs only for the rest.

An apply judges each wanted object by its live namesake (the cluster's own, another owner's,
or none: see :mod:`conflicts`), and deletes only the cluster's own of the names its spec no
longer wants. One GET per name made ~11 reads of a managed cluster on every apply (while an
object of another owner holds a name, the status timer applies again every interval). The
cluster's own objects carry its labels, so one LIST per kind with the cluster's selector finds
them; a name the LIST did not return is either free or held by an object without those labels
(a user's), and only those names are read one by one (of the names the spec no longer
wants, only the cluster's own matter: one not listed is not read). Only the kinds a cluster
has several objects of are listed (:data:`LISTED_KINDS`, the kinds the chart grants ``list``
on); a kind with a single name is read by name (a LIST would cost the same call), and
ConfigMaps and Secrets, which may hold what other applications keep to themselves, are never
listed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from kafscale.operator import naming
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


def unlisted(ids: Iterable[ObjectId], found: Mapping[ObjectId, Manifest | None]) -> list[ObjectId]:
    """Pure: the ids a LIST did not return (free, or held by an object without the labels)."""
    return [oid for oid in ids if oid not in found]


async def read_live(
    kube: Kube, ref: ClusterRef, ids: Iterable[ObjectId], own_only: Iterable[ObjectId] = ()
) -> dict[ObjectId, Manifest | None]:
    """The live object of each id in the cluster's namespace (None: there is none).

    ``own_only``: names of which only the cluster's own object matters (those its spec no
    longer wants, to delete): one that the LIST of its kind did not return is taken as none,
    without a GET (an object the cluster owns carries its labels).
    """
    judged = list(dict.fromkeys(ids))
    every = list(dict.fromkeys([*judged, *own_only]))
    kinds, direct = plan_reads(every)
    selector = naming.instance_selector(ref.name)
    lists = await asyncio.gather(
        *(kube.list(api_version, kind, ref.namespace, selector) for api_version, kind in kinds)
    )
    found: dict[ObjectId, Manifest | None] = {
        (api_version, kind, item["metadata"]["name"]): item
        for (api_version, kind), items in zip(kinds, lists, strict=True)
        for item in items
    }
    by_name = [*direct, *unlisted([oid for oid in judged if oid[:2] in kinds], found)]
    got = await asyncio.gather(
        *(kube.get(api_version, kind, ref.namespace, name) for api_version, kind, name in by_name)
    )
    found.update(zip(by_name, got, strict=True))
    return {oid: found.get(oid) for oid in every}
