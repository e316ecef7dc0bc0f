"""Share-partition state in etcd: one JSON value per (group, topic, partition).

Written by the partition's owner in flush rounds (``manager``), many share-partitions in one
transaction that compares the owner's partition leases (value and create revision), as the
log's own commits are fenced: a broker that lost a partition cannot overwrite what its new owner
wrote. Each key's mod revision is compared too (the one the owner read or last wrote): an admin
change (AlterShareGroupOffsets, DeleteShareGroupOffsets, written by the group's coordinator) is
never overwritten by an owner's older state; the owner reads the key again instead.

The document: ``{"topic_id", "start", "batches": [[first, last, count, state], ...]}``. A value
for another topic id (the topic was deleted and re-created) is ignored.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.broker.groups.store import decode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    DeleteOp,
    PutOp,
    create_revision_is,
    mod_revision_is,
    value_is,
)
from kafscale.broker.metadata.share_members import decode_share_members
from kafscale.broker.share.partition import SharePartition


@dataclass(frozen=True, slots=True)
class StateWrite:
    group: str
    topic: str
    partition: int
    lease_revision: int
    expected_revision: int
    """The key's mod revision the owner knows (0: the key does not exist)."""
    value: bytes
    group_revision: int = 0
    """For the write that creates the key (``expected_revision`` 0): the create revision of the
    group's metadata key the share-partition was started under (0: not checked). A group
    deleted (DeleteGroups deletes its states in the same transaction) while the first write was
    on its way must not get a state back."""


def encode(topic_id: str, partition: SharePartition) -> bytes:
    document = {
        "topic_id": topic_id,
        "start": partition.start_offset,
        "batches": partition.durable(),
    }
    return json.dumps(document, separators=(",", ":")).encode()


def decode(data: bytes, topic_id: str) -> SharePartition | None:
    document = json.loads(data)
    if document.get("topic_id") != topic_id:
        return None
    batches = [(int(a), int(b), int(c), int(d)) for a, b, c, d in document.get("batches") or ()]
    return SharePartition.restore(int(document["start"]), batches)


def refused_writes(
    writes: Sequence[StateWrite],
    cluster: str,
    me: bytes,
    leases: dict[str, tuple[bytes, int]],
    states: dict[str, int],
    groups: dict[str, int] | None = None,
) -> set[int]:
    """Which of ``writes`` a flush transaction's compares refuse, given each partition lease's
    (value, create revision) and each state key's mod revision as etcd has them now (a key
    absent from the maps does not exist): the lease is not ``me``'s under the write's revision,
    the state moved since the owner read or wrote it, or (a creating write) the group's metadata
    key is not the one it was started under (``groups``: each metadata key's create revision)."""
    refused = set()
    for index, write in enumerate(writes):
        lease = leases.get(keys.partition_lease_key(cluster, write.topic, write.partition))
        state_key = keys.share_state_key(cluster, write.group, write.topic, write.partition)
        if (
            lease != (me, write.lease_revision)
            or states.get(state_key, 0) != (write.expected_revision)
            or (
                _checks_group(write)
                and (groups or {}).get(keys.group_metadata_key(cluster, write.group), 0)
                != write.group_revision
            )
        ):
            refused.add(index)
    return refused


def _checks_group(write: StateWrite) -> bool:
    return write.expected_revision == 0 and write.group_revision != 0


