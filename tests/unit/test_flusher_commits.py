"""Flush rounds upload side by side and commit in order, several in one etcd transaction.

A round may start while another uploads (a request arriving during an upload does not wait
for it); commits still follow the order rounds started in, and rounds whose uploads are done
when the commit before them ends go into that commit: one transaction, one state put per
partition, folded over every round's segments. A fake object store holds chosen uploads back,
which makes each interleaving happen on purpose; a fake etcd records the transactions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from harness.batches import make_batch

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import CompareTarget, KeyValue, PutOp, TxnResult
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.protocol.errors import NotLeader, StorageFailure
from kafscale.broker.protocol.record_batch import read_header
from kafscale.broker.storage import flush_commit
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.flush_commit import Outcome
from kafscale.broker.storage.flush_schedule import RoundPolicy
from kafscale.broker.storage.flush_upload import Uploaded
from kafscale.broker.storage.flusher import Flusher, FlushWork
from kafscale.broker.storage.object_store import ObjectStoreError
from kafscale.broker.storage.partition_log import Ack, OwnedPartition

pytestmark = pytest.mark.unit

POLICY = RoundPolicy(
    min_interval_s=0.0, coalesce_s=0.0, max_wait_s=0.1, max_in_flight=4, max_uploading=2
)


class GatedStore:
    """Uploads in call order; the n-th waits for ``gates[n]`` (if any), then fails if ``n`` is
    in ``failing``."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.failing: set[int] = set()
        self.calls = 0
        self.finished = 0
        self.deleted: list[str] = []

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> None:
        n = self.calls
        self.calls += 1
        if n in self.gates:
            await self.gates[n].wait()
        self.finished += 1
        if n in self.failing:
            raise ObjectStoreError("injected")

    async def delete_many(self, keys: list[str]) -> None:
        self.deleted += keys


class RecordingEtcd:
    def __init__(self) -> None:
        self.txns: list[list[Any]] = []

    async def txn(self, compares: list[Any], success: list[Any]) -> TxnResult:
        self.txns.append(success)
        return TxnResult(True, 10 + len(self.txns), [])


def abandon(owned: OwnedPartition, error: BaseException, flushing: list[FlushWork]) -> None:
    """What the log manager does when a round fails a partition."""
    for work in flushing:
        for batch in work.batches:
            if not batch.acked.done():
                batch.acked.set_exception(error)
    owned.fail_everything(error)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (the fakes have no events to wait on)
            await asyncio.sleep(0.001)


def append(owned: OwnedPartition, flusher: Flusher, value: bytes) -> asyncio.Future[Ack]:
    batch = make_batch(0, [value])
    acked = owned.append(batch, read_header(batch))
    flusher.data_appended(segment_full=False)
    return acked


async def started(
    store: GatedStore, etcd: RecordingEtcd | UnansweredEtcd
) -> tuple[Flusher, OwnedPartition]:
    state = PartitionState(high_watermark=0, leader_epoch=1, epochs=((1, 0),))
    owned = OwnedPartition("t", 0, "id", state, state_revision=5, lease_revision=3)
    cluster: Any = None
    flusher = Flusher(
        LogSettings(),
        "c",
        1,
        etcd,  # type: ignore[arg-type]
        ClusterView(cluster, "c"),
        store,  # type: ignore[arg-type]
        SegmentCache(1 << 20),
        {owned.tp: owned},
        abandon,
        POLICY,
    )
    return flusher, owned


def committed_states(etcd: RecordingEtcd) -> list[list[PartitionState]]:
    return [
        [PartitionState.from_json(op.value) for op in ops if isinstance(op, PutOp)]
        for ops in etcd.txns
    ]


