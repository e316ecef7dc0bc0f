"""The compaction commit (``LogManager.commit_cleaned``) against a real etcd, when etcd applies
the transaction but its answer is lost (a timeout under load, a leader change)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_state import Cleaned, PartitionState
from kafscale.broker.storage.log_manager import LogManager
from kafscale.broker.storage.partition_log import OwnedPartition

pytestmark = pytest.mark.integration

BROKER_ID = 7


class AnswerLost:
    """The real client, whose transactions are applied and then answered with a timeout."""

    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        await self._etcd.txn(*args, **kwargs)
        raise MetadataUnavailable("deadline exceeded (applied)")

    async def get(self, key: str) -> Any:
        return await self._etcd.get(key)


def manager_with(etcd: Any, cluster: str, owned: OwnedPartition) -> LogManager:
    """A LogManager holding ``owned``, with only what ``commit_cleaned`` uses (the commit lock,
    the owned table, the view's update): the commit itself is the real method."""
    manager = LogManager.__new__(LogManager)
    manager._cluster = cluster
    manager._etcd = etcd
    manager._view = SimpleNamespace(update_state=lambda *args: None)  # type: ignore[assignment]
    manager._flusher = SimpleNamespace(commit_lock=asyncio.Lock())  # type: ignore[assignment]
    manager.broker_id = BROKER_ID
    manager.owned = {owned.tp: owned}
    return manager


async def test_an_applied_commit_whose_answer_was_lost_is_taken_as_committed(
    etcd: Etcd, cluster_name: str
) -> None:
    """Fails on the old main: taken as not committed, the partition kept a stale state
    revision, so its next flush commit failed its compare and the partition was given up (its
    produces failed), and the pass's superseded segments were never deleted."""
    lease_key = keys.partition_lease_key(cluster_name, "t", 0)
    state_key = keys.partition_state_key(cluster_name, "t", 0)
    await etcd.put(lease_key, str(BROKER_ID).encode())
    state = PartitionState(high_watermark=10, leader_epoch=2, epochs=((2, 0),))
    state_revision = await etcd.put(state_key, state.to_json())
    lease = await etcd.get(lease_key)
    assert lease is not None
    owned = OwnedPartition("t", 0, "0" * 32, state, state_revision, lease.create_revision)
    manager = manager_with(AnswerLost(etcd), cluster_name, owned)
    cleaned = Cleaned(6, 0, 2)
    assert await manager.commit_cleaned(owned, cleaned, None)
    stored = await etcd.get(state_key)
    assert stored is not None
    assert PartitionState.from_json(stored.value).cleaned == cleaned
    assert owned.state.cleaned == cleaned
    assert owned.state_revision == stored.mod_revision  # the next flush commit's compare holds


async def test_an_unanswered_commit_that_was_not_applied_is_not_taken(
    etcd: Etcd, cluster_name: str
) -> None:
    lease_key = keys.partition_lease_key(cluster_name, "t", 0)
    state_key = keys.partition_state_key(cluster_name, "t", 0)
    await etcd.put(lease_key, str(BROKER_ID).encode())
    state = PartitionState(high_watermark=10, leader_epoch=2, epochs=((2, 0),))
    state_revision = await etcd.put(state_key, state.to_json())
    lease = await etcd.get(lease_key)
    assert lease is not None
    owned = OwnedPartition("t", 0, "0" * 32, state, state_revision, lease.create_revision)

    class Unanswered(AnswerLost):
        async def txn(self, *args: Any, **kwargs: Any) -> Any:
            raise MetadataUnavailable("deadline exceeded (not applied)")

    manager = manager_with(Unanswered(etcd), cluster_name, owned)
    assert not await manager.commit_cleaned(owned, Cleaned(6, 0, 2), None)
    assert owned.state.cleaned is None and owned.state_revision == state_revision
