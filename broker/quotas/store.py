"""Client quotas in etcd (one key per entity) and each broker's watched copy of them.

Every broker keeps the quotas in a ``QuotaCache`` fed by the cluster watch it already runs
(``metadata.cluster``), so an alteration reaches every broker's enforcement within one watch
round trip and resolving a connection's quota never costs an etcd call. AlterClientQuotas
reads the entities it changes and writes them in one transaction that compares their
revisions: two admins altering one entity at once cannot lose either's keys.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    DeleteOp,
    PutOp,
    create_revision_is,
    delete_op,
    mod_revision_is,
    put_op,
)
from kafscale.broker.protocol.errors import MetadataTimeout
from kafscale.broker.quotas.entities import Entity, make_entity

log = logging.getLogger(__name__)

Quotas = dict[Entity, dict[str, float]]


def encode(values: Mapping[str, float]) -> bytes:
    return json.dumps(dict(sorted(values.items()))).encode()


def decode(cluster: str, key: str, value: bytes) -> tuple[Entity, dict[str, float]] | None:
    """The entity and quotas of one stored key, or None (logged) if unreadable."""
    parts = keys.quota_entity_from_key(cluster, key)
    try:
        if parts is None:
            raise ValueError("not a quota key")
        document = json.loads(value)
        return make_entity(parts), {str(k): float(v) for k, v in document.items()}
    except (ValueError, TypeError, AttributeError):
        log.warning("ignoring unreadable quota record %s", key)
        return None


class QuotaCache:
    """The cluster's quotas by entity, as the watch last reported them."""

    def __init__(self, cluster: str) -> None:
        self._cluster = cluster
        self.quotas: Quotas = {}

    def put(self, key: str, value: bytes) -> None:
        decoded = decode(self._cluster, key, value)
        if decoded is not None:
            self.quotas[decoded[0]] = decoded[1]

    def delete(self, key: str) -> None:
        parts = keys.quota_entity_from_key(self._cluster, key)
        if parts is not None:
            self.quotas.pop(make_entity(parts), None)

    def clear(self) -> None:
        self.quotas.clear()


async def stored_quotas(etcd: Etcd, cluster: str) -> Quotas:
    """Every entity's quotas, read from etcd now (Describe answers what is stored)."""
    try:
        entries = await etcd.get_prefix(keys.quotas_prefix(cluster))
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    found: Quotas = {}
    for entry in entries:
        decoded = decode(cluster, entry.key, entry.value)
        if decoded is not None:
            found[decoded[0]] = decoded[1]
    return found


class ConcurrentChange(Exception):
    """An entity changed between the read and the write: read again."""


async def read_entities(
    etcd: Etcd, cluster: str, entities: Sequence[Entity]
) -> dict[Entity, tuple[dict[str, float], int]]:
    """Each entity's quotas and its key's mod revision (0: absent)."""
    current: dict[Entity, tuple[dict[str, float], int]] = {}
    try:
        for entity in entities:
            kv = await etcd.get(keys.quota_key(cluster, entity))
            if kv is None:
                current[entity] = ({}, 0)
            else:
                decoded = decode(cluster, kv.key, kv.value)
                current[entity] = (decoded[1] if decoded else {}, kv.mod_revision)
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    return current


async def write_entities(
    etcd: Etcd,
    cluster: str,
    updated: Mapping[Entity, dict[str, float]],
    revisions: Mapping[Entity, int],
) -> None:
    """Store ``updated`` (an empty mapping deletes the entity) if no entity changed since
    it was read at ``revisions``; else ``ConcurrentChange``."""
    compares: list[Compare] = []
    ops: list[PutOp | DeleteOp] = []
    for entity, values in updated.items():
        key = keys.quota_key(cluster, entity)
        revision = revisions[entity]
        compares.append(
            create_revision_is(key, 0) if revision == 0 else mod_revision_is(key, revision)
        )
        ops.append(put_op(key, encode(values)) if values else delete_op(key))
    if not ops:
        return
    try:
        result = await etcd.txn(compares, ops)
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    if not result.succeeded:
        raise ConcurrentChange("a quota entity changed while it was altered")
