"""The KafScaleUser handlers: thin shells over ``users`` (decisions and etcd) and ``Kube``.

create/update(spec)/resume → the password Secret, the SCRAM credential and the ACL bindings in
the cluster's etcd, then status · timer (``resync_interval_s``) → the same, so a credential or a
binding removed behind the operator's back (``kafscale acls remove``, DeleteAcls) comes back ·
the password Secret changed or deleted (the Secret watch, :mod:`secret_handlers`) → the same ·
delete (finalizer) → credentials and bindings leave etcd; the Secret goes with the resource
(owner reference, garbage collector).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf
from pydantic import ValidationError

from kafscale.broker.authz.model import InvalidBinding
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.protocol.errors import MetadataTimeout
from kafscale.operator import naming, reconcile
from kafscale.operator.events import readiness_notices
from kafscale.operator.handler_errors import HandlerErrors
from kafscale.operator.kube import KubeError
from kafscale.operator.metrics import OperatorMetrics
from kafscale.operator.model_user_access import SecretKeySelector
from kafscale.operator.models import (
    API_VERSION,
    GROUP,
    USER_KIND,
    USER_PLURAL,
    VERSION,
    ClusterRef,
    KafScaleUserSpec,
    parse_user_spec,
)
from kafscale.operator.runtime import Runtime
from kafscale.operator.secret_watch import UserKey, UserSecret
from kafscale.operator.secret_writes import decide_and_write
from kafscale.operator.settings import OperatorSettings
from kafscale.operator.status import Verdict, compute_user_status, parse_conditions
from kafscale.operator.users import (
    SecretConflict,
    build_user_secret,
    desired_bindings,
    generate_password,
    mechanism_of,
    password_from_ref,
    password_in,
    remove_user,
    secret_of,
    sync_acls,
    sync_credential,
)

USERS = (GROUP, VERSION, USER_PLURAL)

log = logging.getLogger(__name__)

UserResync = Callable[[Runtime, UserKey], Awaitable[None]]


class UserNotReady(Exception):
    """One reconcile round stopped short: ``verdict`` goes into the Ready condition."""

    def __init__(self, verdict: Verdict, *, permanent: bool = False, delay_s: float = 10) -> None:
        super().__init__(verdict[2])
        self.verdict = verdict
        self.permanent = permanent
        self.delay_s = delay_s


def _problem(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def _parse(body: Any) -> tuple[ClusterRef, KafScaleUserSpec]:
    ref = ClusterRef.from_body(body)
    try:
        spec = parse_user_spec(body.get("spec") or {})
        desired_bindings(ref.name, spec)
    except ValidationError as exc:
        raise UserNotReady((False, "InvalidSpec", _problem(exc)), permanent=True) from exc
    except InvalidBinding as exc:
        raise UserNotReady((False, "InvalidAcl", str(exc)), permanent=True) from exc
    return ref, spec


async def _referenced_password(
    runtime: Runtime, ref: ClusterRef, selector: SecretKeySelector
) -> str:
    """A password of the user's own, from ``authentication.password.valueFrom.secretKeyRef``."""
    try:
        secret = await runtime.kube.get("v1", "Secret", ref.namespace, selector.name)
    except KubeError as exc:
        raise UserNotReady((False, "PasswordSecretNotReadable", str(exc)), delay_s=5) from exc
    password = password_from_ref(secret, selector.key)
    if password is None:
        message = f"Secret {selector.name} has no password under key {selector.key}"
        if secret is None:
            message = f"Secret {selector.name} (the password) not found"
        raise UserNotReady((False, "PasswordSecretNotFound", message), delay_s=10)
    return password


async def _ensure_secret(
    runtime: Runtime, ref: ClusterRef, spec: KafScaleUserSpec, cluster: str
) -> str:
    """The user's password: the referenced one, the one in its Secret, or a new one written
    there first. A Secret of another owner under the name, also one put in place of the
    user's own after the read (:mod:`secret_writes`), is ``SecretConflict``."""
    source = spec.authentication.password
    if source is not None:
        return await _referenced_password(runtime, ref, source.value_from.secret_key_ref)

    async def decide(secret: dict[str, Any] | None) -> str:
        password = password_in(secret, ref.uid) or generate_password()  # never another's
        await runtime.kube.write(build_user_secret(ref, cluster, password), secret)
        return password

    name = naming.user_secret_name(ref.name)
    try:
        return await decide_and_write(runtime.kube, ref.namespace, name, decide)
    except SecretConflict as exc:
        raise UserNotReady((False, "SecretConflict", str(exc)), delay_s=30) from exc
    except KubeError as exc:
        raise UserNotReady((False, "SecretNotWritten", str(exc)), delay_s=5) from exc


