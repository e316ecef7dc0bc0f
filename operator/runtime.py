"""Shared state of one operator process (kept in kopf's memo): API client, etcd clients.

The operator talks to each cluster's etcd (managed or external). Connections are pooled per
endpoint list and dropped when etcd stops answering, so the next call reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.storage.s3 import S3ObjectStore
from kafscale.operator import naming
from kafscale.operator.discovery import (
    ASSUME_EVERYTHING,
    ServerCapabilities,
    fetch_capabilities,
    refresh_due,
)
from kafscale.operator.immutable import EtcdInUse, etcd_in_use, judge_mode
from kafscale.operator.kube import Kube, KubeError
from kafscale.operator.manifests import ObjectId
from kafscale.operator.model_base import Condition
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import owned_by
from kafscale.operator.secret_usability import UnusableSecrets
from kafscale.operator.secret_watch import ClusterKey as ClusterKey
from kafscale.operator.secret_watch import UserKey, UserSecret
from kafscale.operator.settings import OperatorSettings
from kafscale.operator.tls_secrets import etcd_client_tls

PoolKey = tuple[tuple[str, ...], EtcdTls | None]


def cluster_key(ref: ClusterRef) -> ClusterKey:
    """What a cluster's own records are kept under: a cluster deleted and made again under
    its name is another cluster (another uid), and inherits none of them."""
    return (ref.namespace, ref.name, ref.uid)


def managed_etcd_host(ref: ClusterRef) -> str:
    """The host of the cluster's managed etcd (its client Service)."""
    return naming.service_host(naming.etcd_client_service_name(ref.name), ref.namespace)


