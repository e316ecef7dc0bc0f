"""The etcd commit of uploaded flush rounds: fenced, grouped, in round order.

Rounds whose uploads are done when the commit before them ends are committed together (the
caller, ``flusher``, hands them over in round order under its commit lock): one state put per
partition, folded over their segments in order, so commits do not queue up behind each other
when rounds come faster than etcd commits.

A commit is one etcd transaction for up to ``PARTITIONS_PER_TXN`` partitions and
``MAX_TXN_BYTES`` of partition states (etcd refuses larger requests; a state remembering many
idempotent producers is tens of KB), each partition contributing three compares (lease value,
lease create revision, state mod revision) and one put. A failed compare fences only the
partitions whose lease is gone: the rest are committed on their own.

A partition whose state would hold more than ``log.aborted_txns_in_state`` aborted transactions
spills the oldest to an aborted-transaction index object (``metadata.aborted_index``), PUT before
the commit that references it: still one etcd transaction per commit, and one more PUT per
``aborted_txns_in_state / 2`` aborts.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import AbortedSpill, spill_aborted
from kafscale.broker.metadata.cluster import ClusterView, TopicPartition
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataNoSpace, MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    KeyValue,
    Op,
    create_revision_is,
    get_op,
    mod_revision_is,
    put_op,
    value_is,
)
from kafscale.broker.metadata.partition_state import (
    PartitionState,
    TxnIndexRef,
    commit_segment,
)
from kafscale.broker.metadata.partition_txns import apply_txn_events
from kafscale.broker.protocol.errors import MetadataTimeout, NotLeader, StorageFailure
from kafscale.broker.storage import aborted_index
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.flush_upload import SegmentUploader, Uploaded
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.storage.partition_log import Ack, FlushWork, OwnedPartition

PARTITIONS_PER_TXN = 40  # 3 compares each stays under etcd's default --max-txn-ops (128)
MAX_TXN_BYTES = 1024 * 1024  # etcd's default --max-request-bytes is 1.5 MiB
TXN_BYTES_PER_PARTITION = 1024  # keys, compares and framing beside the state document
SETTLE_FIRST_DELAY_S = 0.05  # asking again after etcd did not answer a commit: first wait,
SETTLE_MAX_DELAY_S = 1.0  # doubling up to this

log = logging.getLogger(__name__)

Fail = Callable[[FlushWork, BaseException], None]
"""Give up a partition's flush work: its pending produces fail with the error."""


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    """A partition's part of a commit transaction: what it uploaded (one item per round the
    transaction commits, in round order), its new state, and that state as stored."""

    items: list[Uploaded]
    state: PartitionState
    document: bytes
    spill: AbortedSpill | None = None  # an index object to write before the commit

    @property
    def partition(self) -> OwnedPartition:
        return self.items[0].work.partition


