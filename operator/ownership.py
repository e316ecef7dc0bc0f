"""Owner references and metadata of every object a KafScaleCluster owns (one builder each)."""

from __future__ import annotations

from typing import Any

from kafscale.operator import naming
from kafscale.operator.models import API_VERSION, CLUSTER_KIND, ClusterRef


def owner_reference(ref: ClusterRef) -> dict[str, Any]:
    """The cluster as controller owner: the garbage collector deletes the object with it."""
    return {
        "apiVersion": API_VERSION,
        "kind": CLUSTER_KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_metadata(ref: ClusterRef, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": naming.labels(ref.name, component),
        "ownerReferences": [owner_reference(ref)],
    }


def owned_by(obj: dict[str, Any] | None, owner_uid: str) -> bool:
    """Whether ``obj`` (a live object) is the owner's: its owner references name ``owner_uid``
    (a cluster's or a KafScaleUser's).

    A same-named object of another owner (an application of the user's, a cluster deleted and
    re-created under the same name, a certificate Secret of the user's own) is not. The one
    test of ownership for every object the operator makes.
    """
    owners = ((obj or {}).get("metadata") or {}).get("ownerReferences") or []
    return bool(owner_uid) and any(owner.get("uid") == owner_uid for owner in owners)


def describe_owner(obj: dict[str, Any]) -> str:
    """Whose ``obj`` is, by its owner references (``kubectl get -o yaml`` shows the same)."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not owners:
        return "no owner reference"
    return ", ".join(
        f"owned by {o.get('kind')} {o.get('name')} (uid {o.get('uid')})" for o in owners
    )
