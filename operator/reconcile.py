"""The I/O steps behind the handlers: apply objects, observe, clean up, reconcile topics.

Each function takes the process's :class:`Runtime` and a resource's identity and spec, does its
calls (Kubernetes API, etcd, object storage) and returns what the status builders need.
Decisions are delegated to the pure modules (manifests, status, snapshot, topics).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.storage.object_store import ObjectStoreError
from kafscale.operator import (
    certificates,
    conflicts,
    immutable,
    manifests,
    naming,
    secret_usability,
)
from kafscale.operator.certificates import CERT_MANAGER_API
from kafscale.operator.discovery import ServerCapabilities, fit_to_server
from kafscale.operator.events import Notice, observed_rebalance_notice, rebalance_notice
from kafscale.operator.kube import KubeError, NameChanged
from kafscale.operator.live_objects import read_live
from kafscale.operator.model_cluster_status import LeaseStatus
from kafscale.operator.model_stores import EtcdMode
from kafscale.operator.models import (
    API_VERSION,
    CLUSTER_KIND,
    ClusterRef,
    DeletionPolicy,
    KafScaleClusterSpec,
    parse_cluster_spec,
)
from kafscale.operator.ownership import owned_by
from kafscale.operator.rebalance import (
    delete_cluster_keys,
    drain_pod,
    read_snapshot,
    rebalance,
)
from kafscale.operator.runtime import (
    ClusterKey,
    Runtime,
    cluster_key,
    delete_objects,
    managed_etcd_host,
    storage_settings,
)
from kafscale.operator.secret_writes import SecretsPass
from kafscale.operator.snapshot import lease_status
from kafscale.operator.status import ClusterObservation
from kafscale.operator.tls_secrets import ensure_certificate_secrets
from kafscale.operator.token_secret import ensure_token_secret

log = logging.getLogger(__name__)

Live = dict[manifests.ObjectId, dict[str, Any] | None]  # what holds each name (None: nothing)
CREATE_ATTEMPTS = 3  # plans made again when a name changes hands between its read and write


@dataclass(frozen=True)
class AppliedCluster:
    """What a pass over a cluster's objects did: the changes it refused (for the handler's
    log) and each object it wrote, as the API server answered the write: the object as the
    server has it right after, status included (the status read after the pass takes these
    rather than reading them again)."""

    refusals: list[immutable.Refusal] = field(default_factory=list)
    written: Live = field(default_factory=dict)


def serves_cert_manager(capabilities: ServerCapabilities) -> bool:
    """Only a server known to serve cert-manager's API (not one whose discovery failed)."""
    versions = capabilities.group_versions
    return versions is not None and CERT_MANAGER_API in versions


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def apply_cluster(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec
) -> AppliedCluster:
    """Apply every desired object the server serves, then delete the ones no longer wanted.

    A change the live etcd cannot take (see :mod:`immutable`) is kept for the status: a
    changed claim keeps the live one and the rest is applied; a changed member list, TLS
    scheme or etcd mode applies nothing. Objects of the cluster's names that are not the
    cluster's are neither applied over nor deleted (see :mod:`conflicts`); they are kept for
    the status too. What holds each name is read once (:mod:`live_objects`). Returns the
    refused changes and the objects written, as the server answered (:class:`AppliedCluster`).
    """
    kube, capabilities = runtime.kube, runtime.capabilities
    key = cluster_key(ref)
    try:
        cert_manager = await _use_cert_manager(runtime, ref, spec)
        objects = manifests.build_cluster_objects(ref, spec, cert_manager=cert_manager)
        wanted, left_out = fit_to_server(objects, capabilities)
        runtime.left_out[key] = left_out
        obsolete = [
            oid
            for oid in manifests.obsolete_object_ids(ref, spec, cert_manager=cert_manager)
            if capabilities.serves(oid[0])
        ]
        wanted_ids = [manifests.object_id(m) for m in wanted]
        live = await read_live(kube, ref, [*wanted_ids, *_etcd_holders(ref), *obsolete])
        live_etcd = _statefulset_of(ref, live)
        refusals = [
            *_mode_refusals(runtime, ref, spec, live),
            *immutable.etcd_refusals(_statefulset(wanted), live_etcd),
        ]
        runtime.refused[key] = immutable.refusal_message(refusals)
        if immutable.blocks_cluster(refusals):
            log.warning("%s/%s: %s", ref.namespace, ref.name, runtime.refused[key])
            runtime.apply_errors.pop(key, None)
            for kept in (runtime.not_owned, runtime.held_by_others, runtime.unusable_secrets):
                kept.pop(key, None)
            runtime.secrets_judged.pop(key, None)
            return AppliedCluster(refusals)
        runtime.applied_with[key] = capabilities
        secrets = await _ensure_secrets(runtime, ref, spec, cert_manager=cert_manager)
        plan = await _apply_owned(runtime, ref, wanted, live, secrets)
        runtime.note_etcd(ref, _etcd_in_use(ref, live))  # as written (a new managed etcd)
        _report(runtime.not_owned, ref, plan.message)
        _report(runtime.unusable_secrets, ref, plan.secrets_message)
        runtime.held_by_others[key] = conflicts.held_by_others(ref, wanted_ids, live)
        await _delete_obsolete(runtime, ref, {oid: live[oid] for oid in obsolete})
    except KubeError as exc:
        runtime.apply_errors[key] = str(exc)
        raise
    runtime.apply_errors.pop(key, None)
    written = {oid: live[oid] for oid in map(manifests.object_id, plan.apply)}
    return AppliedCluster(refusals, written)


