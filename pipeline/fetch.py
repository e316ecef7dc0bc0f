"""Executor side: GET a task's segment objects and turn them into Arrow record batches.

Each Python worker keeps one event loop and one object store per connection (a boto3 client
costs tens of milliseconds to build; Spark reuses workers across tasks). The next segments are
fetched while the current one is decoded: the store's GETs run in its thread pool, so they make
progress while this thread parses.

A worker's first task takes what its imports left alive out of the garbage collector's full
passes (``process.freeze_imports_once``).

Segments are verified whole (``segments.decode_segment``: magics and the body's CRC32C). A
segment missing from the store, or a hole in the offsets, is data loss: an error naming the
offsets with ``failOnDataLoss``, skipped without it. Unless a newer compaction pass superseded
it: then a task of a compacted topic reads the rest of its range from the partition's current
objects (``relocate``), and any other task fails with "run the query again".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import replace

import pyarrow as pa

from kafscale.broker.metadata import keys
from kafscale.broker.protocol.record_batch import iter_batch_headers
from kafscale.broker.storage.factory import open_object_store
from kafscale.broker.storage.object_store import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.broker.storage.segments import SegmentCorrupt, decode_segment
from kafscale.broker.store_settings import EtcdSettings, StorageSettings
from kafscale.pipeline.decode import decode_records
from kafscale.pipeline.options import Connection, TaskReading, store_identity
from kafscale.pipeline.planning import DataLoss, ReadTask, SegmentObject, gap_in, relocated_task
from kafscale.pipeline.process import freeze_imports_once

log = logging.getLogger(__name__)

PREFETCH_SEGMENTS = 3

_loop: asyncio.AbstractEventLoop | None = None
_stores: dict[str, ObjectStore] = {}


def _worker_loop() -> asyncio.AbstractEventLoop:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


def _store_for(storage: StorageSettings) -> ObjectStore:
    cache_key = store_identity(storage)
    store = _stores.get(cache_key)
    if store is None:
        store = open_object_store(storage)
        _stores[cache_key] = store
    return store


class _Superseded(Exception):
    """A planned object is gone because a newer compaction pass superseded it: its kept records
    moved to that pass's objects, so the gap is neither cleaned records nor loss. ``resume``:
    the first offset not yet returned."""

    def __init__(self, key: str, resume: int) -> None:
        super().__init__(key)
        self.key = key
        self.resume = resume


def read_task(
    reading: TaskReading, task: ReadTask, etcd: EtcdSettings | None = None
) -> Iterator[pa.RecordBatch]:
    """The rows of ``task`` in offset order, one Arrow batch per segment.

    ``etcd`` (tasks of compacted topics): if a compaction pass superseded the planned objects,
    the rest of the range is read from the partition's current objects (two etcd reads per task
    at most); without it, or if that fails too, the task fails with "run the query again"."""
    freeze_imports_once()
    loop = _worker_loop()
    store = _store_for(reading.storage)
    try:
        yield from _read_range(loop, store, reading, task)
        return
    except _Superseded as moved:
        if etcd is None:
            raise RuntimeError(
                f"{moved.key} was superseded by a compaction pass while the query ran (the "
                "topic was not compacted when the query was planned, so the task cannot "
                "re-locate its offsets): run the query again"
            ) from None
        relocated = _relocated(loop, store, reading, etcd, task, moved)
    try:
        yield from _read_range(loop, store, reading, relocated)
    except _Superseded as again:
        raise RuntimeError(
            f"{again.key} was superseded by a compaction pass while the query ran, and again "
            "after the task re-located its offsets: run the query again"
        ) from None


def _relocated(
    loop: asyncio.AbstractEventLoop,
    store: ObjectStore,
    reading: TaskReading,
    etcd: EtcdSettings,
    task: ReadTask,
    moved: _Superseded,
) -> ReadTask:
    """The rest of ``task`` from the partition's current committed objects; the offsets that
    fell below the log start meanwhile are loss (``failOnDataLoss``), as ever."""
    from kafscale.pipeline.relocate import CannotRelocate, current_objects

    connection = Connection(reading.cluster, etcd, reading.storage)
    try:
        found = loop.run_until_complete(current_objects(connection, store, task, moved.resume))
    except CannotRelocate as exc:
        raise RuntimeError(
            f"{moved.key} was superseded by a compaction pass while the query ran, and the "
            f"task cannot re-locate its offsets ({exc}): run the query again"
        ) from exc
    if found is None:  # the topic was deleted: whatever was left of the range is gone
        _lost(task, (moved.resume, task.end), reading.fail_on_data_loss)
        return replace(task, start=task.end, segments=())
    view, segments = found
    log.info(
        "%s-%d: offsets from %d re-located to compaction generation %d (planned %d)",
        task.topic,
        task.partition,
        moved.resume,
        view.cleaned_generation,
        task.cleaned_generation,
    )
    relocated, lost = relocated_task(task, moved.resume, view, segments)
    if lost is not None:
        _lost(task, lost, reading.fail_on_data_loss)
    return relocated


def _read_range(
    loop: asyncio.AbstractEventLoop, store: ObjectStore, reading: TaskReading, task: ReadTask
) -> Iterator[pa.RecordBatch]:
    segment_keys = [
        s.key(reading.cluster, task.topic, task.topic_id, task.partition) for s in task.segments
    ]
    pending: list[asyncio.Task[bytes | None]] = []
    cleaned_root = keys.cleaned_root_prefix(
        reading.cluster, task.topic, task.topic_id, task.partition
    )
    try:
        yield from _decode_in_order(
            loop,
            store,
            task,
            segment_keys,
            pending,
            reading.include_headers,
            reading.fail_on_data_loss,
            cleaned_root,
        )
    finally:
        for leftover in pending:
            leftover.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))


def _decode_in_order(
    loop: asyncio.AbstractEventLoop,
    store: ObjectStore,
    task: ReadTask,
    segment_keys: list[str],
    pending: list[asyncio.Task[bytes | None]],
    include_headers: bool,
    fail_on_data_loss: bool,
    cleaned_root: str,
) -> Iterator[pa.RecordBatch]:
    expected = task.start
    for i, key in enumerate(segment_keys):
        while len(pending) < PREFETCH_SEGMENTS and i + len(pending) < len(segment_keys):
            pending.append(loop.create_task(_get(store, segment_keys[i + len(pending)])))
        data = loop.run_until_complete(pending.pop(0))
        if data is None and (
            task.segments[i].generation >= 0
            or loop.run_until_complete(_superseded(store, cleaned_root, task, task.segments[i]))
        ):
            raise _Superseded(key, expected)
        if data is None:
            continue  # gone: the offsets it held show up as a gap below
        body = _verified_body(key, data)
        for _, header in iter_batch_headers(body):
            if header.last_offset < expected:
                continue
            gap = gap_in(expected, header.base_offset, task.end, task.cleaned_upto)
            if gap is not None:
                _lost(task, gap, fail_on_data_loss)
            expected = header.last_offset + 1
        rows = decode_records(
            body, task.topic, task.partition, task.start, task.end, include_headers, task.aborted
        )
        if rows is not None:
            yield rows
    if max(expected, task.cleaned_upto) < task.end:
        _lost(task, (max(expected, task.cleaned_upto), task.end), fail_on_data_loss)


async def _superseded(
    store: ObjectStore, cleaned_root: str, task: ReadTask, segment: SegmentObject
) -> bool:
    """Whether a compaction pass newer than the task's plan wrote an object covering the
    missing plain ``segment`` (one LIST, only when an object is missing): then its records
    moved, and skipping the gap (``failOnDataLoss=false``) would silently drop kept records."""
    try:
        listed = await store.list(cleaned_root)
    except ObjectStoreError as exc:
        raise RuntimeError(f"cannot list {cleaned_root}: {exc}") from exc
    for info in listed:
        parsed = keys.parse_cleaned_key(cleaned_root, info.key)
        if parsed is not None and parsed[0] > task.cleaned_generation and parsed[2] <= segment.base:
            return True
    return False


async def _get(store: ObjectStore, key: str) -> bytes | None:
    try:
        return await store.get(key)
    except ObjectNotFound:
        return None
    except ObjectStoreError as exc:
        raise RuntimeError(f"cannot read segment {key}: {exc}") from exc


def _verified_body(key: str, data: bytes) -> memoryview:
    try:
        return decode_segment(data).body
    except SegmentCorrupt as exc:
        raise RuntimeError(f"segment {key} is corrupt: {exc}") from exc


def _lost(task: ReadTask, gap: tuple[int, int], fail_on_data_loss: bool) -> None:
    message = (
        f"{task.topic}-{task.partition}: offsets {gap[0]}..{gap[1] - 1} were deleted "
        "(retention or DeleteRecords) while the query ran"
    )
    if fail_on_data_loss:
        raise DataLoss(message + "; set failOnDataLoss=false to skip them")
    log.warning("%s; skipped (failOnDataLoss=false)", message)
