"""Races between a group's offset requests, on the request handlers and a group runtime over a
real etcd, each made deterministic by a store that pauses at the critical point.

* OffsetDelete decides (group empty, topic not subscribed) and deletes atomically with respect
  to the group's commits: a member that joined while the delete waited for an in-flight commit
  keeps the offsets of its topics (GROUP_SUBSCRIBED_TO_TOPIC), as Kafka's group lock gives.
* Re-reading offsets pending in a transaction (OffsetFetch) neither drops a TxnOffsetCommit
  that arrived while etcd was read (its offset, committed later, was never re-read: the group
  answered the older offset for good) nor overwrites a newer OffsetCommit with what it read.
* OffsetDelete drops the offsets pending in open transactions, as Kafka's tombstone does; a
  transaction coordinator that read them just before moves nothing back when it goes on.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from harness.subscribed_groups import subscription

from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.api.group_offsets import handle_offset_commit, handle_offset_fetch
from kafscale.broker.api.offset_delete import handle_offset_delete
from kafscale.broker.api.transactions import handle_txn_offset_commit
from kafscale.broker.authz.store import AclCache
from kafscale.broker.config import BrokerSettings
from kafscale.broker.groups.leases import GroupLeases
from kafscale.broker.groups.model import GroupConfig, JoinRequest
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.store import (
    CommittedOffset,
    Fence,
    GroupStore,
    LoadedGroup,
    TopicPartition,
    decode_offset,
    encode_offset,
)
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.protocol.codec import RequestHeader
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.server import Connection
from kafscale.broker.transactions.state import TxnMetadata, TxnState
from kafscale.broker.transactions.store import TxnStore, encode_metadata

pytestmark = pytest.mark.integration

CONFIG = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=1000)
GROUP, TOPIC, OTHER = "g", "t", "u"
TP: TopicPartition = (TOPIC, 0)
OFFSET_COMMIT, OFFSET_FETCH, OFFSET_DELETE, TXN_OFFSET_COMMIT = 8, 9, 47, 28
LOCK_WAIT_S = 2.0
"""How long a test lets a request run before the paused one goes on: enough for it to finish
unless it (rightly) waits for the paused one. Decides an interleaving, asserts nothing."""


class PausingStore(GroupStore):
    """A ``GroupStore`` whose next call of an armed method stops (after its etcd read, before
    its etcd write) until released."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        super().__init__(etcd, cluster)
        self._gates: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}

    def arm(self, method: str) -> tuple[asyncio.Event, asyncio.Event]:
        """(reached, release) for the next call of ``method``."""
        gate = (asyncio.Event(), asyncio.Event())
        self._gates[method] = gate
        return gate

    async def _hold(self, method: str) -> None:
        gate = self._gates.pop(method, None)
        if gate is not None:
            reached, release = gate
            reached.set()
            await release.wait()

    async def load(self, group_id: str) -> LoadedGroup:
        loaded = await super().load(group_id)
        await self._hold("load")
        return loaded

    async def save_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset], fence: Fence
    ) -> bool:
        await self._hold("save_offsets")
        return await super().save_offsets(group_id, offsets, fence)