async def _ensure_secrets(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec, *, cert_manager: bool
) -> secret_usability.UnusableSecrets:
    """Write the Secrets the pods mount (before the pods) and judge those of other owners
    found under their names; kept for the Secret watch (:mod:`secret_watch`)."""
    kube, done = runtime.kube, SecretsPass()
    if not cert_manager:  # cert-manager writes its own
        now = datetime.datetime.now(datetime.UTC)
        done += await ensure_certificate_secrets(kube, ref, spec, now)
    done += await ensure_token_secret(kube, ref, spec)  # the pods read it too
    judged = secret_usability.judge(ref, spec, done.found, cert_manager=cert_manager)
    runtime.secrets_judged[cluster_key(ref)] = judged
    return judged


def _report(kept: dict[ClusterKey, str | None], ref: ClusterRef, message: str | None) -> None:
    """Keep a pass's ``Degraded`` message for the status; log it once, not per retry."""
    key = cluster_key(ref)
    if message and message != kept.get(key):
        log.warning("%s/%s: %s", ref.namespace, ref.name, message)
    kept[key] = message


async def needs_reapply(runtime: Runtime, ref: ClusterRef) -> bool:
    """Whether the status timer applies the cluster's objects again between spec changes:
    the server's capabilities changed since they were applied, or a name the last apply left
    to another owner's object is free now (the user deleted it, or the garbage collector a
    deleted namesake cluster's: the operator makes its own). Only those names are read, so
    while such an object stays a status pass costs one GET per name, not a whole apply. (A
    Secret the pods read is not read here: the Secret watch applies again when one changes,
    :mod:`secret_watch`.)"""
    if runtime.capabilities_changed(ref):
        return True
    held = runtime.held_by_others.get(cluster_key(ref)) or {}
    if not held:
        return False
    found = await asyncio.gather(
        *(runtime.kube.get(api, kind, ref.namespace, name) for api, kind, name in held)
    )
    return conflicts.freed(held, dict(zip(held, found, strict=True)))


async def _apply_owned(
    runtime: Runtime,
    ref: ClusterRef,
    wanted: list[dict[str, Any]],
    live: Live,
    secrets: secret_usability.UnusableSecrets,
) -> conflicts.ApplyPlan:
    """Apply over the cluster's own objects and create the absent ones (see :mod:`conflicts`).

    A name may change hands between the read and the write: one found free may be taken before
    the create (a user's ``kubectl create``), one found the cluster's may be deleted and made
    again by a user before the apply. The write then fails rather than taking the object over
    (see :meth:`Kube.write`), the name is read again and the plan made again, so that object
    counts as another owner's (and, if it is the configuration or the etcd, the pods are held
    back). ``live`` is updated with what was written and read again.
    """
    for _ in range(CREATE_ATTEMPTS):
        plan = conflicts.plan_apply(ref, wanted, live, secrets)
        try:
            for manifest in plan.apply:
                await _write(runtime, ref, manifest, live)
        except NameChanged as exc:
            log.info("%s/%s: %s", ref.namespace, ref.name, exc)
            continue
        return plan
    raise KubeError(f"names of cluster {ref.namespace}/{ref.name} kept changing hands meanwhile")


