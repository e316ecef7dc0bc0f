"""Pure planning decisions of the data source: offset ranges, data loss, admission, splits.

Everything here takes the committed state read from etcd (and a segment listing) as values and
returns values; the I/O lives in ``catalog`` (driver) and ``fetch`` (executors).

Offsets in a stream's checkpoint are Spark Kafka's JSON shape, ``{"topic": {"0": 42}}``: the
next offset to read per partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import AbortedTxn
from kafscale.pipeline.options import EARLIEST, LATEST, OffsetSpec

TopicPartition = tuple[str, int]

SPLIT_BYTES = 32 * 1024 * 1024
"""Segment bytes per Spark task: big enough that a task's start-up is noise, small enough that a
topic with a few partitions still spreads over the executors' cores."""


class DataLoss(RuntimeError):
    """Records the query asked for are gone (retention, DeleteRecords, a deleted topic) and
    ``failOnDataLoss`` is true."""


@dataclass(frozen=True, slots=True)
class PartitionView:
    """A partition's committed state as read on the driver."""

    topic: str
    topic_id: str
    partition: int
    log_start: int
    high_watermark: int
    """Where reading stops: the partition's last stable offset (its high watermark unless a
    transaction is open), so that only decided transactions are read."""
    aborted: tuple[AbortedTxn, ...] = ()
    """Aborted transactions whose records are still stored: their records are skipped."""
    cleaned_upto: int = 0
    """Log compaction: offsets below this are read from cleaned objects, where records cleaned
    away leave gaps that are not loss (``docs/compaction.md``)."""
    cleaned_generation: int = -1
    """The compaction generation those cleaned objects belong to (-1: never cleaned)."""
    compacted: bool = False
    """A pass may supersede the objects planned here while a task reads them (the topic is
    compacted, or was cleaned before): its tasks may need to re-locate their offsets."""

    @property
    def key(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class SegmentObject:
    """A committed segment object: its base offset, writer epoch and size in bytes."""

    base: int
    epoch: int
    size: int
    generation: int = -1
    """A cleaned object of this compaction generation, written at ``epoch`` (-1: plain)."""

    def key(self, cluster: str, topic: str, topic_id: str, partition: int) -> str:
        """The object's key in the store."""
        if self.generation >= 0:
            prefix = keys.cleaned_pass_prefix(
                cluster, topic, topic_id, partition, self.generation, self.epoch
            )
            return keys.cleaned_object_key(prefix, self.base)
        key: str = keys.segment_object_key(
            cluster, topic, topic_id, partition, self.base, self.epoch
        )
        return key


@dataclass(frozen=True, slots=True)
class ReadTask:
    """One Spark task: offsets [start, end) of a partition, read from ``segments`` (in order).

    ``start`` and ``end`` are the bounds of the rows it returns, not of the segments, which may
    hold more. Picklable: it travels to an executor."""

    topic: str
    topic_id: str
    partition: int
    start: int
    end: int
    segments: tuple[SegmentObject, ...]
    aborted: tuple[AbortedTxn, ...] = ()
    """The aborted transactions with records in [start, end): skipped."""
    cleaned_upto: int = 0
    """Gaps below this offset are records log compaction removed, not loss."""
    cleaned_generation: int = -1
    """The compaction generation planned (-1: none): a newer one may have superseded the
    task's objects by the time it reads them."""
    compacted: bool = False
    """``PartitionView.compacted``: the task gets what it needs to re-locate its offsets."""


def resolve_offset(spec: OffsetSpec, view: PartitionView, name: str) -> int:
    """The offset ``spec`` means for ``view`` (earliest = log start, latest = high watermark)."""
    if isinstance(spec, int):
        wanted = spec
    else:
        wanted = spec.get(view.topic, {}).get(
            view.partition, EARLIEST if name == "start" else LATEST
        )
    if wanted == EARLIEST:
        return view.log_start
    if wanted == LATEST:
        return view.high_watermark
    return wanted


def check_spec_partitions(spec: OffsetSpec, views: Iterable[PartitionView], option: str) -> None:
    """Per-partition offsets must name partitions the query reads, as in Spark."""
    if isinstance(spec, int):
        return
    known = {view.key for view in views}
    for topic, partitions in spec.items():
        for partition in partitions:
            if (topic, partition) not in known:
                raise ValueError(
                    f"{option} names {topic}-{partition}, which this query does not read"
                )


def clamp_start(view: PartitionView, start: int, fail_on_data_loss: bool) -> int:
    """Where reading really starts. Records below the log start are gone: with
    ``failOnDataLoss`` that is an error, without it reading starts at the log start. An offset
    beyond the high watermark (a topic deleted and created anew) is the same kind of loss."""
    if start > view.high_watermark:
        if fail_on_data_loss:
            raise DataLoss(
                f"{view.topic}-{view.partition}: offset {start} is beyond the high watermark "
                f"{view.high_watermark} (was the topic deleted and created again?). Set "
                "failOnDataLoss=false to read from the earliest offset instead."
            )
        return view.log_start
    if start < view.log_start:
        if fail_on_data_loss:
            raise DataLoss(
                f"{view.topic}-{view.partition}: offsets {start}..{view.log_start - 1} were "
                "deleted (retention or DeleteRecords) before they were read. Set "
                "failOnDataLoss=false to skip them."
            )
        return view.log_start
    return start


def segments_for(
    segments: Sequence[SegmentObject], start: int, end: int
) -> tuple[SegmentObject, ...]:
    """The segments (sorted by base) that may hold offsets in [start, end): the one at or below
    ``start`` and every later one below ``end``."""
    if start >= end:
        return ()
    first = 0
    for i, segment in enumerate(segments):
        if segment.base <= start:
            first = i
    return tuple(s for s in segments[first:] if s.base < end)


def split_tasks(
    view: PartitionView,
    start: int,
    end: int,
    segments: Sequence[SegmentObject],
    split_bytes: int = SPLIT_BYTES,
) -> list[ReadTask]:
    """Tasks covering [start, end) of one partition, each about ``split_bytes`` of segments;
    a split falls on a segment boundary, so no segment is read twice."""
    chosen = segments_for(segments, start, end)
    if not chosen:
        return [] if start >= end else [_task(view, start, end, ())]
    groups: list[list[SegmentObject]] = [[]]
    size = 0
    for segment in chosen:
        if groups[-1] and size + segment.size > split_bytes:
            groups.append([])
            size = 0
        groups[-1].append(segment)
        size += segment.size
    tasks = []
    for i, group in enumerate(groups):
        low = start if i == 0 else group[0].base
        high = end if i == len(groups) - 1 else groups[i + 1][0].base
        tasks.append(_task(view, low, high, tuple(group)))
    return tasks


def _task(
    view: PartitionView, start: int, end: int, segments: tuple[SegmentObject, ...]
) -> ReadTask:
    aborted = tuple(t for t in view.aborted if t.last_offset >= start and t.first_offset < end)
    return ReadTask(
        view.topic,
        view.topic_id,
        view.partition,
        start,
        end,
        segments,
        aborted,
        view.cleaned_upto,
        view.cleaned_generation,
        view.compacted,
    )


def relocated_task(
    task: ReadTask, resume: int, view: PartitionView, segments: Sequence[SegmentObject]
) -> tuple[ReadTask, tuple[int, int] | None]:
    """What is left of ``task`` (offsets [resume, end), the rows before ``resume`` having been
    returned) once a compaction pass superseded its planned objects, read from the objects of
    the partition's current committed state ``view`` instead; and the offsets among them that
    fell below the current log start meanwhile (retention, DeleteRecords: loss, as ever).

    The bounds stay the plan's: a pass keeps offsets and only removes records, so the same
    range of a newer generation is what a consumer reading after the pass gets, never beyond
    the planned end (itself at most the last stable offset the plan saw, which never moves
    back). The planned aborted transactions stay too: a pass drops their records together with
    their entries in the state, so a planned entry either still filters its records or has
    nothing left to filter; and within one of them the producer wrote nothing committed."""
    start = max(resume, min(view.log_start, task.end))
    lost = (resume, start) if start > resume else None
    relocated = replace(
        task,
        start=start,
        segments=segments_for(segments, start, task.end),
        cleaned_upto=view.cleaned_upto,
        cleaned_generation=view.cleaned_generation,
    )
    return relocated, lost


def split_bytes_for(total_bytes: int, min_partitions: int | None) -> int:
    """``minPartitions`` asks for at least that many tasks: smaller splits when data is there."""
    if not min_partitions:
        return SPLIT_BYTES
    return max(1, min(SPLIT_BYTES, math.ceil(total_bytes / min_partitions)))


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_offsets: int
) -> dict[TopicPartition, int]:
    """``maxOffsetsPerTrigger``: the ends of the next micro-batch, at most ``max_offsets``
    offsets in all, shared among partitions in proportion to their backlog (Spark's rule)."""
    backlog = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(latest)
    result = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_offsets * backlog[tp] / total
        step = math.floor(share) if share >= 1 else math.ceil(share)
        result[tp] = min(end, begin + step)
    return result


def delay_batch(
    start: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    min_offsets: int,
    now_ms: float,
    last_trigger_ms: float,
    max_delay_ms: int,
) -> bool:
    """``minOffsetsPerTrigger``: hold the next micro-batch back while fewer than ``min_offsets``
    new offsets are there, unless ``max_delay_ms`` (``maxTriggerDelay``) passed since the last
    batch was let through. Spark's Kafka source rule, new partitions counted from offset 0."""
    if now_ms - last_trigger_ms >= max_delay_ms:
        return False
    new = sum(max(0, end - start.get(tp, 0)) for tp, end in latest.items())
    return new < min_offsets


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """The checkpoint's shape: ``{"topic": {"0": 42}}``, topics and partitions sorted."""
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return document


def from_json_offsets(document: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }


def gap_in(
    expected: int, batch_base: int, limit: int, cleaned_upto: int = 0
) -> tuple[int, int] | None:
    """Offsets missing between the reader's next offset and the next stored batch (both below
    ``limit``): a deleted or lost segment. Offsets are dense in KafScale, so any gap is loss,
    except below ``cleaned_upto``, where log compaction removed records."""
    expected = max(expected, cleaned_upto)
    if batch_base > expected and expected < limit:
        return expected, min(batch_base, limit)
    return None