async def reconcile_user(runtime: Runtime, body: Any) -> tuple[ClusterRef, Verdict, int]:
    """One round: Secret, credential, ACLs. Returns (ref, Ready verdict, bindings in etcd)."""
    ref, spec = _parse(body)
    try:
        found = await reconcile.find_cluster(runtime, ref.namespace, spec.cluster)
    except KubeError as exc:
        raise UserNotReady((False, "ClusterNotReadable", str(exc)), delay_s=5) from exc
    except ValidationError as exc:
        message = f"KafScaleCluster {spec.cluster} has an invalid spec: {_problem(exc)}"
        raise UserNotReady((False, "ClusterInvalid", message), delay_s=30) from exc
    if found is None:
        message = f"KafScaleCluster {spec.cluster} not found"
        raise UserNotReady((False, "ClusterNotFound", message))
    cluster_ref, cluster_spec = found
    cluster = naming.kafscale_cluster_name(cluster_ref, cluster_spec)
    own = spec.authentication.password is None
    secret = UserSecret(secret_of(ref.name, spec), ref.uid, own=own)
    runtime.user_secrets[(ref.namespace, ref.name)] = secret  # for the Secret watch
    password = await _ensure_secret(runtime, ref, spec, cluster)
    mechanism = mechanism_of(spec)
    try:
        async with runtime.cluster_etcd(cluster_ref, cluster_spec) as etcd:
            await sync_credential(etcd, cluster, ref.name, mechanism, password)
            plan = await sync_acls(etcd, cluster, ref.name, desired_bindings(ref.name, spec))
    except (MetadataError, MetadataTimeout) as exc:
        raise UserNotReady((False, "EtcdUnavailable", str(exc)), delay_s=5) from exc
    acls = plan.kept + len(plan.add)
    message = f"{mechanism.sasl_name} credential and {acls} ACL bindings in cluster {cluster}"
    return ref, (True, "UserReady", message), acls


def _secret_name(body: Any) -> str:
    name: str = body["metadata"]["name"]
    try:
        return secret_of(name, parse_user_spec(body.get("spec") or {}))
    except ValidationError:
        return naming.user_secret_name(name)


def _resync_due(body: Any) -> bool:
    """Not being deleted, and the change handlers have reconciled the current spec."""
    meta = body["metadata"]
    status = body.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("observedGeneration") == meta.get(
        "generation"
    )