class PausingTxnStore(TxnStore):
    """A ``TxnStore`` whose first read of pending offsets stops until released: a transaction
    coordinator between reading a commit's pending offsets and moving them."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        super().__init__(etcd, cluster)
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def pending_offsets(
        self, group_id: str, producer_id: int | None = None
    ) -> dict[tuple[int, TopicPartition], KeyValue]:
        found = await super().pending_offsets(group_id, producer_id)
        if not self.reached.is_set():
            self.reached.set()
            await self.release.wait()
        return found


@dataclass
class Coordinated:
    """One group coordinated here: its runtime, the store under it, and request contexts."""

    etcd: Etcd
    cluster: str
    store: PausingStore
    runtime: GroupRuntime
    txn_fence: Fence

    def context(self, api_key: int, version: int) -> RequestContext:
        topics = {n: TopicInfo(n, f"{i:032x}", 1) for i, n in enumerate((TOPIC, OTHER), 1)}
        view = SimpleNamespace(acls=AclCache(), topics=topics)

        async def runtime(_group_id: str) -> GroupRuntime:
            return self.runtime

        broker = SimpleNamespace(
            settings=BrokerSettings(),
            view=view,
            cluster=self.cluster,
            groups=SimpleNamespace(runtime=runtime),
            transactions=SimpleNamespace(store=TxnStore(self.etcd, self.cluster), verifier=None),
        )
        header = RequestHeader(api_key, version, 1, "test")
        return RequestContext(header, broker, Connection("127.0.0.1:5000"))  # type: ignore[arg-type]

    async def commit(self, offset: int, partition: TopicPartition = TP) -> int:
        request = SimpleNamespace(
            group_id=GROUP,
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=[_topic(partition, committed_offset=offset, committed_leader_epoch=-1)],
        )
        body = await handle_offset_commit(request, self.context(OFFSET_COMMIT, 8))
        return int(body["topics"][0]["partitions"][0]["error_code"])

    async def fetch(self, require_stable: bool = False) -> tuple[int, int]:
        """(error code, committed offset) of ``TP``."""
        topics = [SimpleNamespace(name=TOPIC, partition_indexes=[0])]
        request = SimpleNamespace(group_id=GROUP, topics=topics, require_stable=require_stable)
        body = await handle_offset_fetch(request, self.context(OFFSET_FETCH, 7))
        (partition,) = body["topics"][0]["partitions"]
        return int(partition["error_code"]), int(partition["committed_offset"])

    async def begin(self, txn_id: str, producer_id: int) -> None:
        """An ongoing transaction that added the group (AddOffsetsToTxn done)."""
        meta = TxnMetadata(
            txn_id, producer_id, 0, 60_000, TxnState.ONGOING, groups=frozenset({GROUP})
        )
        await self.etcd.put(keys.transaction_key(self.cluster, txn_id), encode_metadata(meta))

    async def txn_commit(self, txn_id: str, producer_id: int, offset: int) -> int:
        request = SimpleNamespace(
            transactional_id=txn_id,
            group_id=GROUP,
            producer_id=producer_id,
            producer_epoch=0,
            generation_id=-1,
            member_id="",
            group_instance_id=None,
            topics=[_topic(TP, committed_offset=offset, committed_leader_epoch=-1)],
        )
        body = await handle_txn_offset_commit(request, self.context(TXN_OFFSET_COMMIT, 3))
        return int(body["topics"][0]["partitions"][0]["error_code"])

    async def end(self, producer_id: int) -> None:
        """The transaction coordinator commits: the pending offsets become visible."""
        store = TxnStore(self.etcd, self.cluster)
        assert await store.finish_offsets(GROUP, producer_id, True, self.txn_fence)

    async def delete_offsets(self, *partitions: TopicPartition) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for topic, p in partitions:
            by_topic.setdefault(topic, []).append(p)
        request = SimpleNamespace(
            group_id=GROUP,
            topics=[
                SimpleNamespace(name=t, partitions=[SimpleNamespace(partition_index=p) for p in ps])
                for t, ps in by_topic.items()
            ],
        )
        body = await handle_offset_delete(request, self.context(OFFSET_DELETE, 0))
        assert body["error_code"] == ErrorCode.NONE, body
        return {
            (t["name"], p["partition_index"]): int(p["error_code"])
            for t in body["topics"]
            for p in t["partitions"]
        }

    async def stored_offset(self, partition: TopicPartition = TP) -> int | None:
        entry = await self.etcd.get(keys.group_offset_key(self.cluster, GROUP, *partition))
        return None if entry is None else decode_offset(entry.value).offset


def _topic(partition: TopicPartition, **fields: Any) -> SimpleNamespace:
    part = SimpleNamespace(partition_index=partition[1], committed_metadata="", **fields)
    return SimpleNamespace(name=partition[0], partitions=[part])


@pytest.fixture
async def group(etcd: Etcd, cluster_name: str) -> AsyncIterator[Coordinated]:
    session = await SessionLease.start(etcd, 10)
    fence = await GroupLeases(etcd, cluster_name, lambda *_: None).acquire(GROUP, 1, session.id)
    assert fence is not None
    txn_key = f"/{cluster_name}-txn-lease"
    await etcd.put(txn_key, b"1")
    entry = await etcd.get(txn_key)
    assert entry is not None
    store = PausingStore(etcd, cluster_name)
    runtime = GroupRuntime(GROUP, fence, store, CONFIG, LoadedGroup(None, {}), lambda *_: None)
    try:
        yield Coordinated(
            etcd, cluster_name, store, runtime, Fence(txn_key, b"1", entry.create_revision)
        )
    finally:
        for task in runtime.unload():
            await asyncio.gather(task, return_exceptions=True)
        await session.revoke()


def join_request(*topics: str) -> JoinRequest:
    return JoinRequest(
        member_id="",
        group_instance_id=None,
        client_id="c",
        client_host="/h",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=(("range", subscription(topics)),),
        require_known_member_id=False,
        supports_skip_assignment=False,
        fresh_id=uuid.uuid4().hex,
    )


async def test_a_member_that_joined_while_offset_delete_waited_keeps_its_topics_offsets(
    group: Coordinated,
) -> None:
    assert await group.commit(5) == ErrorCode.NONE
    reached, release = group.store.arm("save_offsets")
    in_flight = asyncio.create_task(group.commit(7, (OTHER, 0)))  # holds the commit path
    await asyncio.wait_for(reached.wait(), 10)
    deleting = asyncio.create_task(group.delete_offsets(TP))  # the group is Empty now
    await asyncio.wait({deleting}, timeout=LOCK_WAIT_S)
    # A consumer of TOPIC joins before the deletion happened: the group is no longer empty.
    joined = await asyncio.wait_for(group.runtime.join(join_request(TOPIC)), 10)
    assert joined.error is ErrorCode.NONE
    release.set()
    assert await in_flight == ErrorCode.NONE
    assert await asyncio.wait_for(deleting, 10) == {TP: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC}
    assert await group.fetch() == (ErrorCode.NONE, 5)
    assert await group.stored_offset() == 5
    # Once its member stops consuming the topic, the same request deletes the offset.
    group.runtime.leave([(joined.member_id, None)])
    assert await group.delete_offsets(TP) == {TP: ErrorCode.NONE}
    assert await group.fetch() == (ErrorCode.NONE, -1)
    assert await group.stored_offset() is None


async def test_offset_delete_after_a_commit_it_waited_for_deletes_that_commit(
    group: Coordinated,
) -> None:
    """The deletion's view of what is committed is taken with the decision, after the commit
    it waited for: nothing committed before it answered survives it."""
    reached, release = group.store.arm("save_offsets")
    committing = asyncio.create_task(group.commit(9))  # the first offset of TP, in flight
    await asyncio.wait_for(reached.wait(), 10)
    deleting = asyncio.create_task(group.delete_offsets(TP))
    await asyncio.wait({deleting}, timeout=LOCK_WAIT_S)
    release.set()
    assert await committing == ErrorCode.NONE
    assert await asyncio.wait_for(deleting, 10) == {TP: ErrorCode.NONE}
    assert await group.fetch() == (ErrorCode.NONE, -1)
    assert await group.stored_offset() is None


async def test_a_txn_offset_commit_during_the_pending_reread_stays_pending(
    group: Coordinated,
) -> None:
    await group.begin("tx1", 1)
    assert await group.txn_commit("tx1", 1, 10) == ErrorCode.NONE
    await group.end(1)  # offset 10 visible in etcd; the runtime still counts TP pending
    reached, release = group.store.arm("load")
    fetching = asyncio.create_task(group.fetch())
    await asyncio.wait_for(reached.wait(), 10)  # etcd read: 10, nothing pending
    await group.begin("tx2", 2)
    committing = asyncio.create_task(group.txn_commit("tx2", 2, 20))
    await asyncio.wait({committing}, timeout=LOCK_WAIT_S)
    release.set()
    assert await asyncio.wait_for(fetching, 10) == (ErrorCode.NONE, 10)
    assert await asyncio.wait_for(committing, 10) == ErrorCode.NONE
    # tx2 is open: a read_committed consumer is told to wait for it (KIP-447) ...
    assert await group.fetch(require_stable=True) == (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1)
    await group.end(2)
    # ... and once it committed, everyone reads its offset.
    assert await group.fetch(require_stable=True) == (ErrorCode.NONE, 20)
    assert await group.fetch() == (ErrorCode.NONE, 20)


async def test_the_pending_reread_never_overwrites_a_newer_commit(group: Coordinated) -> None:
    await group.begin("tx1", 1)
    assert await group.txn_commit("tx1", 1, 10) == ErrorCode.NONE
    await group.end(1)
    reached, release = group.store.arm("load")
    fetching = asyncio.create_task(group.fetch())
    await asyncio.wait_for(reached.wait(), 10)  # etcd read: 10
    committing = asyncio.create_task(group.commit(30))
    await asyncio.wait({committing}, timeout=LOCK_WAIT_S)
    release.set()
    assert await asyncio.wait_for(fetching, 10) in ((ErrorCode.NONE, 10), (ErrorCode.NONE, 30))
    assert await asyncio.wait_for(committing, 10) == ErrorCode.NONE
    assert await group.stored_offset() == 30
    assert await group.fetch() == (ErrorCode.NONE, 30)


async def test_offset_delete_drops_an_offset_pending_in_a_transaction_being_committed(
    group: Coordinated,
) -> None:
    """The transaction coordinator read the pending offset, then OffsetDelete removed it (and
    the committed one): the commit goes on without bringing either back."""
    assert await group.commit(5) == ErrorCode.NONE
    await group.begin("tx1", 1)
    assert await group.txn_commit("tx1", 1, 10) == ErrorCode.NONE
    txn_store = PausingTxnStore(group.etcd, group.cluster)
    ending = asyncio.create_task(txn_store.finish_offsets(GROUP, 1, True, group.txn_fence))
    await asyncio.wait_for(txn_store.reached.wait(), 10)  # read: offset 10 pending
    assert await group.delete_offsets(TP) == {TP: ErrorCode.NONE}
    txn_store.release.set()
    assert await asyncio.wait_for(ending, 10)  # not fenced: nothing was left to move
    assert await group.stored_offset() is None
    assert await group.fetch(require_stable=True) == (ErrorCode.NONE, -1)


async def test_deleting_the_group_drops_its_offsets_pending_in_a_transaction(
    group: Coordinated,
) -> None:
    """DeleteGroups removes the offsets pending in open transactions too (Kafka's
    ``deleteAllOffsets``): the transaction's commit later brings none back."""
    assert await group.commit(5) == ErrorCode.NONE
    await group.begin("tx1", 1)
    assert await group.txn_commit("tx1", 1, 10) == ErrorCode.NONE
    assert await group.runtime.delete() == ErrorCode.NONE
    await group.end(1)
    assert await group.stored_offset() is None
    pending = keys.group_txn_offsets_prefix(group.cluster, GROUP)
    assert await group.etcd.get_prefix(pending) == []


