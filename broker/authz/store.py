"""ACL bindings in etcd (one key per binding) and each broker's cached copy of them.

One key per binding makes CreateAcls idempotent (creating a binding twice writes the same key)
and DeleteAcls exact (only the keys that matched are deleted, in one transaction). Every broker
keeps the bindings in an ``AclCache`` fed by the cluster watch it already runs
(``metadata.cluster``), so a change reaches every live connection within one watch round trip
and authorizing never costs an etcd call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kafscale.broker.authz.index import EMPTY_INDEX, AclIndex
from kafscale.broker.authz.model import AclBinding, AclFilter, filter_matches
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import DeleteOp, PutOp, delete_op, put_op
from kafscale.broker.protocol.errors import MetadataTimeout

log = logging.getLogger(__name__)


def binding_key(cluster: str, binding: AclBinding) -> str:
    return keys.acl_key(
        cluster,
        binding.resource_type.name,
        binding.pattern_type.name,
        binding.resource_name,
        binding.principal,
        binding.host,
        binding.operation.name,
        binding.permission.name,
    )


class AclCache:
    """The cluster's ACL bindings by etcd key, as the watch last reported them, and their
    index (rebuilt on first use after a change: loading thousands at start-up costs one build)."""

    def __init__(self) -> None:
        self._by_key: dict[str, AclBinding] = {}
        self._index: AclIndex | None = EMPTY_INDEX

    @property
    def bindings(self) -> tuple[AclBinding, ...]:
        return tuple(self._by_key.values())

    @property
    def index(self) -> AclIndex:
        if self._index is None:
            self._index = AclIndex.build(self._by_key.values())
        return self._index

    def put(self, key: str, value: bytes) -> None:
        try:
            self._by_key[key] = AclBinding.from_json(value)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable ACL record %s", key)
            return
        self._index = None

    def delete(self, key: str) -> None:
        if self._by_key.pop(key, None) is not None:
            self._index = None

    def clear(self) -> None:
        self._by_key.clear()
        self._index = None


TXN_MAX_OPS = 128
"""etcd's default ``--max-txn-ops``: larger requests are written in several transactions."""


async def _write(etcd: Etcd, ops: list[PutOp | DeleteOp]) -> None:
    try:
        for start in range(0, len(ops), TXN_MAX_OPS):
            await etcd.txn([], ops[start : start + TXN_MAX_OPS])
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc


async def create_bindings(etcd: Etcd, cluster: str, bindings: Iterable[AclBinding]) -> None:
    """Store ``bindings`` (a binding stored already is written again, unchanged)."""
    await _write(etcd, [put_op(binding_key(cluster, b), b.to_json()) for b in bindings])


async def stored_bindings(etcd: Etcd, cluster: str) -> dict[str, AclBinding]:
    """Every stored binding by key, read from etcd now (not from a cache)."""
    try:
        entries = await etcd.get_prefix(keys.acls_prefix(cluster))
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    found = {}
    for entry in entries:
        try:
            found[entry.key] = AclBinding.from_json(entry.value)
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable ACL record %s", entry.key)
    return found


async def delete_matching(
    etcd: Etcd, cluster: str, filters: list[AclFilter]
) -> list[list[AclBinding]]:
    """Delete every binding some filter matches; per filter, the bindings it matched."""
    stored = await stored_bindings(etcd, cluster)
    matched = [
        sorted(b for b in stored.values() if filter_matches(acl_filter, b))
        for acl_filter in filters
    ]
    doomed = {binding_key(cluster, b) for found in matched for b in found}
    await _write(etcd, [delete_op(key) for key in sorted(doomed)])
    return matched