def register_users(
    registry: kopf.OperatorRegistry,
    config: OperatorSettings,
    metrics: OperatorMetrics,
    errors: HandlerErrors,
) -> UserResync:
    """Register the KafScaleUser handlers into ``registry`` (failures posted by ``errors``);
    returns a user's round for the Secret watch (:mod:`secret_handlers`)."""
    # One reconcile at a time per user: the resync timer and the change handlers run apart.
    locks: dict[tuple[str, str], asyncio.Lock] = {}

    def report(
        body: Any, status: Any, patch: kopf.Patch, verdict: Verdict, acls: int | None
    ) -> None:
        meta = body["metadata"]
        ready = verdict[0]
        previous = parse_conditions(status.get("conditions"))
        new = compute_user_status(
            int(meta.get("generation") or 1),
            previous,
            now=reconcile.utc_now(),
            ready=verdict,
            username=meta["name"],
            secret=_secret_name(body) if ready else status.get("secret"),
            acls=acls,
        )
        patch.status.update(new.to_api())
        for notice in readiness_notices(previous, new.conditions):
            kopf.event(body, type=notice.type, reason=notice.reason, message=notice.message)

    @kopf.on.resume(*USERS, registry=registry)
    @kopf.on.create(*USERS, registry=registry)
    @kopf.on.update(*USERS, field="spec", registry=registry)
    @metrics.timed
    @errors.reported
    async def reconcile_user_resource(
        body: Any, status: Any, patch: kopf.Patch, memo: Any, logger: Any, **_: Any
    ) -> None:
        try:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            async with locks.setdefault(key, asyncio.Lock()):
                _ref, verdict, acls = await reconcile_user(memo.runtime, body)
        except UserNotReady as exc:
            report(body, status, patch, exc.verdict, status.get("acls"))
            if exc.permanent:
                raise kopf.PermanentError(exc.verdict[2]) from exc
            raise kopf.TemporaryError(exc.verdict[2], delay=exc.delay_s) from exc
        report(body, status, patch, verdict, acls)
        logger.info("%s", verdict[2])

    async def resync(
        runtime: Runtime, key: UserKey, patch: kopf.Patch, logger: Any
    ) -> dict[str, Any] | None:
        """The user's round again, its status written into ``patch`` if it changed; read first
        (the timer's body may predate an edit the change handler has applied since), and only
        on a spec the change handlers have reconciled. Returns the body read (None: none)."""
        async with locks.setdefault(key, asyncio.Lock()):
            body = await runtime.kube.get(API_VERSION, USER_KIND, *key)
            if body is None or not _resync_due(body):
                return None
            status = body.get("status") or {}
            acls: int | None
            try:
                _ref, verdict, acls = await reconcile_user(runtime, body)
            except UserNotReady as exc:
                logger.warning("resync: %s", exc.verdict[2])
                verdict, acls = exc.verdict, status.get("acls")
        current: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
        )
        if current.get("reason") != verdict[1] or status.get("acls") != acls:
            report(body, status, patch, verdict, acls)
        return body

    @kopf.timer(
        *USERS,
        interval=config.resync_interval_s,
        initial_delay=config.resync_interval_s,
        registry=registry,
    )
    @metrics.timed
    @errors.reported
    async def resync_user(meta: Any, patch: kopf.Patch, memo: Any, logger: Any, **_: Any) -> None:
        await resync(memo.runtime, (meta["namespace"], meta["name"]), patch, logger)

    async def resync_for_secret(runtime: Runtime, key: UserKey) -> None:
        """The user's round for a change of its password Secret, its status written through
        the API (a Secret's event is no handler of the user's: kopf's ``patch`` cannot)."""
        patch = kopf.Patch()
        body = await resync(runtime, key, patch, log)
        if patch.get("status") and body is not None:
            uid = body["metadata"]["uid"]
            await runtime.kube.patch_status(API_VERSION, USER_KIND, *key, patch["status"], uid=uid)

    @kopf.on.delete(*USERS, registry=registry, retries=10, backoff=3)
    @metrics.timed
    @errors.reported
    async def delete_user_resource(body: Any, meta: Any, memo: Any, logger: Any, **_: Any) -> None:
        runtime: Runtime = memo.runtime
        runtime.user_secrets.pop((meta["namespace"], meta["name"]), None)  # watched no more
        try:
            spec = parse_user_spec(body.get("spec") or {})
        except ValidationError:
            logger.warning("invalid spec: nothing was written to etcd, nothing to remove")
            return
        found = await reconcile.find_cluster(runtime, meta["namespace"], spec.cluster)
        if found is None:
            logger.info("cluster %s is gone: nothing to remove from etcd", spec.cluster)
            return
        cluster_ref, cluster_spec = found
        cluster = naming.kafscale_cluster_name(cluster_ref, cluster_spec)
        key = (meta["namespace"], meta["name"])
        try:
            # After a round under way (a resync, the Secret watch's), not before: its write of
            # the credential would outlive the user. A round after it sees the deletion.
            async with (
                locks.setdefault(key, asyncio.Lock()),
                runtime.cluster_etcd(cluster_ref, cluster_spec) as etcd,
            ):
                credentials, acls = await remove_user(etcd, cluster, meta["name"])
        except (MetadataError, MetadataTimeout) as exc:
            raise kopf.TemporaryError(f"etcd: {exc}", delay=3) from exc
        locks.pop(key, None)
        logger.info(
            "user %s removed from etcd: %d credentials, %d ACL bindings",
            meta["name"],
            credentials,
            acls,
        )

    return resync_for_secret
