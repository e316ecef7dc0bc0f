"""The driver's side of ``format("kafscale")``: the batch and stream readers Spark plans with.

Each plans from etcd's committed partition states (``catalog``) with the pure decisions of
``planning``, in Spark's planner processes on the driver. What Spark pickles for the executors
is the ``TaskReader`` each becomes (``source``): the store's settings, never etcd's. ``source``
imports this module only when Spark asks it for a reader, so the processes that only resolve
the format or read rows never import etcd's client.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kafscale.pipeline.catalog import Catalog, PartitionEntry, run
from kafscale.pipeline.options import ReadOptions, TaskReading
from kafscale.pipeline.planning import (
    ReadTask,
    TopicPartition,
    check_spec_partitions,
    clamp_start,
    delay_batch,
    from_json_offsets,
    rate_limit,
    resolve_offset,
    split_bytes_for,
    split_tasks,
    to_json_offsets,
)
from kafscale.pipeline.process import freeze_imports_once
from kafscale.pipeline.source import TaskPartition, TaskReader, TaskStreamReader, read_partition

if TYPE_CHECKING:
    import pyarrow as pa


def _partitions(options: ReadOptions, tasks: list[ReadTask]) -> list[InputPartition]:
    etcd = options.connection.etcd
    return [TaskPartition(task, etcd if task.compacted else None) for task in tasks]


async def _entries(options: ReadOptions, catalog: Catalog) -> list[PartitionEntry]:
    return await catalog.partitions(options.subscription, require_topics=True)


async def _starting_offsets(options: ReadOptions, catalog: Catalog) -> dict[TopicPartition, int]:
    entries = await _entries(options, catalog)
    views = [entry.view for entry in entries]
    check_spec_partitions(options.starting, views, "startingOffsets")
    if options.starting_timestamp_ms is not None:
        return {
            entry.view.key: await catalog.offset_for_timestamp(entry, options.starting_timestamp_ms)
            for entry in entries
        }
    return {view.key: resolve_offset(options.starting, view, "start") for view in views}


async def _plan(
    options: ReadOptions,
    catalog: Catalog,
    starts: dict[TopicPartition, int] | None,
    ends: dict[TopicPartition, int] | None,
) -> list[ReadTask]:
    """Tasks for [start, end) of each partition; ``None`` means per the options. Partitions not
    in ``starts`` (new ones in a stream) are read from their earliest offset, as Spark does."""
    entries = await _entries(options, catalog)
    if starts is None:
        starts = await _starting_offsets(options, catalog)
    if ends is None:
        check_spec_partitions(options.ending, [e.view for e in entries], "endingOffsets")
        ends = {e.view.key: resolve_offset(options.ending, e.view, "end") for e in entries}
    ranges = []
    for entry in entries:
        view = entry.view
        if view.key not in ends:
            continue
        start = clamp_start(view, starts.get(view.key, view.log_start), options.fail_on_data_loss)
        end = min(ends[view.key], view.high_watermark)
        if start < end:
            entry = await catalog.with_aborted(entry, start, end)
            ranges.append((entry, start, end, await catalog.segments(entry, start)))
    total = sum(s.size for _, _, _, segments in ranges for s in segments)
    split = split_bytes_for(total, options.min_partitions)
    tasks: list[ReadTask] = []
    for entry, start, end, segments in ranges:
        tasks.extend(split_tasks(entry.view, start, end, segments, split))
    return tasks


def _plan_now(
    options: ReadOptions,
    starts: dict[TopicPartition, int] | None = None,
    ends: dict[TopicPartition, int] | None = None,
) -> list[ReadTask]:
    freeze_imports_once()

    async def plan() -> list[ReadTask]:
        async with Catalog(options.connection) as catalog:
            return await _plan(options, catalog, starts, ends)

    return run(plan())


def _latest_now(options: ReadOptions) -> dict[TopicPartition, int]:
    freeze_imports_once()

    async def latest() -> dict[TopicPartition, int]:
        async with Catalog(options.connection) as catalog:
            return {e.view.key: e.view.high_watermark for e in await _entries(options, catalog)}

    return run(latest())


def _initial_now(options: ReadOptions) -> dict[TopicPartition, int]:
    freeze_imports_once()

    async def initial() -> dict[TopicPartition, int]:
        async with Catalog(options.connection) as catalog:
            return await _starting_offsets(options, catalog)

    return run(initial())


class BatchReader(DataSourceReader):
    """``spark.read``: a snapshot of the committed offsets when the DataFrame is planned."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(self.options, _plan_now(self.options))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options.for_executors(), partition)

    def __reduce__(self) -> tuple[type[TaskReader], tuple[TaskReading]]:
        """Pickled (for the executors) as a ``TaskReader``: no etcd settings leave the driver.
        pyspark pickles the reader before it calls ``partitions()`` on the original."""
        return (TaskReader, (self.options.for_executors(),))


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches between committed high watermarks.

    The offsets in Spark's checkpoint are the truth: a restarted query continues from its last
    planned batch, so nothing is read twice or skipped. ``commit`` has nothing to do (no
    consumer group to move): it is Spark's journal, not the cluster, that records progress.

    ``minOffsetsPerTrigger`` / ``maxTriggerDelay`` are applied here, from the options: pyspark's
    ``ReadMinRows`` carries no delay and there is no composite limit to pair it with
    ``maxOffsetsPerTrigger``. As in Spark's Kafka source the first batch after a start is never
    held back, and ``Trigger.AvailableNow`` ignores the minimum (it would wait forever for
    offsets beyond its target)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._target: dict[TopicPartition, int] | None = None
        self._last_trigger_ms = 0.0

    def initialOffset(self) -> dict[str, Any]:
        return to_json_offsets(_initial_now(self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = _latest_now(self.options)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        latest = _latest_now(self.options)
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, end)) for tp, end in latest.items()}
        begin = from_json_offsets(start)
        if self._held_back(begin, latest, limit):
            return start
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return to_json_offsets(latest)

    def _held_back(
        self,
        begin: dict[TopicPartition, int],
        latest: dict[TopicPartition, int],
        limit: ReadLimit,
    ) -> bool:
        """Whether ``minOffsetsPerTrigger`` holds the next batch back; a batch let through
        restarts the ``maxTriggerDelay`` clock."""
        minimum = self.options.min_offsets_per_trigger
        if minimum is None or self._target is not None:
            return False
        if isinstance(limit, ReadAllAvailable) and self.options.max_offsets_per_trigger:
            return False  # Spark asked for everything (Trigger.Once): no admission control
        now_ms = time.time() * 1000
        delay_ms = self.options.max_trigger_delay_ms
        if delay_batch(begin, latest, minimum, now_ms, self._last_trigger_ms, delay_ms):
            return True
        self._last_trigger_ms = now_ms
        return False

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_json_offsets(_latest_now(self.options))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        tasks = _plan_now(self.options, from_json_offsets(start), from_json_offsets(end))
        return _partitions(self.options, tasks)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options.for_executors(), partition)

    def __reduce__(self) -> tuple[type[TaskStreamReader], tuple[TaskReading]]:
        """Pickled (for the executors) as a ``TaskStreamReader``, as ``BatchReader``: the
        driver's planning runs on the unpickled original in pyspark's streaming runner."""
        return (TaskStreamReader, (self.options.for_executors(),))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: progress lives in the query's checkpoint."""
