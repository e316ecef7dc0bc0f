"""A flush round's uploads: its segments, their indexes, and the deletion of what never commits.

Each partition's share of a round is encoded into segments (into buffers the segment cache
lends, so a committed segment is cached without a copy) and PUT under keys that carry the
writer's epoch: objects are never overwritten, and a fenced writer's late upload is an orphan
readers ignore.

Index objects (of segments from ``index_min_segment_bytes`` up) follow after the commit, off the
ack path, in side tasks that do not hold a round's slot. Uploads that can no longer be committed
(the partition was given up or its topic deleted while they were in flight, or the commit was
fenced) are deleted again, and so are indexes that land after their topic was deleted: the
broker deleting a topic lists its objects once, and an upload landing after that list would
otherwise stay forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.partition_state import SegmentRef
from kafscale.broker.metadata.topics import topic_exists
from kafscale.broker.storage.cache import Reservation, SegmentCache
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import FlushWork, OwnedPartition, PendingBatch
from kafscale.broker.storage.segments import (
    SEGMENT_FOOTER_SIZE,
    SEGMENT_HEADER_SIZE,
    encode_segment,
)
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)


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


class SideTasks:
    """Work off the ack path (index uploads, deletions of uncommitted uploads): each task is
    kept here until it ends, and shutdown gives the ones still running a grace period."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = start_task(coroutine, name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def finish(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` for the tasks in flight, then cancel the rest (both kinds
        are optional: a reader without an index reads whole segments; the janitor of the next
        owner deletes uploads of an older epoch that never got committed)."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=grace_s)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class SegmentUploader:
    """PUTs a round's segments and, once committed, their indexes; deletes what never commits."""

    def __init__(
        self,
        settings: LogSettings,
        cluster: str,
        etcd: Etcd,
        store: ObjectStore,
        cache: SegmentCache,
        side_tasks: SideTasks,
    ) -> None:
        self._settings = settings
        self._cluster = cluster
        self._etcd = etcd
        self._store = store
        self._cache = cache
        self._side_tasks = side_tasks

    async def upload(self, work: FlushWork, reservations: list[Reservation]) -> Uploaded:
        """One partition's segments of a round; the cache buffers they were built in are
        appended to ``reservations`` (released by the round if it never caches them)."""
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

    def start_index_uploads(self, committed: list[Uploaded]) -> None:
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
            self._side_tasks.spawn(self._upload_indexes(indexes), "index-uploads")

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

    def discard(self, item: Uploaded) -> None:
        """Delete the segments of an upload that will never be committed."""
        self.delete_later([segment.key for segment in item.segments], "discard-uploads")

    def delete_later(self, keys_: list[str], name: str) -> None:
        """Delete objects no state references, off the ack path (failures only logged)."""
        self._side_tasks.spawn(self._delete_quietly(keys_), name)

    async def _delete_quietly(self, keys_: list[str]) -> None:
        try:
            await self._store.delete_many(keys_)
        except ObjectStoreError as exc:
            log.warning("could not delete %d uncommitted object(s): %s", len(keys_), exc)