class Outcome(enum.Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    UNKNOWN = "unknown"


def first_attempt(commits: Sequence[PartitionCommit], stored: Sequence[KeyValue | None]) -> Outcome:
    """Whether an unanswered commit transaction was applied, from the states read back when the
    same transaction, sent again, failed its compares.

    A state holding what we sent: applied (the transaction is atomic, so all of it). A state
    unchanged since we read it: not applied, and never will be (the retry failed a compare of
    the same transaction, and a failed compare never holds again: mod revisions only grow,
    lease create revisions are never reused). Every state changed by others: unknown (our
    lease ended and new owners wrote, perhaps on top of ours)."""
    if any(_holds(kv, commit) for commit, kv in zip(commits, stored, strict=True)):
        return Outcome.APPLIED
    unchanged = [
        kv is not None and kv.mod_revision == commit.partition.state_revision
        for commit, kv in zip(commits, stored, strict=True)
    ]
    return Outcome.NOT_APPLIED if any(unchanged) else Outcome.UNKNOWN


def _holds(stored: KeyValue | None, commit: PartitionCommit) -> bool:
    """Whether etcd holds the state this commit wrote (no other owner writes the same
    document: taking a partition starts a new leader epoch)."""
    return stored is not None and stored.value == commit.document


def txn_groups(sizes: Sequence[int], max_count: int, max_bytes: int) -> list[range]:
    """Consecutive runs of entries, each at most ``max_count`` entries and ``max_bytes`` in
    total; an entry larger than ``max_bytes`` is a run of its own."""
    groups: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        if index > start and (index - start >= max_count or total + size > max_bytes):
            groups.append(range(start, index))
            start, total = index, 0
        total += size
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


class FlushCommitter:
    """Commits uploaded rounds to etcd; acks what landed, fails and discards what did not."""

    def __init__(
        self,
        settings: LogSettings,
        cluster: str,
        broker_id: int,
        etcd: Etcd,
        view: ClusterView,
        store: ObjectStore,
        cache: SegmentCache,
        owned: dict[TopicPartition, OwnedPartition],
        uploads: SegmentUploader,
        fail: Fail,
    ) -> None:
        self._settings = settings
        self._cluster = cluster
        self._me = str(broker_id).encode()
        self._etcd = etcd
        self._view = view
        self._store = store
        self._cache = cache
        self._owned = owned
        self._uploads = uploads
        self._fail = fail

    async def commit_round(
        self, works: list[FlushWork], results: list[Uploaded | BaseException]
    ) -> list[Uploaded]:
        """Commit what was uploaded (of one round or several, in round order); returns what got
        committed. The caller holds the commit lock."""
        ready: list[Uploaded] = []
        for work, result in zip(works, results, strict=True):
            owned = work.partition
            if isinstance(result, BaseException):
                self._fail(work, StorageFailure(f"segment upload failed: {result}"))
            elif owned.failed or self._owned.get(owned.tp) is not owned:
                self._fail(work, NotLeader(f"{owned.topic}-{owned.partition} was given up"))
                self._uploads.discard(result)
            else:
                ready.append(result)
        by_partition: dict[int, list[Uploaded]] = {}  # a partition's uploads, in round order
        for item in ready:
            by_partition.setdefault(id(item.work.partition), []).append(item)
        commits = await self._write_spills([self._prepare(i) for i in by_partition.values()])
        sizes = [len(c.document) + TXN_BYTES_PER_PARTITION for c in commits]
        landed: list[Uploaded] = []
        for group in txn_groups(sizes, PARTITIONS_PER_TXN, MAX_TXN_BYTES):
            landed += await self._commit([commits[i] for i in group])
        return landed

    def _prepare(self, items: list[Uploaded]) -> PartitionCommit:
        """One partition's new state after its uploads of one or more rounds (in order)."""
        state = items[0].work.partition.state
        for item in items:
            for index, segment in enumerate(item.segments):
                last = index == len(item.segments) - 1
                state = commit_segment(state, segment.ref, item.work.producers if last else {})
            state = apply_txn_events(state, item.work.txn_events)
        state, spill = spill_aborted(state, self._settings.aborted_txns_in_state)
        return PartitionCommit(items, state, state.to_json(), spill)

    def _spill_keys(self, commit: PartitionCommit, refs: tuple[TxnIndexRef, ...]) -> list[str]:
        owned = commit.partition
        where = (owned.topic, owned.topic_id, owned.partition)
        return [aborted_index.object_key(self._cluster, *where, ref) for ref in refs]

    async def _write_spills(self, commits: list[PartitionCommit]) -> list[PartitionCommit]:
        """PUT the aborted-transaction index objects the commits reference (rare: once per
        ``aborted_txns_in_state / 2`` aborts of a partition); returns the commits that may go
        ahead. A partition whose PUT failed fails its flush, as a failed segment upload does."""
        puts = {
            id(c): aborted_index.write_spill(
                self._store,
                self._cache,
                self._cluster,
                (c.partition.topic, c.partition.topic_id, c.partition.partition),
                c.spill,
            )
            for c in commits
            if c.spill is not None
        }
        if not puts:
            return commits
        results = await asyncio.gather(*puts.values(), return_exceptions=True)
        outcomes = dict(zip(puts, results, strict=True))
        ready = []
        for commit in commits:
            outcome = outcomes.get(id(commit))
            if not isinstance(outcome, BaseException):
                ready.append(commit)
                continue
            for item in commit.items:
                self._fail(item.work, StorageFailure(f"aborted index upload failed: {outcome}"))
                self._uploads.discard(item)
        return ready

    def _spills_committed(self, commits: list[PartitionCommit], succeeded: bool) -> None:
        """After a commit's outcome is known: the objects its spills absorbed go if it succeeded
        (no state references them now), its new objects if it was fenced (none ever will)."""
        doomed = [
            key
            for commit in commits
            if commit.spill is not None
            for key in self._spill_keys(
                commit, commit.spill.absorbed if succeeded else (commit.spill.ref,)
            )
        ]
        if doomed:
            self._uploads.delete_later(doomed, "aborted-index-cleanup")

    async def _commit(self, commits: list[PartitionCommit]) -> list[Uploaded]:
        """One transaction; returns what it committed (all, or the unfenced ones one by one)."""
        if not commits:
            return []
        compares, success = self._txn_ops(commits)
        try:
            result = await self._etcd.txn(compares, success)
        except MetadataNoSpace as exc:  # refused, not applied: etcd's space quota is used up
            for commit in commits:
                for item in commit.items:
                    self._fail(item.work, MetadataTimeout(str(exc)))
            return []
        except MetadataUnavailable as exc:
            return await self._settle(commits, compares, success, exc)
        if not result.succeeded:
            return await self._fenced(commits)
        return self._landed(commits, result.revision)

    def _txn_ops(self, commits: list[PartitionCommit]) -> tuple[list[Compare], list[Op]]:
        compares: list[Compare] = []
        success: list[Op] = []
        for commit in commits:
            owned = commit.partition
            lease_key = keys.partition_lease_key(self._cluster, owned.topic, owned.partition)
            compares += [
                value_is(lease_key, self._me),
                create_revision_is(lease_key, owned.lease_revision),
                mod_revision_is(self._state_key(commit), owned.state_revision),
            ]
            success.append(put_op(self._state_key(commit), commit.document))
            self._view.expect_commit(owned.tp, commit.document, commit.state)
        return compares, success

    def _state_key(self, commit: PartitionCommit) -> str:
        owned = commit.partition
        key: str = keys.partition_state_key(self._cluster, owned.topic, owned.partition)
        return key

    async def _settle(
        self,
        commits: list[PartitionCommit],
        compares: list[Compare],
        success: list[Op],
        error: Exception,
    ) -> list[Uploaded]:
        """etcd did not answer, but it may have applied the commit. Failing the batches now
        would tell producers that stored records were not: an idempotent producer that then
        meets a sequence gap bumps its epoch and sends them again as new (a duplicate). So ask
        again until etcd answers: the same transaction, which cannot apply twice (it compares
        the state's mod revision), reading the states back in case it was applied the first
        time. Later rounds wait behind this under the commit lock, as they must."""
        log.warning(
            "commit of %d partition(s): no answer from etcd (%s); asking again", len(commits), error
        )
        reads = [get_op(self._state_key(commit)) for commit in commits]
        delay = SETTLE_FIRST_DELAY_S
        while True:
            if self._etcd.closed:
                for commit in commits:
                    for item in commit.items:
                        self._fail(item.work, MetadataTimeout(str(error)))
                return []
            await asyncio.sleep(delay)
            try:
                result = await self._etcd.txn(compares, success, reads)
                break
            except MetadataUnavailable as exc:
                error, delay = exc, min(2 * delay, SETTLE_MAX_DELAY_S)
        if result.succeeded:
            return self._landed(commits, result.revision)
        stored = [result.kv(index) for index in range(len(commits))]
        outcome = first_attempt(commits, stored)
        if outcome is Outcome.NOT_APPLIED:
            return await self._fenced(commits)
        landed: list[Uploaded] = []
        for commit, kv in zip(commits, stored, strict=True):
            if kv is not None and _holds(kv, commit):
                landed += self._landed([commit], kv.mod_revision)
                continue
            # Applied with the rest, or perhaps applied: a new owner has written since (our
            # session ended while frozen). Its state may reference our segments, so they stay;
            # a retry to the new owner finds stored records by their sequence numbers.
            for item in commit.items:
                self._fail(item.work, NotLeader("lease lost while the commit was unanswered"))
            if outcome is Outcome.APPLIED:
                self._spills_committed([commit], succeeded=True)
        return landed

    async def _fenced(self, commits: list[PartitionCommit]) -> list[Uploaded]:
        """The transaction's compares failed: commit the unfenced partitions one by one."""
        if len(commits) > 1:
            landed: list[Uploaded] = []
            for commit in commits:  # find the fenced one(s); commit the rest
                landed += await self._commit([commit])
            return landed
        for item in commits[0].items:
            self._fail(item.work, NotLeader("lease lost; commit fenced"))
            self._uploads.discard(item)
        self._spills_committed(commits, succeeded=False)
        return []

    def _landed(self, commits: list[PartitionCommit], revision: int) -> list[Uploaded]:
        for commit in commits:
            for item in commit.items:
                self._on_committed(item, commit.state, revision)
        self._spills_committed(commits, succeeded=True)
        return [item for commit in commits for item in commit.items]

    def _on_committed(self, item: Uploaded, state: PartitionState, revision: int) -> None:
        owned = item.work.partition
        if not owned.failed:  # given up while the commit was settling: nothing is in flight
            owned.committed(state, revision)
        self._view.update_state(owned.tp, state, revision)
        for segment in item.segments:
            if segment.reservation is not None:
                segment.reservation.release()
            self._cache.put(segment.key, segment.body)
            for batch in segment.batches:
                if not batch.acked.done():
                    batch.acked.set_result(Ack(batch.base_offset, batch.append_time))