class DeletingTxnStore(TxnStore):
    """A ``TxnStore`` under which one pending offset of the transaction is deleted after each
    read, ``rounds`` times: an OffsetDelete landing between every read and move."""

    def __init__(self, etcd: Etcd, cluster: str, rounds: int) -> None:
        super().__init__(etcd, cluster)
        self.rounds = rounds

    async def pending_offsets(
        self, group_id: str, producer_id: int | None = None
    ) -> dict[tuple[int, TopicPartition], KeyValue]:
        found = await super().pending_offsets(group_id, producer_id)
        if self.rounds > 0 and found:
            self.rounds -= 1
            first = min(found)
            await self._etcd.delete(found[first].key)
        return found


async def test_a_commit_outlasting_concurrent_offset_deletes_is_not_taken_as_fenced(
    group: Coordinated,
) -> None:
    """OffsetDeletes removing pending offsets under every attempt of a commit's offset move
    neither drop the transaction as if its lease were lost nor spin: the step is retried
    later (MetadataUnavailable, which the coordinator waits out), and it then moves the
    offsets left, the lease still held."""
    partitions = [("t", p) for p in range(8)]
    for topic, p in partitions:
        key = keys.group_txn_offset_key(group.cluster, GROUP, 1, topic, p)
        await group.etcd.put(key, encode_offset(CommittedOffset(100 + p)))
    txn_store = DeletingTxnStore(group.etcd, group.cluster, rounds=6)
    with pytest.raises(MetadataUnavailable, match="kept changing"):
        await txn_store.finish_offsets(GROUP, 1, True, group.txn_fence)
    assert await txn_store.finish_offsets(GROUP, 1, True, group.txn_fence)
    moved = {tp for tp in partitions if await group.etcd.get(_offset_key(group, tp)) is not None}
    assert moved == set(partitions[6:])  # the six deleted under it stay deleted
    assert await TxnStore(group.etcd, group.cluster).pending_offsets(GROUP, 1) == {}


def _offset_key(group: Coordinated, tp: TopicPartition) -> str:
    return keys.group_offset_key(group.cluster, GROUP, *tp)
