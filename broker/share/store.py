"""Share-partition state in etcd: one JSON value per (group, topic, partition).

Written by the partition's owner in flush rounds (``manager``), many share-partitions in one
transaction that compares the owner's partition leases (value and create revision), as the
log's own commits are fenced: a broker that lost a partition cannot overwrite what its new owner
wrote. The document: ``{"topic_id", "start", "batches": [[first, last, count, state], ...]}``.
A value for another topic id (the topic was deleted and re-created) is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import Compare, PutOp, create_revision_is, value_is
from kafscale.broker.share.partition import SharePartition


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


class ShareStateStore:
    def __init__(self, etcd: Etcd, cluster: str, node_id: int) -> None:
        self._etcd = etcd
        self._cluster = cluster
        self._me = str(node_id).encode()

    async def load(
        self, group: str, topic: str, partition: int, topic_id: str
    ) -> SharePartition | None:
        kv = await self._etcd.get(keys.share_state_key(self._cluster, group, topic, partition))
        return None if kv is None else decode(kv.value, topic_id)

    async def save(self, writes: Sequence[tuple[str, str, int, int, bytes]]) -> bool:
        """(group, topic, partition, lease revision, value) in one transaction, fenced by
        every partition lease named; False if one is no longer ours."""
        compares: dict[str, Compare] = {}
        fence: list[Compare] = []
        for _, topic, partition, lease_revision, _ in writes:
            lease_key = keys.partition_lease_key(self._cluster, topic, partition)
            if lease_key not in compares:
                compares[lease_key] = value_is(lease_key, self._me)
                fence += [compares[lease_key], create_revision_is(lease_key, lease_revision)]
        puts = [
            PutOp(keys.share_state_key(self._cluster, group, topic, partition), value)
            for group, topic, partition, _, value in writes
        ]
        result = await self._etcd.txn(fence, puts)
        return result.succeeded

    async def load_group(self, group: str) -> dict[tuple[str, int], tuple[str, SharePartition]]:
        """Every share-partition of ``group`` in etcd: (topic, partition) -> (topic id, state)."""
        prefix = keys.share_states_prefix(self._cluster, group)
        found: dict[tuple[str, int], tuple[str, SharePartition]] = {}
        for entry in await self._etcd.get_prefix(prefix):
            topic, _, partition = entry.key[len(prefix) :].rpartition("/")
            document = json.loads(entry.value)
            topic_id = str(document.get("topic_id", ""))
            state = decode(entry.value, topic_id)
            if topic and partition.isdigit() and state is not None:
                found[(topic, int(partition))] = (topic_id, state)
        return found

    async def delete_group(self, group: str) -> None:
        await self._etcd.delete_prefix(keys.share_states_prefix(self._cluster, group))
