"""The Secret watch: a Secret a cluster's pods read changes → that cluster is applied again; a
KafScaleUser's password Secret changes → that user's round runs again.

kopf watches ``v1/secrets`` in the served namespaces (less the service-account and Helm
release Secrets, filtered by the API server: :data:`secret_watch.WATCH_FIELD_SELECTOR`). The
handler's filter passes only the Secrets of the names a cluster's last pass judged, and the
handler applies a cluster again only when the change makes a difference to what was judged
(:mod:`secret_watch`); it then writes the cluster's status as the status timer would. A
user's password Secret (its own, or the operator's) runs the user's round as its resync does.

An event handler only: kopf's change handlers (``on.update``, ``on.delete``) keep their state
in an annotation and a finalizer on the object they watch, that is, they would write on the
user's Secrets, which the operator never does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.operator.kube import KubeError
from kafscale.operator.metrics import OperatorMetrics
from kafscale.operator.runtime import ClusterKey, Runtime
from kafscale.operator.secret_watch import (
    WATCH_FIELD_SELECTOR,
    UserKey,
    clusters_reading,
    clusters_to_reapply,
    users_reading,
    users_to_resync,
)

log = logging.getLogger(__name__)

SECRETS = ("", "v1", "secrets")

Reapply = Callable[[Runtime, ClusterKey], Awaitable[None]]
Resync = Callable[[Runtime, UserKey], Awaitable[None]]


def register_secret_watch(
    registry: kopf.OperatorRegistry, metrics: OperatorMetrics, reapply: Reapply, resync: Resync
) -> None:
    """Register the Secret watch into ``registry``; ``reapply`` runs a cluster's pass,
    ``resync`` a KafScaleUser's round."""
    # One pass at a time per cluster: several of its Secrets may change at once.
    locks: dict[ClusterKey, asyncio.Lock] = {}

    @kopf.on.startup(registry=registry)
    async def filter_secret_watch(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.field_selectors[SECRETS] = WATCH_FIELD_SELECTOR

    def read_by_a_cluster_or_user(namespace: Any, name: Any, memo: Any, **_: Any) -> bool:
        runtime: Runtime = memo.runtime
        return bool(
            clusters_reading(runtime.secrets_judged, namespace, name)
            or users_reading(runtime.user_secrets, namespace, name)
        )

    @kopf.on.event(*SECRETS, when=read_by_a_cluster_or_user, registry=registry)
    @metrics.timed
    async def reapply_secret_readers(
        type: Any, body: Any, namespace: Any, name: Any, memo: Any, **_: Any
    ) -> None:
        runtime: Runtime = memo.runtime
        secret = None if type == "DELETED" else dict(body)
        for key in clusters_to_reapply(runtime.secrets_judged, namespace, name, secret):
            log.info("%s/%s: Secret %s changed (%s): applying again", key[0], key[1], name, type)
            try:
                async with locks.setdefault(key, asyncio.Lock()):
                    await reapply(runtime, key)
            except (KubeError, MetadataError) as exc:
                log.warning("%s/%s: applying again for Secret %s: %s", key[0], key[1], name, exc)
        for user in users_to_resync(runtime.user_secrets, namespace, name, secret):
            log.info("KafScaleUser %s/%s: Secret %s changed (%s)", *user, name, type)
            try:
                await resync(runtime, user)
            except KubeError as exc:
                log.warning("KafScaleUser %s/%s: Secret %s: %s", *user, name, exc)