class ShareStateStore:
    def __init__(self, etcd: Etcd, cluster: str, node_id: int) -> None:
        self._etcd = etcd
        self._cluster = cluster
        self._me = str(node_id).encode()

    def _key(self, group: str, topic: str, partition: int) -> str:
        return keys.share_state_key(self._cluster, group, topic, partition)

    async def load(
        self, group: str, topic: str, partition: int, topic_id: str
    ) -> tuple[SharePartition | None, int]:
        """The stored state (None: none, or another topic's) and the key's mod revision."""
        kv = await self._etcd.get(self._key(group, topic, partition))
        if kv is None:
            return None, 0
        return decode(kv.value, topic_id), kv.mod_revision

    async def share_group_revision(self, group: str) -> int:
        """The create revision of ``group``'s metadata key if etcd holds it as a share group
        (its coordinator wrote it at the first join, or at an offset admin call), else 0: only
        then may a share-partition start for it, and its first write is fenced by it."""
        kv = await self._etcd.get(keys.group_metadata_key(self._cluster, group))
        if kv is None or decode_group(kv.value).group_type != "share":
            return 0
        return kv.create_revision

    async def has_member(self, group: str, member_id: str) -> bool:
        """Whether etcd's copy of ``group`` (a share group) names ``member_id``: the one read a
        share-partition leader makes when its cluster watch has not shown the member yet."""
        kv = await self._etcd.get(keys.group_metadata_key(self._cluster, group))
        members = None if kv is None else decode_share_members(kv.value)
        return members is not None and member_id in members

    async def revision(self, group: str, topic: str, partition: int) -> int:
        kv = await self._etcd.get(self._key(group, topic, partition))
        return 0 if kv is None else kv.mod_revision

    async def save(self, writes: Sequence[StateWrite]) -> int | None:
        """Every write in one transaction, fenced by the partition leases named and by each
        key's expected mod revision: the revision written, or None if a check failed."""
        compares: list[Compare] = []
        leases: set[str] = set()
        for write in writes:
            lease_key = keys.partition_lease_key(self._cluster, write.topic, write.partition)
            if lease_key not in leases:
                leases.add(lease_key)
                compares += [
                    value_is(lease_key, self._me),
                    create_revision_is(lease_key, write.lease_revision),
                ]
            key = self._key(write.group, write.topic, write.partition)
            compares.append(mod_revision_is(key, write.expected_revision))
            if _checks_group(write):
                metadata_key = keys.group_metadata_key(self._cluster, write.group)
                compares.append(create_revision_is(metadata_key, write.group_revision))
        puts = [PutOp(self._key(w.group, w.topic, w.partition), w.value) for w in writes]
        result = await self._etcd.txn(compares, puts)
        return result.revision if result.succeeded else None

    async def refused(self, writes: Sequence[StateWrite]) -> set[int]:
        """After ``save`` failed: the writes whose own checks fail (etcd does not say which
        compare of a transaction failed), read back. The others may be saved again."""
        lease_keys = sorted(
            {keys.partition_lease_key(self._cluster, w.topic, w.partition) for w in writes}
        )
        state_keys = [self._key(w.group, w.topic, w.partition) for w in writes]
        group_keys = sorted(
            {keys.group_metadata_key(self._cluster, w.group) for w in writes if _checks_group(w)}
        )
        found = await asyncio.gather(
            *(self._etcd.get(k) for k in [*lease_keys, *state_keys, *group_keys])
        )
        ends = len(lease_keys), len(lease_keys) + len(state_keys)
        leases = {
            k: (kv.value, kv.create_revision)
            for k, kv in zip(lease_keys, found[: ends[0]], strict=True)
            if kv is not None
        }
        states = {
            k: kv.mod_revision
            for k, kv in zip(state_keys, found[ends[0] : ends[1]], strict=True)
            if kv is not None
        }
        groups = {
            k: kv.create_revision
            for k, kv in zip(group_keys, found[ends[1] :], strict=True)
            if kv is not None
        }
        return refused_writes(writes, self._cluster, self._me, leases, states, groups)

    async def load_group(self, group: str) -> dict[tuple[str, int], tuple[str, SharePartition]]:
        """Every share-partition of ``group`` in etcd: (topic, partition) -> (topic id, state)."""
        prefix = keys.share_states_prefix(self._cluster, group)
        found: dict[tuple[str, int], tuple[str, SharePartition]] = {}
        for entry in await self._etcd.get_prefix(prefix):
            topic, _, partition = entry.key[len(prefix) :].rpartition("/")
            topic_id = str(json.loads(entry.value).get("topic_id", ""))
            state = decode(entry.value, topic_id)
            if topic and partition.isdigit() and state is not None:
                found[(topic, int(partition))] = (topic_id, state)
        return found

    async def replace(
        self,
        fence: Sequence[Compare],
        starts: dict[tuple[str, int], tuple[str, int]],
        deleted_topics: Sequence[str],
        group: str,
    ) -> bool:
        """An admin change by the group's coordinator (``fence``: its group lease): each
        (topic, partition) in ``starts`` restarts at (topic id, start offset) with nothing in
        flight; every share-partition of ``deleted_topics`` goes. False if fenced."""
        ops: list[PutOp | DeleteOp] = [
            PutOp(
                self._key(group, topic, partition),
                encode(topic_id, SharePartition(start)),
            )
            for (topic, partition), (topic_id, start) in starts.items()
        ]
        prefix = keys.share_states_prefix(self._cluster, group)
        ops += [DeleteOp(f"{prefix}{topic}/", prefix=True) for topic in deleted_topics]
        result = await self._etcd.txn(list(fence), ops)
        return result.succeeded