async def _write(runtime: Runtime, ref: ClusterRef, manifest: dict[str, Any], live: Live) -> None:
    """Apply over the cluster's own live object, or create where there was none; ``live``
    then holds what was written (or, when the name changed hands meanwhile, what holds it)."""
    oid = manifests.object_id(manifest)
    if manifest["kind"] == "StatefulSet":
        manifest = immutable.keep_live_claims(manifest, _statefulset_of(ref, live))
    try:
        live[oid] = await runtime.kube.write(manifest, live.get(oid))
    except NameChanged:
        live[oid] = await runtime.kube.get(oid[0], oid[1], ref.namespace, oid[2])
        raise


async def _delete_obsolete(runtime: Runtime, ref: ClusterRef, obsolete: Live) -> None:
    """Delete the cluster's objects its spec no longer wants (``obsolete``: what holds those
    names); an object of such a name that is not the cluster's is someone else's and stays
    (deleted only if it is still the one checked).
    """
    for (api_version, kind, name), live in obsolete.items():
        if live is None:
            continue
        if conflicts.foreign(live, ref):
            log.debug("kept %s %s/%s: not this cluster's", kind, ref.namespace, name)
            continue
        uid = live["metadata"]["uid"]
        if await runtime.kube.delete(api_version, kind, ref.namespace, name, uid=uid):
            log.info("deleted %s %s/%s (no longer wanted)", kind, ref.namespace, name)


