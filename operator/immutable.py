"""Pure: the spec changes a managed etcd cannot take, judged against its live StatefulSet.

A StatefulSet's ``volumeClaimTemplates`` cannot change after creation: the API server refuses
the whole apply (422) and, before this check, the reconcile stopped at that object, so a broker
change made in the same edit never rolled out either. The etcd members start from a fixed
initial member list and store their peer URLs (scheme included), so ``etcd.replicas`` and
``etcd.tls`` cannot change either; the CRD says so with CEL transition rules, but a server
before Kubernetes 1.25 does not enforce them (1.20 drops them). The operator decides here.

Two kinds of refusal, as Strimzi treats a storage change it cannot make (it keeps the volumes
and warns): a changed claim (``storageSize``, ``storageClassName``) keeps the live claim
template and every other object, the StatefulSet's pods included, is still applied. A changed
member list or scheme would also rewrite the brokers' etcd endpoints, so nothing of the
cluster is applied until the spec is set back. Either is reported as ``Degraded`` with reason
:data:`REASON` and a message saying what to do.

``etcd.mode`` is the third: the cluster's metadata (topics, offsets, leases, committed group
offsets) lives in the etcd it has, so a switch between the managed etcd and an external one
would point the brokers at an etcd without it (and Managed → External deleted the managed
StatefulSet). Nothing is applied until the spec is set back; moving is a snapshot and a
restore, then a re-created resource (the docs give the steps).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubernetes.utils import parse_quantity

from kafscale.operator.manifest_config import ETCD_ENDPOINTS_KEY
from kafscale.operator.model_stores import EtcdMode, EtcdSpec

Manifest = dict[str, Any]

REASON = "ImmutableFieldChanged"
DOCS = "docs/operations-kubernetes.md#fields-that-cannot-change"
INITIAL_CLUSTER = "--initial-cluster="
LISTEN_CLIENT_URLS = "--listen-client-urls="
DEFAULT_CLASS = "(the default StorageClass)"
MANAGED, EXTERNAL = EtcdMode.MANAGED.value, EtcdMode.EXTERNAL.value
MODE_HINTS = {
    EXTERNAL: "set it back; nothing of the cluster is applied until then and the managed etcd "
    "and its volumes are kept (to move: stop producers, snapshot the managed etcd, restore it "
    "as the external etcd, delete this resource with deletionPolicy Retain and create it again "
    "with mode External)",
    MANAGED: "set it back; nothing of the cluster is applied until then and the brokers stay on "
    "the external etcd (to move: stop producers, snapshot the external etcd, delete this "
    "resource with deletionPolicy Retain, restore the snapshot into the new etcd volumes and "
    "create it again with mode Managed)",
}


@dataclass(frozen=True)
class Refusal:
    """One spec field whose change cannot be made to the live objects."""

    field: str  # the spec's path, e.g. ``etcd.storageSize``
    was: str
    now: str
    whole_cluster: bool  # True: applying anything would break the cluster, so nothing is
    hint: str

    @property
    def message(self) -> str:
        return (
            f"{self.field} cannot change after creation: was {self.was}, now {self.now}; "
            f"{self.hint} (see {DOCS})"
        )


def refusal_message(refusals: list[Refusal]) -> str | None:
    """One message for the status condition and the Event; None when nothing is refused."""
    if not refusals:
        return None
    return "; ".join(r.message for r in refusals)


def _claims(statefulset: Manifest | None) -> dict[str, dict[str, Any]]:
    templates = ((statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return {claim["metadata"]["name"]: claim for claim in templates}


def _storage(claim: dict[str, Any]) -> str | None:
    requests = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    value = requests.get("storage")
    return None if value is None else str(value)


def _same_quantity(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return a == b
    try:
        return bool(parse_quantity(a) == parse_quantity(b))
    except ValueError:
        return a == b


def _claim_refusals(desired: Manifest, live: Manifest) -> list[Refusal]:
    live_claims = _claims(live)
    refusals: list[Refusal] = []
    for name, claim in _claims(desired).items():
        old = live_claims.get(name)
        if old is None:
            continue
        was, now = _storage(old), _storage(claim)
        if not _same_quantity(was, now):
            refusals.append(
                Refusal(
                    "etcd.storageSize",
                    str(was),
                    str(now),
                    whole_cluster=False,
                    hint="set it back; to grow the volumes, expand each etcd claim and "
                    "re-create the StatefulSet without its pods",
                )
            )
        old_class = (old.get("spec") or {}).get("storageClassName")
        new_class = (claim.get("spec") or {}).get("storageClassName")
        if old_class != new_class:
            refusals.append(
                Refusal(
                    "etcd.storageClassName",
                    old_class or DEFAULT_CLASS,
                    new_class or DEFAULT_CLASS,
                    whole_cluster=False,
                    hint="set it back; moving etcd to another StorageClass means a backup "
                    "and a restore",
                )
            )
    return refusals


def _etcd_arg(statefulset: Manifest, prefix: str) -> str | None:
    template = ((statefulset.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in template.get("containers") or []:
        for arg in container.get("args") or []:
            if isinstance(arg, str) and arg.startswith(prefix):
                return arg[len(prefix) :]
    return None


def _member_refusals(desired: Manifest, live: Manifest) -> list[Refusal]:
    refusals: list[Refusal] = []
    was_members, now_members = _etcd_arg(live, INITIAL_CLUSTER), _etcd_arg(desired, INITIAL_CLUSTER)
    if was_members is not None and now_members is not None:
        was, now = len(was_members.split(",")), len(now_members.split(","))
        if was != now:
            refusals.append(
                Refusal(
                    "etcd.replicas",
                    str(was),
                    str(now),
                    whole_cluster=True,
                    hint="set it back; nothing of the cluster is applied until then (to "
                    "resize etcd: back up, re-create the cluster, restore)",
                )
            )
    was_urls, now_urls = _etcd_arg(live, LISTEN_CLIENT_URLS), _etcd_arg(desired, LISTEN_CLIENT_URLS)
    if was_urls is not None and now_urls is not None:
        was_tls, now_tls = was_urls.startswith("https:"), now_urls.startswith("https:")
        if was_tls != now_tls:
            refusals.append(
                Refusal(
                    "etcd.tls",
                    str(was_tls).lower(),
                    str(now_tls).lower(),
                    whole_cluster=True,
                    hint="set it back; nothing of the cluster is applied until then (members "
                    "store their peer URLs, scheme included)",
                )
            )
    return refusals


def etcd_refusals(desired: Manifest | None, live: Manifest | None) -> list[Refusal]:
    """What the desired etcd StatefulSet changes that the live one cannot take."""
    if desired is None or live is None:
        return []
    return [*_member_refusals(desired, live), *_claim_refusals(desired, live)]


def _hosts(endpoints: list[str]) -> set[str]:
    return {urlsplit(url).hostname or url for url in endpoints}


def mode_refusals(
    mode: str, managed: bool, live_endpoints: list[str] | None, managed_host: str
) -> list[Refusal]:
    """A switch of ``etcd.mode`` away from the etcd the cluster's metadata lives in.

    ``managed``: the cluster's own managed etcd StatefulSet exists; ``live_endpoints`` the etcd
    the brokers' live ConfigMap names (None: not made yet); ``managed_host`` the host of the
    managed etcd's client Service. Managed → External: the StatefulSet exists. External →
    Managed: there is none and the brokers use another etcd (a StatefulSet deleted with
    ``--cascade=orphan`` to grow its volumes is no switch: the brokers still name the managed
    host). The scheme is not compared (``etcd.tls`` is judged on its own).
    """
    if mode == EXTERNAL and managed:
        return [Refusal("etcd.mode", MANAGED, EXTERNAL, True, MODE_HINTS[EXTERNAL])]
    if (
        mode == MANAGED
        and not managed
        and live_endpoints
        and _hosts(live_endpoints) != {managed_host}
    ):
        return [Refusal("etcd.mode", EXTERNAL, MANAGED, True, MODE_HINTS[MANAGED])]
    return []


def etcd_in_effect(
    etcd: EtcdSpec, refusals: list[Refusal], live_endpoints: list[str] | None
) -> EtcdSpec | None:
    """The ``etcd`` section the brokers still use while a switch of its mode is refused (the
    operator keeps to it too: topics, leases and status live there); None: the spec's own."""
    switch = next((r for r in refusals if r.field == "etcd.mode"), None)
    if switch is None:
        return None
    if switch.was == MANAGED:
        return etcd.model_copy(update={"mode": EtcdMode.MANAGED})
    return etcd.model_copy(update={"mode": EtcdMode.EXTERNAL, "endpoints": live_endpoints or []})