async def test_a_round_uploaded_while_the_one_before_uploads_commits_with_it() -> None:
    store, etcd = GatedStore(), RecordingEtcd()
    held = store.gates[0] = asyncio.Event()
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    try:
        first = append(owned, flusher, b"one")
        await until(lambda: store.calls == 1)  # the first round uploads, held back
        second = append(owned, flusher, b"two")
        await until(lambda: store.finished == 1)  # a second round uploaded beside it
        assert not first.done() and not second.done()  # commits wait for the first round
        held.set()
        assert await first == Ack(0)
        assert await second == Ack(1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    # One transaction for both rounds, one state put, folded over both segments.
    [[state]] = committed_states(etcd)
    assert state.high_watermark == 2
    assert [(ref.base, ref.last) for ref in state.segments] == [(0, 0), (1, 1)]
    assert (owned.state, owned.state_revision, owned.in_flight) == (state, 11, 0)


async def test_rounds_commit_in_the_order_they_started() -> None:
    """The second round's upload is the slow one: the first commits alone, then the second,
    from the state the first left."""
    store, etcd = GatedStore(), RecordingEtcd()
    held = store.gates[1] = asyncio.Event()
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    try:
        first = append(owned, flusher, b"one")
        assert await first == Ack(0)
        second = append(owned, flusher, b"two")
        await until(lambda: store.calls == 2)
        third = append(owned, flusher, b"three")  # a round beside the held one
        await until(lambda: store.finished == 2)
        assert not second.done() and not third.done()
        held.set()
        assert (await second, await third) == (Ack(1), Ack(2))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    hws = [[s.high_watermark for s in states] for states in committed_states(etcd)]
    assert hws == [[1], [3]]  # the held round and the one beside it: together, in order


async def test_a_failed_upload_fails_the_later_round_of_its_partition_too() -> None:
    """Offsets of the later round depend on the failed one: neither is committed, and the
    later round's upload is deleted."""
    store, etcd = GatedStore(), RecordingEtcd()
    held = store.gates[0] = asyncio.Event()
    store.failing.add(0)
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    try:
        first = append(owned, flusher, b"one")
        await until(lambda: store.calls == 1)
        second = append(owned, flusher, b"two")
        await until(lambda: store.finished == 1)
        held.set()
        with pytest.raises(StorageFailure):
            await first
        with pytest.raises(NotLeader):
            await second
        await until(lambda: len(store.deleted) == 1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert etcd.txns == []
    assert owned.failed and owned.in_flight == 0


async def test_transaction_bookkeeping_is_committed_with_the_batches_that_change_it() -> None:
    """A transactional batch opens its transaction in the state its round commits; an abort
    marker in a round folded into the same commit closes it and records the abort."""
    store, etcd = GatedStore(), RecordingEtcd()
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    pid = 9
    try:
        batch = make_batch(0, [b"t"], attributes=0x10, producer_id=pid, producer_epoch=0,
                           base_sequence=0)  # fmt: skip
        first = owned.append(batch, read_header(batch))
        flusher.data_appended(segment_full=False)
        assert await first == Ack(0)
        assert owned.state.open_txns == {pid: 0}
        held = store.gates[1] = asyncio.Event()
        batch = make_batch(0, [b"u"], attributes=0x10, producer_id=pid, producer_epoch=0,
                           base_sequence=1)  # fmt: skip
        second = owned.append(batch, read_header(batch))
        flusher.data_appended(segment_full=False)
        await until(lambda: store.calls == 2)
        marker = owned.append_marker(pid, 0, False, 3, 0)
        assert marker is not None
        flusher.data_appended(segment_full=False)
        await until(lambda: store.finished == 2)
        held.set()
        assert (await second, await marker) == (Ack(1), Ack(2))
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    commits = committed_states(etcd)
    assert [[s.open_txns for s in states] for states in commits] == [[{pid: 0}], [{}]]
    final = commits[-1][0]
    assert [tuple(t) for t in final.aborted_txns] == [(pid, 0, 2)]
    assert final.coordinator_epochs == {pid: 3}


class UnansweredEtcd:
    """One partition state in etcd. The first ``unanswered`` transactions get no answer (a
    timeout), and the first of them is applied all the same if ``first_applies``: the broker
    was frozen past its etcd deadline while etcd committed."""

    def __init__(self, unanswered: int, first_applies: bool, new_owner: bool = False) -> None:
        self.unanswered = unanswered
        self.first_applies = first_applies
        self.new_owner = new_owner  # another broker takes the partition after the first try
        self.calls = 0
        self.applied: list[bytes] = []
        self.revision = 5  # the state's mod revision (``started`` owns it at 5)
        self.closed = False

    async def txn(self, compares: list[Any], success: list[Any], failure: Any = ()) -> TxnResult:
        self.calls += 1
        [expected] = [c.expected for c in compares if c.target is CompareTarget.MOD_REVISION]
        answered = self.calls > self.unanswered
        holds = expected == self.revision
        if holds and (answered or (self.calls == 1 and self.first_applies)):
            self.revision = 10 + self.calls
            self.applied += [op.value for op in success if isinstance(op, PutOp)]
        if self.calls == 1 and self.new_owner:
            self.revision += 100
            self.applied.append(b"the new owner's state")
        if not answered:
            raise MetadataUnavailable("etcd txn timed out after 2 s")
        if holds:
            return TxnResult(True, self.revision, [])
        stored = KeyValue("state", self.applied[-1], 1, self.revision, 1, 0)
        return TxnResult(False, 99, [stored for _ in failure])


@pytest.mark.parametrize("first_applies", [True, False])
async def test_a_commit_etcd_did_not_answer_is_acked_once_it_does(first_applies: bool) -> None:
    """Failing the batch (REQUEST_TIMED_OUT) when the commit was applied anyway told
    idempotent producers that stored records were not, and librdkafka sent them again as new
    records after the sequence gap that followed: a duplicate. The broker asks etcd again
    until it answers: acked once, stored once, and the partition stays owned."""
    store, etcd = GatedStore(), UnansweredEtcd(unanswered=2, first_applies=first_applies)
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    try:
        assert await append(owned, flusher, b"one") == Ack(0)
        assert await append(owned, flusher, b"two") == Ack(1)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [PartitionState.from_json(v).high_watermark for v in etcd.applied] == [1, 2]
    assert not owned.failed and owned.state.high_watermark == 2
    assert owned.state_revision == etcd.revision and owned.in_flight == 0


@pytest.mark.parametrize("first_applies", [True, False])
async def test_a_commit_unanswered_until_a_new_owner_wrote_keeps_its_segments(
    first_applies: bool,
) -> None:
    """The broker was frozen past its session: a new owner took the partition (from a state
    that may reference this commit's segment) before etcd answered. The batch fails (the
    producer retries to the new owner), but the segment is not deleted: if the commit was
    applied, the new owner's state references it."""
    store = GatedStore()
    etcd = UnansweredEtcd(unanswered=1, first_applies=first_applies, new_owner=True)
    flusher, owned = await started(store, etcd)
    loop = asyncio.create_task(flusher.run())
    try:
        with pytest.raises(NotLeader):
            await append(owned, flusher, b"one")
        await asyncio.sleep(0.05)  # a discarded upload is deleted off the ack path
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert owned.failed and store.calls == 1 and store.deleted == []


def test_an_unanswered_commit_is_known_applied_only_from_what_etcd_holds() -> None:
    ours = PartitionState(high_watermark=1, leader_epoch=1, epochs=((1, 0),))
    owned = OwnedPartition("t", 0, "id", PartitionState(), state_revision=5, lease_revision=3)
    commit = flush_commit.PartitionCommit(
        [Uploaded(FlushWork(owned, [], {}, []), [])], ours, ours.to_json()
    )

    def stored(value: bytes, revision: int) -> KeyValue:
        return KeyValue("state", value, 1, revision, 1, 0)

    assert flush_commit.first_attempt([commit], [stored(ours.to_json(), 9)]) is Outcome.APPLIED
    assert flush_commit.first_attempt([commit], [stored(b"old", 5)]) is Outcome.NOT_APPLIED
    assert flush_commit.first_attempt([commit], [stored(b"other", 9)]) is Outcome.UNKNOWN
    assert flush_commit.first_attempt([commit], [None]) is Outcome.UNKNOWN
