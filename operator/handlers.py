"""The kopf handlers: thin. Filter in the decorators, build with the pure builders, apply, report.

:func:`register` puts every handler into a kopf registry (intervals come from the settings),
so tests and ``run_operator`` each build their own registry and nothing registers at import.

KafScaleCluster
    create/update(spec)/resume → certificate Secrets (``tls_secrets``) or cert-manager objects,
    then apply objects, write status · timer → observe status and lease
    distribution · daemon → lease balancer (etcd watch on broker registrations) · timer → drift
    repair (re-apply) · delete (finalizer) → honour ``deletionPolicy``.
Secrets
    event on one a cluster's pods read → apply that cluster again and write its status, when
    the change calls for it (``secret_handlers``, ``secret_watch``).
Broker pods
    event with a deletionTimestamp → mark the broker draining and reassign its partitions.
KafScaleTopic
    create/update/resume → topic record in etcd · delete (finalizer) → remove it and its keys.
KafScaleUser
    see ``user_handlers`` (Secret, SCRAM credential and ACLs in etcd).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

import kopf
from pydantic import ValidationError

from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.operator import immutable, manifests, naming, reconcile
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.discovery import fetch_capabilities
from kafscale.operator.events import (
    Notice,
    condition_notices,
    deletion_notice,
    drain_notice,
    readiness_notices,
    scale_notice,
)
from kafscale.operator.handler_errors import HandlerErrors, ToldPermanentError, ToldTemporaryError
from kafscale.operator.kube import Kube, KubeError, load_configuration
from kafscale.operator.metrics import OperatorMetrics
from kafscale.operator.model_base import Condition
from kafscale.operator.models import (
    API_VERSION,
    CLUSTER_KIND,
    CLUSTER_PLURAL,
    GROUP,
    TOPIC_PLURAL,
    VERSION,
    ClusterPhase,
    ClusterRef,
    KafScaleClusterSpec,
    KafScaleClusterStatus,
    parse_cluster_spec,
    parse_topic_spec,
)
from kafscale.operator.rebalance import delete_topic_keys, rebalance
from kafscale.operator.runtime import ClusterKey, EtcdPool, Runtime, cluster_key
from kafscale.operator.secret_handlers import register_secret_watch
from kafscale.operator.settings import OperatorSettings
from kafscale.operator.status import (
    ClusterObservation,
    compute_cluster_status,
    compute_topic_status,
    desired_brokers,
    invalid_spec_status,
    parse_conditions,
)
from kafscale.operator.topics import reconcile_topic, topic_name
from kafscale.operator.user_handlers import register_users

log = logging.getLogger(__name__)

CLUSTERS = (GROUP, VERSION, CLUSTER_PLURAL)
TOPICS = (GROUP, VERSION, TOPIC_PLURAL)
# Tries of a cluster's finalizer (3 s apart) before it gives up on deleting the data and lets
# the resource go: a namespace being deleted takes the managed etcd with it.
DELETE_ATTEMPTS = 20
# Reads of a cluster whose change handler has not reported yet, 1 s apart, before a pass the
# Secret watch asked for (:func:`register`'s ``reapply_for_secret``).
REPORTED_WAITS = 30
BROKER_POD_LABELS = {
    naming.LABEL_NAME: naming.APP,
    naming.LABEL_COMPONENT: naming.BROKER,
    naming.LABEL_MANAGED_BY: naming.MANAGER,
}


def _runtime(memo: Any) -> Runtime:
    runtime: Runtime = memo.runtime
    return runtime


def _status_body(status: Any) -> dict[str, Any]:
    body: dict[str, Any] = status.to_api()
    return body


def _parse(body: Any) -> tuple[ClusterRef, KafScaleClusterSpec]:
    ref = ClusterRef.from_body(body)
    spec = parse_cluster_spec(body.get("spec") or {})
    manifests.build_cluster_objects(ref, spec)  # raises on what the schema cannot check
    return ref, spec


def _spec_problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
    return str(exc)


def _post(body: Any, notices: Iterable[Notice | None]) -> None:
    """Post Events on ``body`` (a resource body or a reference built by :func:`_cluster_body`)."""
    for notice in notices:
        if notice is not None:
            kopf.event(body, type=notice.type, reason=notice.reason, message=notice.message)


def _cluster_body(ref: ClusterRef) -> dict[str, Any]:
    """What kopf needs to post an Event on a KafScaleCluster known only by its reference."""
    meta = {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid}
    return {"apiVersion": API_VERSION, "kind": CLUSTER_KIND, "metadata": meta}


def _report(
    runtime: Runtime,
    ref: ClusterRef,
    body: Any,
    patch: kopf.Patch,
    previous: list[Condition],
    new: Any,
    *extra: Notice | None,
) -> None:
    """Write ``new`` status and post an Event for each condition it changes.

    The change is judged against the conditions this process last reported for the cluster
    when it has any (the status timer and a change handler may both run before either's patch
    is stored: the second must not post the same Event again), else against stored status.
    Kept by the cluster's uid: one made again under a deleted one's name is judged against
    its own (empty) status, not the deleted one's last conditions.
    """
    key = cluster_key(ref)
    said = runtime.reported.get(key, previous)
    runtime.reported[key] = list(new.conditions)
    patch.status.update(_status_body(new))
    _post(body, [*condition_notices(said, new.conditions), *extra])


def _changed(current: Any, new: dict[str, Any]) -> bool:
    """Whether writing ``new`` would change status (ignoring kopf's own fields)."""
    return any(current.get(key) != value for key, value in new.items())


def register(
    registry: kopf.OperatorRegistry, config: OperatorSettings, metrics: OperatorMetrics
) -> None:
    """Register every handler of the operator into ``registry`` (each counted and timed in
    ``metrics`` and each failure posted as a Warning Event, the lease balancer's long-lived
    daemon excepted)."""
    errors = HandlerErrors(config.error_event_interval_s)
    resync_user_for_secret = register_users(registry, config, metrics, errors)

    @kopf.on.startup(registry=registry)
    async def startup(memo: Any, settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf")
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        # Only Warnings of ours (kopf.warn, kopf.event) are posted; kopf's own log records are
        # never posted (settings.posting.loggers stays off: every handler warning, tracebacks
        # included, unlimited). Handler failures are posted by ``errors``, one line each.
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 300
        kube = Kube(load_configuration(config), config.api_timeout_s)
        memo.runtime = Runtime(
            settings=config,
            kube=kube,
            etcd=EtcdPool(config.etcd_timeout_s),
            capabilities=await fetch_capabilities(kube),
            capabilities_read_at_s=time.monotonic(),
        )

    @kopf.on.login(registry=registry)
    async def login(memo: Any, **_: Any) -> kopf.ConnectionInfo:
        conn = _runtime(memo).kube.connection
        return kopf.ConnectionInfo(
            server=conn.server,
            token=conn.token,
            ca_path=conn.ca_path,
            insecure=conn.insecure,
            certificate_path=conn.certificate_path,
            private_key_path=conn.private_key_path,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        runtime = getattr(memo, "runtime", None)
        if runtime is not None:
            await runtime.close()

    def _observed(
        ref: ClusterRef,
        spec: KafScaleClusterSpec,
        observation: ClusterObservation,
        status: KafScaleClusterStatus,
    ) -> None:
        desired = desired_brokers(spec, observation.broker_deployment)
        metrics.observe_cluster(ref, status, desired)

    # --- KafScaleCluster ------------------------------------------------------------------

    @kopf.on.resume(*CLUSTERS, registry=registry)
    @kopf.on.create(*CLUSTERS, registry=registry)
    @kopf.on.update(*CLUSTERS, field="spec", registry=registry)
    @metrics.timed
    @errors.reported
    async def reconcile_cluster(
        body: Any, status: Any, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
    ) -> None:
        runtime = _runtime(memo)
        previous = parse_conditions(status.get("conditions"))
        try:
            ref, spec = _parse(body)
        except (ValidationError, InvalidBrokerConfig) as exc:
            ref = ClusterRef.from_body(body)
            problem = _spec_problem(exc)
            new = invalid_spec_status(ref, previous, problem, now=reconcile.utc_now())
            _report(runtime, ref, body, patch, previous, new)
            metrics.observe_cluster(ref, new, None)
            raise ToldPermanentError(f"invalid spec: {problem}") from exc
        replicas_before = await reconcile.broker_replicas(runtime, ref)
        try:
            applied = await reconcile.apply_cluster(runtime, ref, spec)
        except KubeError as exc:
            observation = await reconcile.observe_cluster(runtime, ref, spec)
            new = compute_cluster_status(ref, spec, observation, previous, now=reconcile.utc_now())
            _report(runtime, ref, body, patch, previous, new)
            _observed(ref, spec, observation, new)
            raise kopf.TemporaryError(f"applying objects: {exc}", delay=5) from exc
        observation = await reconcile.observe_cluster(runtime, ref, spec, written=applied.written)
        new = compute_cluster_status(ref, spec, observation, previous, now=reconcile.utc_now())
        _observed(ref, spec, observation, new)
        wanted = None if spec.autoscaling.enabled else spec.brokers.replicas
        _report(runtime, ref, body, patch, previous, new, scale_notice(replicas_before, wanted))
        logger.info("%s", immutable.apply_summary(ref.generation, applied.refusals))

    async def refresh_status(
        runtime: Runtime, body: Any, status: Any, patch: kopf.Patch, logger: Any, *, reapply: bool
    ) -> None:
        """Observe the cluster and write its status into ``patch`` if it changed; apply its
        objects first when ``reapply`` (a Secret its pods read changed: the Secret watch) or
        :func:`reconcile.needs_reapply` says so."""
        try:
            ref, spec = _parse(body)
        except (ValidationError, InvalidBrokerConfig):
            return  # reported by reconcile_cluster
        # Report the generation that was actually applied, not the latest one.
        applied = status.get("observedGeneration")
        if applied is None:
            return  # not reconciled yet
        if not runtime.judged(ref):
            # Restarted: until this process's first pass over the cluster, what it refuses
            # (and what it leaves to other owners) is not known; reporting without it would
            # clear the condition and post a Recovered Event, then the Warning again.
            return
        ref = ref.model_copy(update={"generation": int(applied)})
        await runtime.refresh_capabilities(time.monotonic())
        written = None
        try:  # an API the cluster uses is served now (or no longer), a name freed: apply again
            if applied == body["metadata"].get("generation") and (
                reapply or await reconcile.needs_reapply(runtime, ref)
            ):
                written = (await reconcile.apply_cluster(runtime, ref, spec)).written
        except KubeError as exc:
            logger.warning("applying objects again: %s", exc)
        observation = await reconcile.observe_cluster(runtime, ref, spec, written=written)
        previous = parse_conditions(status.get("conditions"))
        computed = compute_cluster_status(ref, spec, observation, previous, now=reconcile.utc_now())
        _observed(ref, spec, observation, computed)
        if status.get("observedGeneration") != applied:
            return  # a change handler reported a newer generation while this one observed
        if _changed(status, _status_body(computed)):
            _report(runtime, ref, body, patch, previous, computed)
            # Only change handlers advance it; a timer's patch lands after its run, and one
            # that observed the previous generation set it back for good (issue 24's flake).
            patch.status.pop("observedGeneration", None)

    @kopf.timer(*CLUSTERS, interval=config.status_interval_s, registry=registry)
    @metrics.timed
    @errors.reported
    async def refresh_cluster_status(
        body: Any, meta: Any, status: Any, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
    ) -> None:
        if meta.get("deletionTimestamp"):
            return
        await refresh_status(_runtime(memo), body, status, patch, logger, reapply=False)

    async def reapply_for_secret(runtime: Runtime, key: ClusterKey) -> None:
        """Apply the cluster's objects again and write its status (as the status timer does),
        for a change of a Secret its pods read; read the cluster first: the Secret's event
        carries nothing of it."""
        namespace, name, uid = key
        for _ in range(REPORTED_WAITS):
            body = await runtime.kube.get(API_VERSION, CLUSTER_KIND, namespace, name)
            meta = (body or {}).get("metadata") or {}
            if body is None or meta.get("uid") != uid or meta.get("deletionTimestamp"):
                return  # deleted meanwhile (or made again: the new one has its own first pass)
            if (body.get("status") or {}).get("observedGeneration") == meta.get("generation"):
                break
            # A change handler's pass is under way (it may have read the Secret before the
            # change): the pass below runs once it has reported, not never.
            await asyncio.sleep(1.0)
        else:
            return  # still not reported: the change handler fails and retries a whole pass
        patch = kopf.Patch()
        await refresh_status(runtime, body, body.get("status") or {}, patch, log, reapply=True)
        if patch.get("status"):
            await runtime.kube.patch_status(
                API_VERSION, CLUSTER_KIND, namespace, name, patch["status"], uid=uid
            )

    register_secret_watch(registry, metrics, reapply_for_secret, resync_user_for_secret)

    @kopf.timer(
        *CLUSTERS,
        interval=config.resync_interval_s,
        initial_delay=config.resync_interval_s,
        registry=registry,
    )
    @metrics.timed
    @errors.reported
    async def repair_cluster_objects(
        body: Any, meta: Any, status: Any, memo: Any, **_: Any
    ) -> None:
        if meta.get("deletionTimestamp"):
            return
        try:
            ref, spec = _parse(body)
        except (ValidationError, InvalidBrokerConfig):
            return
        if status.get("observedGeneration") == ref.generation:  # only what was reconciled
            await reconcile.apply_cluster(_runtime(memo), ref, spec)

    @kopf.daemon(*CLUSTERS, cancellation_timeout=2.0, registry=registry)
    async def lease_balancer(body: Any, stopped: Any, memo: Any, **_: Any) -> None:
        def current() -> tuple[ClusterRef, KafScaleClusterSpec] | None:
            try:
                return _parse(body)
            except (ValidationError, InvalidBrokerConfig):
                return None

        def notify(notice: Notice) -> None:
            _post(body, [notice])

        await reconcile.balance_leases(_runtime(memo), stopped, current, notify)

    @kopf.on.delete(*CLUSTERS, registry=registry, retries=DELETE_ATTEMPTS, backoff=3)
    @metrics.timed
    @errors.reported
    async def delete_cluster(
        body: Any, memo: Any, logger: Any, patch: kopf.Patch, retry: int, **_: Any
    ) -> None:
        # `kubectl get ksc` says so while the finalizer works (or waits for etcd or S3).
        patch.status["phase"] = ClusterPhase.TERMINATING.value
        try:
            ref, spec = _parse(body)
        except (ValidationError, InvalidBrokerConfig):
            logger.warning("invalid spec: nothing is deleted beyond the owned objects")
            invalid = ClusterRef.from_body(body)
            _runtime(memo).forget(invalid)
            metrics.forget_cluster(invalid)
            return
        try:
            deleted_keys, deleted_objects = await reconcile.delete_cluster_data(
                _runtime(memo), ref, spec
            )
        except (MetadataError, KubeError, RuntimeError) as exc:
            cluster = naming.kafscale_cluster_name(ref, spec)
            leftover = f"etcd keys under /kafscale/{cluster}/ and objects under its bucket prefix"
            _post(body, [deletion_notice(str(exc), retry, DELETE_ATTEMPTS, leftover)])
            raise kopf.TemporaryError(f"deleting cluster data: {exc}", delay=3) from exc
        _runtime(memo).forget(ref)
        metrics.forget_cluster(ref)
        logger.info(
            "deletionPolicy %s: removed %d etcd keys and %d objects",
            spec.deletion_policy,
            deleted_keys,
            deleted_objects,
        )

    # --- broker pods ----------------------------------------------------------------------

    @kopf.on.event(
        "",
        "v1",
        "pods",
        labels=BROKER_POD_LABELS,
        when=lambda meta, **_: bool(meta.get("deletionTimestamp")),
        registry=registry,
    )
    @metrics.timed
    @errors.reported
    async def drain_terminating_broker(body: Any, memo: Any, logger: Any, **_: Any) -> None:
        try:
            ref, drained = await reconcile.drain_broker_pod(_runtime(memo), dict(body))
        except (MetadataError, KubeError, ValidationError) as exc:
            logger.warning("could not drain terminating broker pod: %s", exc)
            return
        if ref is not None and drained:
            logger.info("brokers %s draining; partitions reassigned", drained)
            _post(_cluster_body(ref), [drain_notice(body["metadata"]["name"], drained)])

    # --- KafScaleTopic --------------------------------------------------------------------

    @kopf.on.resume(*TOPICS, registry=registry)
    @kopf.on.create(*TOPICS, registry=registry)
    @kopf.on.update(*TOPICS, field="spec", registry=registry)
    @metrics.timed
    @errors.reported
    async def reconcile_topic_resource(
        body: Any, meta: Any, status: Any, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
    ) -> None:
        runtime = _runtime(memo)
        spec = parse_topic_spec(body.get("spec") or {})
        generation = int(meta.get("generation") or 1)
        previous = parse_conditions(status.get("conditions"))
        name = topic_name(spec, meta["name"])

        def report(**kwargs: Any) -> None:
            new = compute_topic_status(generation, previous, now=reconcile.utc_now(), **kwargs)
            patch.status.update(_status_body(new))
            _post(body, readiness_notices(previous, new.conditions))

        found = await reconcile.find_cluster(runtime, meta["namespace"], spec.cluster_ref)
        if found is None:
            message = f"KafScaleCluster {spec.cluster_ref} not found"
            report(
                topic_id=None, partitions=None, problem=None, waiting=("ClusterNotFound", message)
            )
            raise ToldTemporaryError(message, delay=10)
        ref, cluster_spec = found
        cluster = naming.kafscale_cluster_name(ref, cluster_spec)
        try:
            async with runtime.cluster_etcd(ref, cluster_spec) as etcd:
                decision = await reconcile_topic(etcd, cluster, name, spec)
                await rebalance(etcd, cluster)
        except MetadataError as exc:
            report(
                topic_id=None, partitions=None, problem=None, waiting=("EtcdUnavailable", str(exc))
            )
            raise kopf.TemporaryError(f"etcd: {exc}", delay=5) from exc
        problem = (decision.problem.reason, decision.problem.message) if decision.problem else None
        report(
            topic_id=decision.record.topic_id,
            partitions=decision.record.partitions,
            problem=problem,
        )
        if decision.problem:
            logger.warning("%s", decision.problem.message)

    @kopf.on.delete(*TOPICS, registry=registry, retries=10, backoff=3)
    @metrics.timed
    @errors.reported
    async def delete_topic_resource(body: Any, meta: Any, memo: Any, logger: Any, **_: Any) -> None:
        runtime = _runtime(memo)
        spec = parse_topic_spec(body.get("spec") or {})
        found = await reconcile.find_cluster(runtime, meta["namespace"], spec.cluster_ref)
        if found is None:
            logger.info("cluster %s is gone: nothing to delete in etcd", spec.cluster_ref)
            return
        ref, cluster_spec = found
        name = topic_name(spec, meta["name"])
        try:
            async with runtime.cluster_etcd(ref, cluster_spec) as etcd:
                await delete_topic_keys(etcd, naming.kafscale_cluster_name(ref, cluster_spec), name)
        except MetadataError as exc:
            raise kopf.TemporaryError(f"etcd: {exc}", delay=3) from exc
        logger.info("topic %s deleted from etcd", name)
