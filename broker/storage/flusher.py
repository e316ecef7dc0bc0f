"""The flush pipeline: group commit, segments cut at ``segment.bytes``, commits in order.

``segment.bytes`` is the topic's config where it sets one, else the broker's
``log.segment_bytes``.

A *round* takes what every owned partition has buffered, cuts it into segments of at most
``segment_bytes``, and uploads them all in parallel. Rounds start by group commit
(``flush_schedule``): as soon as a batch is buffered and one of ``MAX_ROUNDS_IN_FLIGHT`` round
slots is free, after the coalescing window and no sooner than the store's minimum interval after
the previous round (``log.flush_min_interval_ms``, which bounds PUTs per second), and never later
than ``flush_interval_ms`` after the batch came. An ack therefore costs one PUT and one etcd
commit, not a wait for a timer: a producer that waits for each ack (or allows five requests in
flight, as every idempotent one does) is no longer held to a few requests per tick. Batches that
arrive while rounds are uploading gather for the next one, so under load rounds grow instead of
multiplying. On S3 two rounds may upload at once (``flush_schedule.MAX_UPLOADING``): one slow
PUT then no longer holds back the next round, which cut the produce p99 at 1,000 records/s
2-6x on a loaded machine. As soon as a partition has a segment's worth buffered, a round
takes the whole segments of every partition at once and leaves the rest (see ``partition_log``);
handoff and shutdown take everything at once.
Index objects (of segments from ``index_min_segment_bytes`` up) follow after the commit, off the
ack path, in tasks that do not hold a round's slot.

Commits happen in the order rounds started, under one lock: a round commits only after the
previous round committed, and each partition's new state follows from the state the previous
commit left. Rounds whose uploads are done when the commit before them ends are committed
together, in one transaction (one state put per partition, folded over their segments in
order), so commits do not queue up behind each other when rounds come faster than etcd commits.

A partition whose state would hold more than ``log.aborted_txns_in_state`` aborted transactions
spills the oldest to an aborted-transaction index object (``metadata.aborted_index``), PUT before
the commit that references it: still one etcd transaction per commit, and one more PUT per
``aborted_txns_in_state / 2`` aborts.

Uploads that can no longer be committed (the partition was given up or its topic deleted while
they were in flight, or the commit was fenced) are deleted again, and so are indexes that land
after their topic was deleted: the broker deleting a topic lists its objects once, and an
upload landing after that list would otherwise stay forever.

A commit is one etcd transaction for up to ``PARTITIONS_PER_TXN`` partitions and
``MAX_TXN_BYTES`` of partition states (etcd refuses larger requests; a state remembering many
idempotent producers is tens of KB), each partition contributing three compares (lease value,
lease create revision, state mod revision) and one put. A failed compare fences only the
partitions whose lease is gone: the rest are committed on their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys, topics
from kafscale.broker.metadata.aborted_index import AbortedSpill, spill_aborted
from kafscale.broker.metadata.cluster import ClusterView, TopicPartition
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import create_revision_is, mod_revision_is, put_op, value_is
from kafscale.broker.metadata.partition_state import (
    PartitionState,
    SegmentRef,
    TxnIndexRef,
    commit_segment,
)
from kafscale.broker.metadata.partition_txns import apply_txn_events
from kafscale.broker.metadata.topics import topic_exists
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.errors import MetadataTimeout, NotLeader, StorageFailure
from kafscale.broker.storage import aborted_index
from kafscale.broker.storage.cache import Reservation, SegmentCache
from kafscale.broker.storage.flush_schedule import RoundPolicy, Wait, decide_round
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import Ack, FlushWork, OwnedPartition, PendingBatch
from kafscale.broker.storage.segments import (
    SEGMENT_FOOTER_SIZE,
    SEGMENT_HEADER_SIZE,
    encode_segment,
)

log = logging.getLogger(__name__)

PARTITIONS_PER_TXN = 40  # 3 compares each stays under etcd's default --max-txn-ops (128)
MAX_TXN_BYTES = 1024 * 1024  # etcd's default --max-request-bytes is 1.5 MiB
TXN_BYTES_PER_PARTITION = 1024  # keys, compares and framing beside the state document
MAX_ROUNDS_IN_FLIGHT = 4
SIDE_TASKS_GRACE_S = 2.0  # how long shutdown waits for index uploads and clean-ups in flight

GiveUp = Callable[[OwnedPartition, BaseException, list[FlushWork]], None]


@dataclass(frozen=True, slots=True)
class UploadedSegment:
    ref: SegmentRef
    key: str
    body: memoryview  # the batches, a view into the uploaded object (no copy for the cache)
    batches: list[PendingBatch]
    index_key: str
    index: bytes
    reservation: Reservation | None  # its buffer, counted in the cache's budget until cached


@dataclass(frozen=True, slots=True)
class IndexUpload:
    key: str
    index: bytes
    topic: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class Uploaded:
    work: FlushWork
    segments: list[UploadedSegment]


@dataclass(frozen=True, slots=True)
class _Commit:
    """A partition's part of a commit transaction: what it uploaded (one item per round the
    transaction commits, in round order), its new state, and that state as stored."""

    items: list[Uploaded]
    state: PartitionState
    document: bytes
    spill: AbortedSpill | None = None  # an index object to write before the commit

    @property
    def partition(self) -> OwnedPartition:
        return self.items[0].work.partition


@dataclass(slots=True)
class _RoundInFlight:
    """A round between its start and its commit; ``results`` once its uploads are done."""

    works: list[FlushWork]
    committed: asyncio.Future[None]
    results: list[Uploaded | BaseException] | None = None


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


class Flusher:
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
        give_up: GiveUp,
        policy: RoundPolicy,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self._cluster = cluster
        self._me = str(broker_id).encode()
        self._etcd = etcd
        self._view = view
        self._store = store
        self._cache = cache
        self._owned = owned
        self._give_up = give_up
        self.commit_lock = asyncio.Lock()  # one writer of partition states at a time
        self._wake = asyncio.Event()  # something the schedule depends on changed
        self._take_everything = False  # a handoff or shutdown wants everything flushed now
        self._segment_full = False  # some partition has buffered a whole segment
        self._pending_since: float | None = None  # when the oldest batch no round took came
        self._last_round_at: float | None = None  # when the last round of everything started
        self._progress = asyncio.Event()
        self._rounds: set[asyncio.Task[None]] = set()
        # Rounds not committed yet, in the order they started (the order they commit in).
        self._to_commit: deque[_RoundInFlight] = deque()
        self._uploading: set[asyncio.Future[None]] = set()  # rounds not yet at their commit
        # Index uploads and deletions of uncommitted uploads: off the ack path, awaited briefly
        # on shutdown.
        self._side_tasks: set[asyncio.Task[None]] = set()

    # --- triggers and waiting ----------------------------------------------------------------

    def data_appended(self, segment_full: bool) -> None:
        """A batch was buffered (``segment_full``: its partition now holds a whole segment).
        Wakes the loop only when the buffer turns non-empty or fills a segment: the hot path
        of a busy partition costs two attribute reads."""
        if self._pending_since is None:
            self._pending_since = asyncio.get_running_loop().time()
            self._wake.set()
        if segment_full and not self._segment_full:
            self._segment_full = True
            self._wake.set()

    def flush_soon(self) -> None:
        """A round now, of everything buffered (handoff, shutdown)."""
        self._take_everything = True
        self._wake.set()

    async def wait_progress(self) -> None:
        """Until the next round commits (or a round finds nothing to do)."""
        await self._progress.wait()

    def _notify_progress(self) -> None:
        done, self._progress = self._progress, asyncio.Event()
        done.set()

    # --- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        previous: asyncio.Future[None] | None = None
        self._last_round_at = loop.time()  # the minimum interval counts from the start
        try:
            while True:
                self._wake.clear()
                decision = decide_round(
                    self._policy,
                    loop.time(),
                    pending_since=self._pending_since,
                    segment_full=self._segment_full,
                    everything_asked=self._take_everything,
                    last_round_at=self._last_round_at,
                    rounds_in_flight=len(self._rounds),
                    rounds_uploading=len(self._uploading),
                )
                if isinstance(decision, Wait):
                    await self._sleep(loop, decision.until)
                    continue
                previous = self._start_round(previous, everything=decision.everything)
        finally:
            for task in self._rounds:
                task.cancel()
            await asyncio.gather(*self._rounds, return_exceptions=True)
            await self._finish_side_tasks()

    async def _sleep(self, loop: asyncio.AbstractEventLoop, until: float | None) -> None:
        """Until ``until`` or a wake-up. Without a deadline it still looks every
        ``max_wait_s`` for buffered data nobody announced (a safety net: appends announce
        themselves through ``data_appended``).

        ``asyncio.timeout``, not ``wait_for``: on Python 3.11, ``wait_for`` swallows a
        cancellation that arrives as the event is set, and the loop, woken often, then never
        stopped (a test cancelling it right after a round finished hung)."""
        timeout = self._policy.max_wait_s if until is None else max(0.0, until - loop.time())
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            if (
                until is None
                and self._pending_since is None
                and any(owned.pending for owned in self._owned.values())
            ):
                self._pending_since = loop.time() - self._policy.max_wait_s

    async def _finish_side_tasks(self) -> None:
        """On the way out, give the last indexes and clean-ups a moment (both are optional: a
        reader without an index reads whole segments; the janitor of the next owner deletes
        uploads of an older epoch that never got committed)."""
        if self._side_tasks:
            await asyncio.wait(self._side_tasks, timeout=SIDE_TASKS_GRACE_S)
        for task in self._side_tasks:
            task.cancel()
        await asyncio.gather(*self._side_tasks, return_exceptions=True)

    def segment_bytes(self, owned: OwnedPartition) -> int:
        return topics.segment_bytes(
            self._view.topics.get(owned.topic), self._settings.segment_bytes
        )

    def _spawn_side_task(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def _start_round(
        self, previous: asyncio.Future[None] | None, *, everything: bool
    ) -> asyncio.Future[None] | None:
        self._segment_full = False
        if everything:
            self._take_everything = False
            self._pending_since = None
        works = [
            work
            for owned in list(self._owned.values())
            if (
                work := owned.take_flush_work(
                    self.segment_bytes(owned), whole_segments_only=not everything
                )
            )
            is not None
        ]
        if not works:
            if previous is None or previous.done():
                self._notify_progress()
            return previous
        if everything:
            self._last_round_at = asyncio.get_running_loop().time()
        committed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        handed_off: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._to_commit.append(_RoundInFlight(works, committed))
        self._uploading.add(handed_off)
        handed_off.add_done_callback(self._handed_off)
        task = asyncio.create_task(
            self._round(works, previous, committed, handed_off), name="flush-round"
        )
        self._rounds.add(task)
        task.add_done_callback(self._round_done)
        return committed

    def _handed_off(self, handed_off: asyncio.Future[None]) -> None:
        self._uploading.discard(handed_off)
        self._wake.set()  # the next round may start uploading

    def _round_done(self, task: asyncio.Task[None]) -> None:
        self._rounds.discard(task)
        self._wake.set()  # a round slot is free

    async def _round(
        self,
        works: list[FlushWork],
        previous: asyncio.Future[None] | None,
        committed: asyncio.Future[None],
        handed_off: asyncio.Future[None],
    ) -> None:
        reservations: list[Reservation] = []  # what a failed round never cached is released
        started = time.perf_counter()
        try:
            results = await asyncio.gather(
                *(self._upload(w, reservations) for w in works), return_exceptions=True
            )
            self._uploaded(committed, results)
            if self._policy.max_uploading > 1:
                handed_off.set_result(None)  # the next round may start uploading now
            if previous is not None:
                await previous
            if not handed_off.done():
                # One upload at a time (a local directory): the next round starts once this one
                # can commit, and gathers what arrived meanwhile (fewer, larger rounds).
                handed_off.set_result(None)
            if not committed.done():  # else an earlier round's commit carried this one
                async with self.commit_lock:
                    landed = await self._commit_uploaded()
                record_round(time.perf_counter() - started, landed)
                self._notify_progress()
                self._start_index_uploads(landed)
        except asyncio.CancelledError:
            for work in works:
                self._fail(work, NotLeader("broker shutting down"))
            raise
        except Exception:
            log.exception("flush round failed")
            METRICS.flush_failed()
            for work in works:
                self._fail(work, StorageFailure("flush round failed"))
        finally:
            if not handed_off.done():
                handed_off.set_result(None)
            for reservation in reservations:
                reservation.release()
            if not committed.done():
                committed.set_result(None)
            self._notify_progress()

    def _uploaded(
        self, committed: asyncio.Future[None], results: list[Uploaded | BaseException]
    ) -> None:
        for pending in self._to_commit:
            if pending.committed is committed:
                pending.results = results
                return

    async def _commit_uploaded(self) -> list[Uploaded]:
        """Commit every round at the head of the queue whose uploads are done, in one go (the
        caller holds the commit lock, and the rounds before the first of them committed);
        returns what got committed. Each of those rounds counts as committed afterwards, and
        if the commit fails unexpectedly (or is cancelled) every one of them fails with it."""
        rounds: list[_RoundInFlight] = []
        while self._to_commit and self._to_commit[0].results is not None:
            rounds.append(self._to_commit.popleft())
        works = [work for pending in rounds for work in pending.works]
        results = [result for pending in rounds for result in pending.results or ()]
        try:
            return await self._commit_round(works, results)
        except BaseException as exc:
            error: BaseException = StorageFailure("flush round failed")
            if isinstance(exc, asyncio.CancelledError):
                error = NotLeader("broker shutting down")
            for work in works:
                self._fail(work, error)
            raise
        finally:
            for pending in rounds:
                if not pending.committed.done():
                    pending.committed.set_result(None)

    async def _commit_round(
        self, works: list[FlushWork], results: list[Uploaded | BaseException]
    ) -> list[Uploaded]:
        """Commit what was uploaded (of one round or several, in round order); returns what got
        committed."""
        ready: list[Uploaded] = []
        for work, result in zip(works, results, strict=True):
            owned = work.partition
            if isinstance(result, BaseException):
                self._fail(work, StorageFailure(f"segment upload failed: {result}"))
            elif owned.failed or self._owned.get(owned.tp) is not owned:
                self._fail(work, NotLeader(f"{owned.topic}-{owned.partition} was given up"))
                self._discard(result)
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

    # --- upload ------------------------------------------------------------------------------

    def _start_index_uploads(self, committed: list[Uploaded]) -> None:
        """Indexes go up after the ack, in a task of their own: a round's slot (one of
        ``MAX_ROUNDS_IN_FLIGHT``) is for acks, and waiting for index PUTs there held back the
        next round's segments.

        Indexes only speed up reads of older data and are derived from the segment, so readers
        that find none read the whole segment instead. Small segments get none: a reader GETs
        them whole anyway, and a partition flushed every tick with a trickle of data would
        otherwise pay two PUT requests per tick instead of one."""
        smallest = self._settings.index_min_segment_bytes
        indexes = [
            IndexUpload(
                segment.index_key,
                segment.index,
                result.work.partition.topic,
                result.work.partition.topic_id,
            )
            for result in committed
            for segment in result.segments
            if segment.ref.size >= smallest
        ]
        if indexes:
            self._spawn_side_task(self._upload_indexes(indexes), "index-uploads")

    async def _upload_indexes(self, indexes: list[IndexUpload]) -> None:
        uploads = [self._store.put(upload.key, upload.index) for upload in indexes]
        landed = []
        for upload, outcome in zip(
            indexes, await asyncio.gather(*uploads, return_exceptions=True), strict=True
        ):
            if isinstance(outcome, Exception):
                log.warning("index upload failed (reads fall back to whole segments): %s", outcome)
            else:
                landed.append(upload)
        # Checked after the PUTs landed: a topic deleted later is listed with them by its
        # deleter; one deleted earlier was listed without them.
        for topic, topic_id in sorted({(u.topic, u.topic_id) for u in landed}):
            try:
                exists = await topic_exists(self._etcd, self._cluster, topic, topic_id)
            except MetadataUnavailable:
                continue  # keep them: an index of a live topic must not go
            if not exists:
                await self._delete_quietly(
                    [u.key for u in landed if (u.topic, u.topic_id) == (topic, topic_id)]
                )

    def _discard(self, item: Uploaded) -> None:
        """Delete the segments of an upload that will never be committed."""
        self._spawn_side_task(
            self._delete_quietly([segment.key for segment in item.segments]), "discard-uploads"
        )

    async def _delete_quietly(self, keys_: list[str]) -> None:
        try:
            await self._store.delete_many(keys_)
        except ObjectStoreError as exc:
            log.warning("could not delete %d uncommitted object(s): %s", len(keys_), exc)

    async def _upload(self, work: FlushWork, reservations: list[Reservation]) -> Uploaded:
        if len(work.chunks) == 1:  # the usual round: no task and gather per partition
            return Uploaded(
                work, [await self._upload_segment(work.partition, work.chunks[0], reservations)]
            )
        segments = await asyncio.gather(
            *(self._upload_segment(work.partition, chunk, reservations) for chunk in work.chunks)
        )
        return Uploaded(work, list(segments))

    async def _upload_segment(
        self, owned: OwnedPartition, batches: list[PendingBatch], reservations: list[Reservation]
    ) -> UploadedSegment:
        base = batches[0].base_offset
        reservation: Reservation | None = None

        def allocate(size: int) -> bytearray | memoryview:
            nonlocal reservation
            buffer, reservation = self._cache.segment_buffer(size)
            reservations.append(reservation)
            return buffer

        encoded = encode_segment(
            [b.data for b in batches],
            int(time.time() * 1000),
            self._settings.index_interval_bytes,
            base_offsets=[b.base_offset for b in batches],
            leader_epoch=owned.epoch,
            allocate=allocate,
        )
        names = (self._cluster, owned.topic, owned.topic_id, owned.partition, base, owned.epoch)
        segment_key = keys.segment_object_key(*names)
        await self._store.put(segment_key, encoded.segment)
        ref = SegmentRef(
            base=base,
            last=batches[-1].last_offset,
            epoch=owned.epoch,
            size=len(encoded.segment),
            max_timestamp=max(b.max_timestamp for b in batches),
        )
        body = memoryview(encoded.segment)[SEGMENT_HEADER_SIZE:-SEGMENT_FOOTER_SIZE]
        index_key = keys.index_object_key(*names)
        return UploadedSegment(
            ref, segment_key, body, batches, index_key, encoded.index, reservation
        )

    # --- commit ------------------------------------------------------------------------------

    def _prepare(self, items: list[Uploaded]) -> _Commit:
        """One partition's new state after its uploads of one or more rounds (in order)."""
        state = items[0].work.partition.state
        for item in items:
            for index, segment in enumerate(item.segments):
                last = index == len(item.segments) - 1
                state = commit_segment(state, segment.ref, item.work.producers if last else {})
            state = apply_txn_events(state, item.work.txn_events)
        state, spill = spill_aborted(state, self._settings.aborted_txns_in_state)
        return _Commit(items, state, state.to_json(), spill)

    def _spill_keys(self, commit: _Commit, refs: tuple[TxnIndexRef, ...]) -> list[str]:
        owned = commit.partition
        where = (owned.topic, owned.topic_id, owned.partition)
        return [aborted_index.object_key(self._cluster, *where, ref) for ref in refs]

    async def _write_spills(self, commits: list[_Commit]) -> list[_Commit]:
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
                self._discard(item)
        return ready

    def _spills_committed(self, commits: list[_Commit], succeeded: bool) -> None:
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
            self._spawn_side_task(self._delete_quietly(doomed), "aborted-index-cleanup")

    async def _commit(self, commits: list[_Commit]) -> list[Uploaded]:
        """One transaction; returns what it committed (all, or the unfenced ones one by one)."""
        if not commits:
            return []
        compares = []
        success = []
        for commit in commits:
            owned = commit.partition
            lease_key = keys.partition_lease_key(self._cluster, owned.topic, owned.partition)
            state_key = keys.partition_state_key(self._cluster, owned.topic, owned.partition)
            compares += [
                value_is(lease_key, self._me),
                create_revision_is(lease_key, owned.lease_revision),
                mod_revision_is(state_key, owned.state_revision),
            ]
            success.append(put_op(state_key, commit.document))
            self._view.expect_commit(owned.tp, commit.document, commit.state)
        try:
            result = await self._etcd.txn(compares, success)
        except MetadataUnavailable as exc:
            # The outcome is unknown (it may have been applied): the uploads stay.
            for commit in commits:
                for item in commit.items:
                    self._fail(item.work, MetadataTimeout(str(exc)))
            return []
        if not result.succeeded:
            if len(commits) > 1:
                landed: list[Uploaded] = []
                for commit in commits:  # find the fenced one(s); commit the rest
                    landed += await self._commit([commit])
                return landed
            for item in commits[0].items:
                self._fail(item.work, NotLeader("lease lost; commit fenced"))
                self._discard(item)
            self._spills_committed(commits, succeeded=False)
            return []
        for commit in commits:
            for item in commit.items:
                self._on_committed(item, commit.state, result.revision)
        self._spills_committed(commits, succeeded=True)
        return [item for commit in commits for item in commit.items]

    def _on_committed(self, item: Uploaded, state: PartitionState, revision: int) -> None:
        owned = item.work.partition
        owned.committed(state, revision)
        self._view.update_state(owned.tp, state, revision)
        for segment in item.segments:
            if segment.reservation is not None:
                segment.reservation.release()
            self._cache.put(segment.key, segment.body)
            for batch in segment.batches:
                if not batch.acked.done():
                    batch.acked.set_result(Ack(batch.base_offset, batch.append_time))

    def _fail(self, work: FlushWork, error: BaseException) -> None:
        self._give_up(work.partition, error, [work])


def record_round(seconds: float, landed: list[Uploaded]) -> None:
    """A committed round's duration, bytes and objects (a round that committed nothing, all
    its partitions given up, is not a flush)."""
    if landed:
        segments = [segment for item in landed for segment in item.segments]
        METRICS.flushed(seconds, sum(s.ref.size for s in segments), len(segments))