def _statefulset(manifests_: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The managed etcd's StatefulSet among ``manifests_`` (the only StatefulSet a cluster has)."""
    return next((m for m in manifests_ if m["kind"] == "StatefulSet"), None)


def _etcd_holders(ref: ClusterRef) -> list[manifests.ObjectId]:
    """The objects that say which etcd holds the cluster's metadata: the managed etcd's
    StatefulSet and the brokers' ConfigMap."""
    return [
        ("apps/v1", "StatefulSet", naming.etcd_name(ref.name)),
        ("v1", "ConfigMap", naming.config_map_name(ref.name)),
    ]


def _owned_of(ref: ClusterRef, live: Live, oid: manifests.ObjectId) -> dict[str, Any] | None:
    """The cluster's own object of ``live`` (None: none, or one that is not the cluster's)."""
    obj = live.get(oid)
    return obj if owned_by(obj, ref.uid) else None


def _etcd_in_use(ref: ClusterRef, live: Live) -> immutable.EtcdInUse:
    """Which etcd the cluster's own StatefulSet and ConfigMap in ``live`` say it uses."""
    return immutable.etcd_in_use(*(_owned_of(ref, live, oid) for oid in _etcd_holders(ref)))


def _statefulset_of(ref: ClusterRef, live: Live) -> dict[str, Any] | None:
    """The managed etcd's StatefulSet as it is now (None: there is none, or it is not this
    cluster's: a same-named one of another owner holds none of its metadata)."""
    return _owned_of(ref, live, _etcd_holders(ref)[0])


async def _owned(
    runtime: Runtime, ref: ClusterRef, api_version: str, kind: str, name: str
) -> dict[str, Any] | None:
    """The cluster's live object of that name (None: none, or one that is not the cluster's)."""
    live = await runtime.kube.get(api_version, kind, ref.namespace, name)
    return live if owned_by(live, ref.uid) else None


def _mode_refusals(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec, live: Live
) -> list[immutable.Refusal]:
    """A switch of ``etcd.mode`` away from the etcd the brokers use (see :mod:`immutable`);
    while it is refused the operator keeps to that etcd as well (``Runtime.in_effect``).
    Only objects of this cluster count: a same-named one of another owner holds none of its
    metadata."""
    in_use = _etcd_in_use(ref, live)
    runtime.note_etcd(ref, in_use)
    refusals, _ = immutable.judge_mode(spec.etcd, in_use, managed_etcd_host(ref))
    return refusals


async def _use_cert_manager(runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec) -> bool:
    if not serves_cert_manager(runtime.capabilities) or not certificates.ca_requests(ref, spec):
        return False
    ca_secret = await runtime.kube.get(
        "v1", "Secret", ref.namespace, naming.ca_secret_name(ref.name)
    )
    if ca_secret is None:  # no Kafka CA yet: the etcd CA decides as well
        name = naming.etcd_ca_secret_name(ref.name)
        ca_secret = await runtime.kube.get("v1", "Secret", ref.namespace, name)
    return certificates.use_cert_manager(True, ca_secret, ref.uid)


async def broker_replicas(runtime: Runtime, ref: ClusterRef) -> int | None:
    """The broker Deployment's ``spec.replicas`` as it is now (None: no Deployment yet)."""
    deployment = await _owned(
        runtime, ref, "apps/v1", "Deployment", naming.broker_deployment_name(ref.name)
    )
    replicas = ((deployment or {}).get("spec") or {}).get("replicas")
    return None if replicas is None else int(replicas)


async def observe_cluster(
    runtime: Runtime,
    ref: ClusterRef,
    spec: KafScaleClusterSpec,
    *,
    deleting: bool = False,
    written: Live | None = None,
) -> ClusterObservation:
    """What the status is built from: only the cluster's own objects count (a same-named
    Deployment of another owner is not its brokers). An object a pass just wrote (``written``:
    :attr:`AppliedCluster.written`) is taken from the write's answer, not read again."""
    written, key = written or {}, cluster_key(ref)

    async def current(api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        oid = (api_version, kind, name)
        if oid in written:  # the cluster's own: written over its uid, or created
            return written[oid]
        return await _owned(runtime, ref, api_version, kind, name)

    deployment = await current("apps/v1", "Deployment", naming.broker_deployment_name(ref.name))
    proxy = None
    if spec.proxy.enabled:
        proxy = await current("apps/v1", "Deployment", naming.proxy_name(ref.name))
    statefulset = None
    if runtime.in_effect(ref, spec).etcd.mode == EtcdMode.MANAGED:
        statefulset = await current(*_etcd_holders(ref)[0])
    registered: int | None = None
    leases: LeaseStatus | None = None
    etcd_error: str | None = None
    try:
        async with runtime.cluster_etcd(ref, spec) as etcd:
            snapshot = await read_snapshot(etcd, naming.kafscale_cluster_name(ref, spec))
        registered = len(snapshot.brokers)
        leases = lease_status(snapshot)
    except MetadataError as exc:
        etcd_error = str(exc)
    return ClusterObservation(
        broker_deployment=deployment,
        proxy_deployment=proxy,
        etcd_statefulset=statefulset,
        apply_error=runtime.apply_errors.get(key),
        refused=runtime.refused.get(key),
        not_owned=runtime.not_owned.get(key),
        unusable_secrets=runtime.unusable_secrets.get(key),
        left_out=_left_out(runtime.left_out.get(key)),
        server_version=runtime.capabilities.version,
        etcd_error=etcd_error,
        registered_brokers=registered,
        leases=leases,
        deleting=deleting,
    )


async def rebalance_cluster(runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec) -> None:
    async with runtime.cluster_etcd(ref, spec) as etcd:
        await rebalance(etcd, naming.kafscale_cluster_name(ref, spec))


async def balance_leases(
    runtime: Runtime,
    stopped: Any,
    get_spec: Callable[[], tuple[ClusterRef, KafScaleClusterSpec] | None],
    notify: Callable[[Notice], None] = lambda _: None,
) -> None:
    """A cluster's lease balancer: rebalance whenever the set of registered brokers changes.

    Follows one etcd watch on ``brokers/`` (registrations come and go with broker sessions:
    scale-ups, scale-downs, crashes) and re-checks at least every ``rebalance_interval_s``.
    Runs until ``stopped`` (kopf's daemon flag) is set; ``notify`` hears of every new assignment.
    """
    interval = runtime.settings.rebalance_interval_s
    retries = RetryLog(log, "lease balancer waiting for etcd", level=logging.INFO)

    def in_effect() -> tuple[ClusterRef, KafScaleClusterSpec] | None:
        current = get_spec()  # and the etcd the brokers use, while a switch is refused
        return None if current is None else (current[0], runtime.in_effect(*current))

    seen: Assignment | None = None  # the last assignment the balancer wrote or found
    while not stopped:
        current = in_effect()
        if current is None:  # invalid spec: nothing to balance until it is fixed
            await stopped.wait(interval)
            continue
        ref, spec = current
        cluster = naming.kafscale_cluster_name(ref, spec)
        changed = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        try:
            if not runtime.knows_etcd(ref):  # after a restart, before the first reconcile
                await runtime.recall_etcd(ref)
                continue  # start again with the etcd in effect
            async with runtime.cluster_etcd(ref, spec) as etcd:
                watcher = asyncio.create_task(_watch_brokers(etcd, cluster, changed))
                while not stopped and in_effect() == current and not watcher.done():
                    result = await rebalance(etcd, cluster)
                    retries.succeeded()
                    if result.written is not None:
                        notify(rebalance_notice(result.snapshot.assignment, result.written))
                    elif found := observed_rebalance_notice(seen, result.snapshot.assignment):
                        notify(found)
                    seen = result.written or result.snapshot.assignment
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(interval):
                            await changed.wait()
                    changed.clear()
                    await asyncio.sleep(0.05)  # let a burst of registrations settle
        except MetadataError as exc:
            retries.failed(f"cluster {cluster}: {exc}")
            await stopped.wait(min(interval, 2.0))
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, MetadataError):
                    await watcher


async def _watch_brokers(etcd: Any, cluster: str, changed: asyncio.Event) -> None:
    async with contextlib.aclosing(etcd.watch_prefix(keys.brokers_prefix(cluster))) as events:
        async for _ in events:
            changed.set()


async def find_cluster(
    runtime: Runtime, namespace: str, name: str
) -> tuple[ClusterRef, KafScaleClusterSpec] | None:
    body = await runtime.kube.get(API_VERSION, CLUSTER_KIND, namespace, name)
    if body is None:
        return None
    return ClusterRef.from_body(body), parse_cluster_spec(body.get("spec") or {})


async def drain_broker_pod(
    runtime: Runtime, pod: dict[str, Any]
) -> tuple[ClusterRef | None, list[int]]:
    """A broker pod is terminating: mark its broker draining and move its partitions.

    Returns the pod's cluster (None when it has none) and the brokers newly marked draining.
    """
    meta = pod["metadata"]
    instance = (meta.get("labels") or {}).get(naming.LABEL_INSTANCE)
    if not instance:
        return None, []
    found = await find_cluster(runtime, meta["namespace"], instance)
    if found is None:
        return None, []
    ref, spec = found
    async with runtime.cluster_etcd(ref, spec) as etcd:
        marked = await drain_pod(
            etcd,
            naming.kafscale_cluster_name(ref, spec),
            meta["name"],
            f"pod {meta['namespace']}/{meta['name']} is terminating",
        )
    return ref, marked


async def _s3_credentials(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec
) -> tuple[str | None, str | None]:
    secret_ref = spec.storage.credentials_secret
    if secret_ref is None:
        return None, None
    secret = await runtime.kube.get("v1", "Secret", ref.namespace, secret_ref.name)
    data = (secret or {}).get("data") or {}

    def decode(key: str) -> str | None:
        value = data.get(key)
        return base64.b64decode(value).decode() if value else None

    return decode(secret_ref.access_key_id_key), decode(secret_ref.secret_access_key_key)


async def delete_cluster_data(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleClusterSpec
) -> tuple[int, int]:
    """deletionPolicy Delete: the cluster's etcd prefix and object prefix. (keys, objects)."""
    if spec.deletion_policy != DeletionPolicy.DELETE:
        return 0, 0
    cluster = naming.kafscale_cluster_name(ref, spec)
    async with runtime.cluster_etcd(ref, spec) as etcd:
        deleted_keys = await delete_cluster_keys(etcd, cluster)
    access_key, secret_key = await _s3_credentials(runtime, ref, spec)
    settings = storage_settings(spec, access_key, secret_key, runtime.settings.s3_timeout_s)
    try:
        deleted_objects = await delete_objects(settings, keys.cluster_object_prefix(cluster))
    except ObjectStoreError as exc:
        raise RuntimeError(f"deleting the objects of cluster {cluster}: {exc}") from exc
    return deleted_keys, deleted_objects


def _left_out(applied: list[str] | None) -> tuple[str, ...] | None:
    return None if applied is None else tuple(applied)