class EtcdPool:
    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._clients: dict[PoolKey, Etcd] = {}
        self._lock = asyncio.Lock()

    async def get(self, endpoints: Sequence[str], tls: EtcdTls | None = None) -> Etcd:
        key = (tuple(endpoints), tls)
        async with self._lock:
            client = self._clients.get(key)
            if client is None or client.closed:
                client = await Etcd.connect(list(endpoints), self._timeout_s, tls=tls)
                self._clients[key] = client
            return client

    async def discard(self, endpoints: Sequence[str], tls: EtcdTls | None = None) -> None:
        async with self._lock:
            client = self._clients.pop((tuple(endpoints), tls), None)
        if client is not None:
            await client.close()

    @contextlib.asynccontextmanager
    async def session(
        self, endpoints: Sequence[str], tls: EtcdTls | None = None
    ) -> AsyncIterator[Etcd]:
        """A pooled client; an outage drops it from the pool (and propagates)."""
        client = await self.get(endpoints, tls)
        try:
            yield client
        except MetadataUnavailable:
            await self.discard(endpoints, tls)
            raise

    async def close(self) -> None:
        async with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    etcd: EtcdPool
    # What the API server serves: asked at start-up, then again at most every
    # ``discovery_interval_s`` (a CRD or API installed later is picked up without a restart).
    capabilities: ServerCapabilities = ASSUME_EVERYTHING
    capabilities_read_at_s: float = 0.0
    # Each record of one cluster below is kept under ``cluster_key`` (namespace, name, uid):
    # a cluster made again under a deleted one's name (as the refused etcd mode switch's hint
    # says to move) inherits none of the deleted one's, even where that deletion was never
    # handled here (its finalizer removed by hand, or given up after its tries). ``forget``
    # drops them all.
    # The capabilities a cluster's objects were last applied with.
    applied_with: dict[ClusterKey, ServerCapabilities] = field(default_factory=dict)
    # The conditions this process last reported (Events go out on changes).
    reported: dict[ClusterKey, list[Condition]] = field(default_factory=dict)
    _discovery_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The last error applying a cluster's objects (cleared on success).
    apply_errors: dict[ClusterKey, str] = field(default_factory=dict)
    # Why the last apply refused a spec change (see ``immutable``), or None.
    refused: dict[ClusterKey, str | None] = field(default_factory=dict)
    # Which objects of the cluster's names the last apply left alone as not the cluster's
    # (see ``conflicts``), or None.
    not_owned: dict[ClusterKey, str | None] = field(default_factory=dict)
    # Those names, each with the uid of the object that held it.
    held_by_others: dict[ClusterKey, dict[ObjectId, str]] = field(default_factory=dict)
    # Secrets of other owners under the cluster's names that its pods cannot use (see
    # ``secret_usability``): the ``Degraded`` message (None: none), and the Secrets as judged.
    unusable_secrets: dict[ClusterKey, str | None] = field(default_factory=dict)
    secrets_judged: dict[ClusterKey, UnusableSecrets] = field(default_factory=dict)
    # Which etcd the cluster's live objects say holds its metadata, as of its last apply (or
    # read from them when first needed: after a restart the topic, user and lease handlers
    # may run first). While a switch of ``etcd.mode`` is refused (``immutable``), the
    # operator's own etcd calls keep to that etcd.
    etcd_in_use: dict[ClusterKey, EtcdInUse] = field(default_factory=dict)
    # The Secret each KafScaleUser's password comes from, as its last round named it (what
    # the Secret watch follows for users: ``secret_watch``); kept by (namespace, name).
    user_secrets: dict[UserKey, UserSecret] = field(default_factory=dict)
    # What the last apply left out because the server does not serve it.
    left_out: dict[ClusterKey, list[str]] = field(default_factory=dict)
    # Private directory for the etcd client certificates the operator presents (gRPC reads files).
    tls_dir: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="kafscale-operator-tls-"))
    )

    @contextlib.asynccontextmanager
    async def cluster_etcd(self, ref: ClusterRef, spec: KafScaleClusterSpec) -> AsyncIterator[Etcd]:
        """A pooled client of the cluster's etcd, over TLS with the cluster's client
        certificate when its managed etcd serves TLS. While a switch of ``etcd.mode`` is
        refused, the etcd the brokers still use."""
        await self.recall_etcd(ref)
        spec = self.in_effect(ref, spec)
        try:
            tls = await etcd_client_tls(self.kube, ref, spec, self.tls_dir)
        except KubeError as exc:
            raise MetadataUnavailable(f"reading the etcd client certificate: {exc}") from exc
        async with self.etcd.session(naming.etcd_endpoints(ref, spec), tls) as etcd:
            yield etcd

    def note_etcd(self, ref: ClusterRef, in_use: EtcdInUse) -> None:
        """What the cluster's live objects say about its etcd, as an apply just read them."""
        self.etcd_in_use[cluster_key(ref)] = in_use

    def knows_etcd(self, ref: ClusterRef) -> bool:
        return cluster_key(ref) in self.etcd_in_use

    async def recall_etcd(self, ref: ClusterRef) -> None:
        """Read which etcd the cluster uses from its live objects, unless known already
        (``MetadataUnavailable`` when the API server cannot say)."""
        if self.knows_etcd(ref):
            return
        try:
            statefulset, config_map = await asyncio.gather(
                self.kube.get("apps/v1", "StatefulSet", ref.namespace, naming.etcd_name(ref.name)),
                self.kube.get("v1", "ConfigMap", ref.namespace, naming.config_map_name(ref.name)),
            )
        except KubeError as exc:
            raise MetadataUnavailable(f"reading which etcd the cluster uses: {exc}") from exc
        owned = [obj if owned_by(obj, ref.uid) else None for obj in (statefulset, config_map)]
        self.etcd_in_use.setdefault(cluster_key(ref), etcd_in_use(*owned))

    def in_effect(self, ref: ClusterRef, spec: KafScaleClusterSpec) -> KafScaleClusterSpec:
        """``spec`` with the etcd section the brokers use while a switch of its mode is refused
        (as far as known: :meth:`recall_etcd` first)."""
        in_use = self.etcd_in_use.get(cluster_key(ref))
        if in_use is None:
            return spec
        _, held = judge_mode(spec.etcd, in_use, managed_etcd_host(ref))
        return spec if held is None else spec.model_copy(update={"etcd": held})

    async def refresh_capabilities(self, now_s: float) -> None:
        """Re-read what the server serves when the last reading is older than the interval.

        One reader at a time; a failed reading keeps the last known capabilities.
        """
        interval = self.settings.discovery_interval_s
        if not refresh_due(self.capabilities_read_at_s, now_s, interval):
            return
        async with self._discovery_lock:
            if not refresh_due(self.capabilities_read_at_s, now_s, interval):
                return
            self.capabilities = await fetch_capabilities(self.kube, fallback=self.capabilities)
            self.capabilities_read_at_s = now_s

    def judged(self, ref: ClusterRef) -> bool:
        """Whether this process has judged the cluster's spec against its live objects (what
        it refuses: ``refused``) since it started."""
        return cluster_key(ref) in self.refused

    def capabilities_changed(self, ref: ClusterRef) -> bool:
        """Whether the server's capabilities changed since this cluster's objects were applied."""
        applied = self.applied_with.get(cluster_key(ref))
        return applied is not None and applied != self.capabilities

    def forget(self, ref: ClusterRef) -> None:
        """Drop what is kept of a deleted cluster."""
        for kept in (
            self.apply_errors,
            self.refused,
            self.not_owned,
            self.held_by_others,
            self.unusable_secrets,
            self.secrets_judged,
            self.left_out,
            self.applied_with,
            self.reported,
            self.etcd_in_use,
        ):
            kept.pop(cluster_key(ref), None)

    async def close(self) -> None:
        await self.etcd.close()
        self.kube.close()
        shutil.rmtree(self.tls_dir, ignore_errors=True)


def storage_settings(
    spec: KafScaleClusterSpec,
    access_key_id: str | None,
    secret_access_key: str | None,
    timeout_s: float,
) -> StorageSettings:
    """The broker's storage settings for a cluster (the operator deletes with the same code)."""
    values: dict[str, object] = {
        "kind": StorageKind.S3,
        "bucket": spec.storage.bucket,
        "prefix": spec.storage.prefix,
        "endpoint": spec.storage.endpoint,
        "region": spec.storage.region,
        "timeout_s": timeout_s,
    }
    if access_key_id is not None and secret_access_key is not None:
        values["access_key_id"] = access_key_id
        values["secret_access_key"] = secret_access_key
    return StorageSettings.model_validate(values)


async def delete_objects(settings: StorageSettings, prefix: str) -> int:
    """Delete every object under ``prefix`` (inside the configured bucket prefix)."""
    store = S3ObjectStore.from_settings(settings)
    try:
        infos = await store.list(prefix)
        await store.delete_many([info.key for info in infos])
        return len(infos)
    finally:
        await store.close()