@dataclass(frozen=True)
class EtcdInUse:
    """Which etcd the cluster's live objects say holds its metadata.

    Read from the objects, not remembered by the operator process alone: after a restart,
    the topic, user and lease handlers may run before the cluster's first reconcile, and must
    not follow a refused ``etcd.mode`` switch to an etcd without the cluster's metadata.
    """

    managed: bool  # the cluster's own managed etcd StatefulSet exists
    endpoints: tuple[str, ...] | None  # the etcd its brokers' ConfigMap names (None: no map)


def etcd_in_use(statefulset: Manifest | None, config_map: Manifest | None) -> EtcdInUse:
    """From the cluster's own StatefulSet and ConfigMap (None: none of the cluster's)."""
    endpoints = config_endpoints(config_map)
    return EtcdInUse(statefulset is not None, None if endpoints is None else tuple(endpoints))


def judge_mode(
    etcd: EtcdSpec, in_use: EtcdInUse, managed_host: str
) -> tuple[list[Refusal], EtcdSpec | None]:
    """The refused switch of ``etcd.mode``, if any, and the ``etcd`` section in effect
    meanwhile (None: the spec's own)."""
    endpoints = None if in_use.managed or in_use.endpoints is None else list(in_use.endpoints)
    refusals = mode_refusals(etcd.mode, in_use.managed, endpoints, managed_host)
    return refusals, etcd_in_effect(etcd, refusals, endpoints)


