"""Transaction state in etcd, and the offsets committed inside transactions.

Layout (keys from ``keys``; values JSON)::

    transactions/<transactional id>                        TxnMetadata
    groups/<group>/txn-offsets/<producer id>/<topic>/<p>   an offset pending its transaction

Every write of a transaction's metadata compares the transactional id's coordinator lease
(owner value and create revision), so a coordinator that lost its lease cannot write. Pending
offsets are written by the group's coordinator (TxnOffsetCommit) under the group lease and only
while the transaction record is unchanged since it was checked (its mod revision), so an offset
can never slip in after the transaction was decided. When the transaction completes its
coordinator moves them to ``groups/<group>/offsets/...`` (commit) or deletes them (abort).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kafscale.broker.groups.store import (
    MAX_OPS_PER_TXN,
    CommittedOffset,
    Fence,
    decode_offset,
    encode_offset,
    parse_pending_key,
)
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import KeyValue, Op, delete_op, mod_revision_is, put_op
from kafscale.broker.transactions.state import TopicPartition, TxnMetadata, TxnState


def encode_metadata(meta: TxnMetadata) -> bytes:
    document = {
        "transactional_id": meta.transactional_id,
        "producer_id": meta.producer_id,
        "producer_epoch": meta.producer_epoch,
        "timeout_ms": meta.timeout_ms,
        "state": meta.state.value,
        "partitions": sorted([t, p] for t, p in meta.partitions),
        "groups": sorted(meta.groups),
        "start_ms": meta.start_ms,
        "updated_ms": meta.updated_ms,
        "previous_producer_id": meta.previous_producer_id,
        "previous_epoch": meta.previous_epoch,
        "next_producer_id": meta.next_producer_id,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode_metadata(data: bytes) -> TxnMetadata:
    document = json.loads(data)
    return TxnMetadata(
        transactional_id=str(document["transactional_id"]),
        producer_id=int(document["producer_id"]),
        producer_epoch=int(document["producer_epoch"]),
        timeout_ms=int(document["timeout_ms"]),
        state=TxnState(document.get("state", TxnState.EMPTY.value)),
        partitions=frozenset((str(t), int(p)) for t, p in document.get("partitions", [])),
        groups=frozenset(str(g) for g in document.get("groups", [])),
        start_ms=int(document.get("start_ms", -1)),
        updated_ms=int(document.get("updated_ms", -1)),
        previous_producer_id=int(document.get("previous_producer_id", -1)),
        previous_epoch=int(document.get("previous_epoch", -1)),
        next_producer_id=int(document.get("next_producer_id", -1)),
    )


@dataclass(frozen=True, slots=True)
class StoredTxn:
    metadata: TxnMetadata
    mod_revision: int


class TxnStore:
    """Reads and fenced writes of one cluster's transaction state."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self._etcd = etcd
        self._cluster = cluster

    async def load(self, transactional_id: str) -> StoredTxn | None:
        entry = await self._etcd.get(keys.transaction_key(self._cluster, transactional_id))
        if entry is None:
            return None
        return StoredTxn(decode_metadata(entry.value), entry.mod_revision)

    async def save(self, meta: TxnMetadata, fence: Fence) -> bool:
        """Write ``meta``; False if the coordinator lease is no longer ours."""
        key = keys.transaction_key(self._cluster, meta.transactional_id)
        result = await self._etcd.txn(fence.compares(), [put_op(key, encode_metadata(meta))])
        return result.succeeded

    async def delete(self, transactional_id: str, fence: Fence, mod_revision: int) -> bool:
        """Remove an expired record, if the lease is ours and nobody wrote it since it was read
        (``mod_revision``): a producer that came back meanwhile keeps its record."""
        key = keys.transaction_key(self._cluster, transactional_id)
        compares = [*fence.compares(), mod_revision_is(key, mod_revision)]
        result = await self._etcd.txn(compares, [delete_op(key)])
        return result.succeeded

    async def list_all(self) -> list[TxnMetadata]:
        entries = await self._etcd.get_prefix(keys.transactions_prefix(self._cluster))
        return [decode_metadata(entry.value) for entry in entries]

    # --- offsets committed in a transaction ---------------------------------------------------

    async def save_pending_offsets(
        self,
        group_id: str,
        stored: StoredTxn,
        offsets: Mapping[TopicPartition, CommittedOffset],
        group_fence: Fence,
    ) -> bool:
        """TxnOffsetCommit: False if the group lease is gone or the transaction moved on."""
        meta = stored.metadata
        txn_key = keys.transaction_key(self._cluster, meta.transactional_id)
        compares = [*group_fence.compares(), mod_revision_is(txn_key, stored.mod_revision)]
        ops: list[Op] = [
            put_op(
                keys.group_txn_offset_key(self._cluster, group_id, meta.producer_id, t, p),
                encode_offset(committed),
            )
            for (t, p), committed in offsets.items()
        ]
        for start in range(0, len(ops), MAX_OPS_PER_TXN):
            result = await self._etcd.txn(compares, ops[start : start + MAX_OPS_PER_TXN])
            if not result.succeeded:
                return False
        return True

    async def pending_offsets(
        self, group_id: str, producer_id: int | None = None
    ) -> dict[tuple[int, TopicPartition], KeyValue]:
        """A group's pending offsets as stored (value and revisions), keyed by (producer id,
        partition)."""
        prefix = keys.group_txn_offsets_prefix(self._cluster, group_id, producer_id)
        base = keys.group_txn_offsets_prefix(self._cluster, group_id)
        found: dict[tuple[int, TopicPartition], KeyValue] = {}
        for entry in await self._etcd.get_prefix(prefix):
            parsed = parse_pending_key(entry.key[len(base) :])
            if parsed is not None:
                found[parsed] = entry
        return found

    async def finish_offsets(
        self, group_id: str, producer_id: int, commit: bool, fence: Fence
    ) -> bool:
        """Make a transaction's offsets for ``group_id`` visible (commit) or drop them (abort),
        under the transaction lease; False if fenced (MetadataUnavailable when etcd cannot be
        reached, or pending offsets kept being deleted under it: retry). Idempotent: a retry
        finds none left.

        A commit moves only offsets still pending as read: each move compares the pending
        key's revision, so one deleted meanwhile (OffsetDelete drops pending offsets, as
        Kafka's tombstone does) is not brought back; the rest are read again and moved."""
        for _ in range(FINISH_ATTEMPTS):
            pending = await self.pending_offsets(group_id, producer_id)
            if await self._move_pending(group_id, pending, commit, fence):
                return True
            if not await self._holds(fence):
                return False  # the lease is gone: only now is the transaction not ours
        # Still ours, but OffsetDeletes kept removing pending offsets under each attempt: not
        # a lost lease (which would drop the transaction half-completed), try again later.
        raise MetadataUnavailable(
            f"pending offsets of producer {producer_id} in group {group_id} kept changing"
        )

    async def _holds(self, fence: Fence) -> bool:
        """Whether the transaction lease is still ours (an empty fenced etcd transaction)."""
        return (await self._etcd.txn(fence.compares(), [])).succeeded

    async def _move_pending(
        self,
        group_id: str,
        pending: Mapping[tuple[int, TopicPartition], KeyValue],
        commit: bool,
        fence: Fence,
    ) -> bool:
        """One attempt; False if a compare failed (the fence, or a pending key changed)."""
        for chunk in _chunks(sorted(pending.items()), MAX_OPS_PER_TXN // 2):
            compares = list(fence.compares())
            ops: list[Op] = []
            for (_pid, (topic, p)), entry in chunk:
                if commit:
                    compares.append(mod_revision_is(entry.key, entry.mod_revision))
                    key = keys.group_offset_key(self._cluster, group_id, topic, p)
                    ops.append(put_op(key, encode_offset(decode_offset(entry.value))))
                # A put and its delete stay in one etcd transaction, so a partition's offset
                # is never both pending and gone.
                ops.append(delete_op(entry.key))
            result = await self._etcd.txn(compares, ops)
            if not result.succeeded:
                return False
        return True


FINISH_ATTEMPTS = 5
"""Rounds of a commit's offset move lost to concurrent OffsetDeletes before the completion
steps back (MetadataUnavailable: its caller retries after a pause)."""


def _chunks(
    items: list[tuple[tuple[int, TopicPartition], KeyValue]], size: int
) -> Iterable[list[tuple[tuple[int, TopicPartition], KeyValue]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
