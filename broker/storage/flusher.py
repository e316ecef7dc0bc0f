"""The flush pipeline's round loop: group commit, segments cut at ``segment.bytes``, commits
in order.

``segment.bytes`` is the topic's config where it sets one, else the broker's
``log.segment_bytes``.

A *round* takes what every owned partition has buffered, cuts it into segments of at most
``segment_bytes``, and uploads them all in parallel (``flush_upload``). Rounds start by group
commit (``flush_schedule``): as soon as a batch is buffered and one of ``MAX_ROUNDS_IN_FLIGHT``
round slots is free, after the coalescing window and no sooner than the store's minimum interval
after the previous round (``log.flush_min_interval_ms``, which bounds PUTs per second), and never
later than ``flush_interval_ms`` after the batch came. An ack therefore costs one PUT and one
etcd commit, not a wait for a timer: a producer that waits for each ack (or allows five requests
in flight, as every idempotent one does) is no longer held to a few requests per tick. Batches
that arrive while rounds are uploading gather for the next one, so under load rounds grow instead
of multiplying. On S3 two rounds may upload at once (``flush_schedule.MAX_UPLOADING``): one slow
PUT then no longer holds back the next round, which cut the produce p99 at 1,000 records/s
2-6x on a loaded machine. As soon as a partition has a segment's worth buffered, a round
takes the whole segments of every partition at once and leaves the rest (see ``partition_log``);
handoff and shutdown take everything at once.

Commits happen in the order rounds started, under one lock: a round commits only after the
previous round committed, and each partition's new state follows from the state the previous
commit left. Rounds whose uploads are done when the commit before them ends are committed
together, in one etcd transaction per group of partitions (``flush_commit``: grouping, fencing,
spills of aborted transactions).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import topics
from kafscale.broker.metadata.cluster import ClusterView, TopicPartition
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.errors import NotLeader, StorageFailure
from kafscale.broker.storage.cache import Reservation, SegmentCache
from kafscale.broker.storage.flush_commit import FlushCommitter
from kafscale.broker.storage.flush_schedule import RoundPolicy, Wait, decide_round
from kafscale.broker.storage.flush_upload import SegmentUploader, SideTasks, Uploaded
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.storage.partition_log import FlushWork, OwnedPartition

log = logging.getLogger(__name__)

MAX_ROUNDS_IN_FLIGHT = 4
SIDE_TASKS_GRACE_S = 2.0  # how long shutdown waits for index uploads and clean-ups in flight

GiveUp = Callable[[OwnedPartition, BaseException, list[FlushWork]], None]


@dataclass(slots=True)
class _RoundInFlight:
    """A round between its start and its commit; ``results`` once its uploads are done."""

    works: list[FlushWork]
    committed: asyncio.Future[None]
    results: list[Uploaded | BaseException] | None = None


class Flusher:
    """Starts flush rounds as ``flush_schedule`` decides and commits them in the order they
    started; owns the round tasks and the side tasks, and stops them on the way out."""

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
        self._view = view
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
        self._side_tasks = SideTasks()
        self._uploads = SegmentUploader(settings, cluster, etcd, store, cache, self._side_tasks)
        self._commits = FlushCommitter(
            settings, cluster, broker_id, etcd, view, store, cache, owned, self._uploads, self._fail
        )

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
            await self._side_tasks.finish(SIDE_TASKS_GRACE_S)

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

    def segment_bytes(self, owned: OwnedPartition) -> int:
        return topics.segment_bytes(
            self._view.topics.get(owned.topic), self._settings.segment_bytes
        )

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
                *(self._uploads.upload(w, reservations) for w in works), return_exceptions=True
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
                self._uploads.start_index_uploads(landed)
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
            return await self._commits.commit_round(works, results)
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

    def _fail(self, work: FlushWork, error: BaseException) -> None:
        self._give_up(work.partition, error, [work])


def record_round(seconds: float, landed: list[Uploaded]) -> None:
    """A committed round's duration, bytes and objects (a round that committed nothing, all
    its partitions given up, is not a flush)."""
    if landed:
        segments = [segment for item in landed for segment in item.segments]
        METRICS.flushed(seconds, sum(s.ref.size for s in segments), len(segments))