def config_endpoints(config_map: Manifest | None) -> list[str] | None:
    """The etcd client URLs a live broker ConfigMap names (None: no map, or no list in it)."""
    raw = ((config_map or {}).get("data") or {}).get(ETCD_ENDPOINTS_KEY)
    try:
        endpoints = json.loads(raw) if raw else None
    except ValueError:
        return None
    if not isinstance(endpoints, list):
        return None
    return [str(url) for url in endpoints]


def blocks_cluster(refusals: list[Refusal]) -> bool:
    return any(r.whole_cluster for r in refusals)


def apply_summary(generation: int, refusals: list[Refusal]) -> str:
    """What the operator's log says a reconcile did with ``generation`` of the spec: all of
    it applied, all but the refused fields (their live values kept), or nothing."""
    if not refusals:
        return f"applied the objects of generation {generation}"
    fields = ", ".join(dict.fromkeys(r.field for r in refusals))
    if blocks_cluster(refusals):
        return f"applied nothing of generation {generation}: refused the change of {fields}"
    return f"applied the objects of generation {generation} except {fields} (kept as it was)"


def keep_live_claims(manifest: Manifest, live: Manifest | None) -> Manifest:
    """``manifest`` (the etcd StatefulSet) with what its claim templates cannot change taken
    from the ``live`` one: labels, storage request and StorageClass.

    A StatefulSet made by an operator of another version carries that version's label in its
    claim template; that label stays. A refused ``storageSize`` keeps the live size, so the
    rest of the StatefulSet (image, resources) is still applied. Server-filled fields of the
    live template (``status``, ``volumeMode``) are not copied: they are not ours.
    """
    live_claims = _claims(live)
    if not live_claims:
        return manifest
    claims = []
    for claim in manifest["spec"]["volumeClaimTemplates"]:
        old = live_claims.get(claim["metadata"]["name"])
        if old is None:
            claims.append(claim)
            continue
        metadata = {key: value for key, value in claim["metadata"].items() if key != "labels"}
        if old["metadata"].get("labels"):
            metadata["labels"] = old["metadata"]["labels"]
        spec = {key: value for key, value in claim["spec"].items() if key != "storageClassName"}
        old_spec = old.get("spec") or {}
        if old_spec.get("storageClassName"):
            spec["storageClassName"] = old_spec["storageClassName"]
        storage = _storage(old)
        if storage is not None:
            spec["resources"] = {**spec["resources"], "requests": {"storage": storage}}
        claims.append({**claim, "metadata": metadata, "spec": spec})
    return {**manifest, "spec": {**manifest["spec"], "volumeClaimTemplates": claims}}
