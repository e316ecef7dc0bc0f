"""A partition's committed state in etcd, and the pure decisions made on it.

The document at ``partitions/<topic>/<p>`` (JSON)::

    {"high_watermark": 120, "log_start_offset": 0, "leader_epoch": 3,
     "epochs": [[0, 0], [2, 57], [3, 100]],          # (leader epoch, start offset) history
     "recent_segments": [[100, 119, 3, 2048, 1700000000000]],  # the most recent committed
                  # segments: [base offset, last offset, epoch, size, largest timestamp]
     "producers": {"4001": [{"epoch": 0, "first_seq": 10, "last_seq": 19, "offset": 110}]},
                  # (+ "append_time" in LogAppendTime topics: what a retry is answered with)
     "max_timestamp": 1700000000000,                  # the largest record timestamp so far
     "time_marks": [[57, 1699999000000], [100, 1699999990000]],  # (offset, max timestamp below)
     "open_txns": {"4001": 118},                      # producer id -> first offset of its
                  # open transaction (only while some producer has one)
     "aborted_txns": [[4002, 60, 75]],                # (producer id, first offset, abort
                  # marker offset), oldest first; dropped once below the log start
     "aborted_txn_index": [[3, 50, 2, 256]],          # older aborted transactions, spilled
                  # to immutable objects: [lowest first offset, highest marker offset,
                  # writer's leader epoch, count] per object (see ``aborted_index``)
     "coordinator_epochs": {"4001": 2},               # the last marker's coordinator epoch
     "cleaned": [5000, 3, 7]}                         # log compaction: offsets below 5000 are
                  # served from generation 3's cleaned objects, written at leader epoch 7

``cleaned`` is written only once a compaction pass committed (see ``compaction_plan`` and
``docs/compaction.md``): a document without it was never cleaned. Plain segments wholly below
``upto`` are superseded (never served again; ``upto`` is always a plain segment's base), and the
cleaned objects of that one generation and epoch tile ``[log start, upto)``.

The four transaction fields are written only when non-empty, so a partition without
transactions keeps its document as small as before (see ``partition_txns`` for the decisions).

Segments are found in object storage by listing; ``recent_segments`` only keeps the newest few so
that readers of recent data need no listing. They are arrays rather than objects because the
document is rewritten on every commit: a full document at realistic magnitudes is 2.2 KB instead of
3.6 KB, for every partition and flush. Documents written before that hold them as objects under
``segments``; both are read, and a broker that knows only ``segments`` reads a newer document as one
without recent segments (it lists instead). A listed segment object is *committed* when its base
offset lies inside the offset range its epoch led (see :func:`is_committed_segment`): an upload from
a fenced writer starts at or after the next epoch's start offset, so it is ignored.

``time_marks`` let ListOffsets by timestamp start reading near its answer instead of at the log
start: a mark ``(offset, t)`` says that no record below ``offset`` has a timestamp above ``t``
(``t`` is the running maximum when the segment at ``offset`` was committed; timestamps need not
grow, so the maximum is what bounds them). At most ``MAX_TIME_MARKS`` are kept, thinned so that
they are dense near the head and sparse far back (see :func:`thin_time_marks`). A document from
before marks existed has no ``max_timestamp``: the maximum below its offsets is unknown, so that
partition gets marks only once nothing below its log start is left (retention or DeleteRecords
up to the high watermark); until then its look-ups start at the log start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

RECENT_SEGMENTS = 32
MAX_TIME_MARKS = 16
MAX_PRODUCERS = 256
MAX_EPOCHS = 64


@dataclass(frozen=True, slots=True)
class SegmentRef:
    base: int
    last: int
    epoch: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class ProducerState:
    """The last batch appended by an idempotent producer to this partition."""

    epoch: int
    first_seq: int
    last_seq: int
    offset: int
    append_time: int = -1
    """The time the batch was stamped with in a LogAppendTime topic (-1 otherwise): a retry of
    the batch is answered with it, as the first attempt was."""


class AbortedTxn(NamedTuple):
    """An aborted transaction's records on a partition: a read_committed consumer drops the
    producer's records from ``first_offset`` up to its abort marker at ``last_offset``."""

    producer_id: int
    first_offset: int
    last_offset: int


class Cleaned(NamedTuple):
    """Where a compacted partition's cleaned data lives: offsets below ``upto`` are served only
    from generation ``generation``'s cleaned objects, written by the owner at ``epoch``."""

    upto: int
    generation: int
    epoch: int


class TxnIndexRef(NamedTuple):
    """An aborted-transaction index object: the aborted transactions spilled from the state
    (``txn_count`` of them, first offsets from ``first_offset``, markers up to ``last_offset``),
    written by the owner at leader epoch ``epoch``. Its key derives from these fields."""

    first_offset: int
    last_offset: int
    epoch: int
    txn_count: int


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int = 0
    log_start_offset: int = 0
    leader_epoch: int = -1
    epochs: tuple[tuple[int, int], ...] = ()
    segments: tuple[SegmentRef, ...] = ()
    producers: dict[int, tuple[ProducerState, ...]] = field(default_factory=dict)
    """Per idempotent producer, its last batches here (oldest first, at most five)."""
    max_timestamp: int | None = -1
    """The largest timestamp of any committed record (-1: none yet; None: unknown)."""
    time_marks: tuple[tuple[int, int], ...] = ()
    open_txns: dict[int, int] = field(default_factory=dict)
    """Per producer with an open transaction here, the offset of its first batch in it."""
    aborted_txns: tuple[AbortedTxn, ...] = ()
    """Aborted transactions whose records are still readable, oldest first (the newest ones:
    older ones are in ``aborted_txn_index``)."""
    aborted_txn_index: tuple[TxnIndexRef, ...] = ()
    """Index objects holding the older aborted transactions still readable, oldest first."""
    coordinator_epochs: dict[int, int] = field(default_factory=dict)
    """Per transactional producer, the coordinator epoch of the last marker written for it: a
    marker from an older coordinator is fenced."""
    cleaned: Cleaned | None = None
    """The last committed compaction pass (None: never cleaned)."""

    def to_json(self) -> bytes:
        document = {
            "high_watermark": self.high_watermark,
            "log_start_offset": self.log_start_offset,
            "leader_epoch": self.leader_epoch,
            "epochs": [list(entry) for entry in self.epochs],
            "recent_segments": [_segment_to_list(s) for s in self.segments],
            "producers": {
                str(pid): [_producer_to_dict(p) for p in batches]
                for pid, batches in self.producers.items()
            },
        }
        if self.max_timestamp is not None:
            document["max_timestamp"] = self.max_timestamp
        if self.time_marks:
            document["time_marks"] = [list(mark) for mark in self.time_marks]
        if self.open_txns:
            document["open_txns"] = {str(pid): first for pid, first in self.open_txns.items()}
        if self.aborted_txns:
            document["aborted_txns"] = [list(txn) for txn in self.aborted_txns]
        if self.aborted_txn_index:
            document["aborted_txn_index"] = [list(ref) for ref in self.aborted_txn_index]
        if self.coordinator_epochs:
            document["coordinator_epochs"] = {
                str(pid): epoch for pid, epoch in self.coordinator_epochs.items()
            }
        if self.cleaned is not None:
            document["cleaned"] = list(self.cleaned)
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PartitionState:
        document = json.loads(data)
        return cls(
            high_watermark=int(document["high_watermark"]),
            log_start_offset=int(document.get("log_start_offset", 0)),
            leader_epoch=int(document.get("leader_epoch", -1)),
            epochs=tuple((int(e), int(s)) for e, s in document.get("epochs", [])),
            segments=_segments(document),
            producers={
                int(pid): _producer_batches(batches)
                for pid, batches in document.get("producers", {}).items()
            },
            max_timestamp=int(document["max_timestamp"]) if "max_timestamp" in document else None,
            time_marks=tuple((int(o), int(t)) for o, t in document.get("time_marks", [])),
            open_txns={int(p): int(f) for p, f in document.get("open_txns", {}).items()},
            aborted_txns=tuple(
                AbortedTxn(int(p), int(f), int(last))
                for p, f, last in document.get("aborted_txns", [])
            ),
            aborted_txn_index=tuple(
                TxnIndexRef(int(f), int(last), int(e), int(n))
                for f, last, e, n in document.get("aborted_txn_index", [])
            ),
            coordinator_epochs={
                int(p): int(e) for p, e in document.get("coordinator_epochs", {}).items()
            },
            cleaned=Cleaned(*(int(v) for v in document["cleaned"]))
            if "cleaned" in document
            else None,
        )


def _segment_to_list(segment: SegmentRef) -> list[int]:
    return [segment.base, segment.last, segment.epoch, segment.size, segment.max_timestamp]


def _segments(document: dict[str, Any]) -> tuple[SegmentRef, ...]:
    if "recent_segments" in document:
        return tuple(
            SegmentRef(int(b), int(last), int(e), int(size), int(ts))
            for b, last, e, size, ts in document["recent_segments"]
        )
    return tuple(SegmentRef(**s) for s in document.get("segments", []))  # before arrays


def _producer_batches(value: list[dict[str, int]] | dict[str, int]) -> tuple[ProducerState, ...]:
    entries = value if isinstance(value, list) else [value]  # older documents kept one batch
    return tuple(ProducerState(**entry) for entry in entries)


def _producer_to_dict(producer: ProducerState) -> dict[str, int]:
    document = {
        "epoch": producer.epoch,
        "first_seq": producer.first_seq,
        "last_seq": producer.last_seq,
        "offset": producer.offset,
    }
    if producer.append_time >= 0:  # LogAppendTime topics only: other documents stay as small
        document["append_time"] = producer.append_time
    return document


def start_epoch(state: PartitionState) -> PartitionState:
    """The state after a new owner takes the partition: next epoch, starting at the HW."""
    epoch = state.leader_epoch + 1
    history = state.epochs
    if history and history[-1][1] == state.high_watermark:
        # The previous epoch wrote nothing committed; keep the history short.
        history = history[:-1]
    history = (*history, (epoch, state.high_watermark))
    # Forget an epoch only once everything it led lies below the log start: until then its
    # range is what tells its committed segments from a fenced writer's orphans.
    while len(history) > MAX_EPOCHS and history[1][1] <= state.log_start_offset:
        history = history[1:]
    return replace(state, leader_epoch=epoch, epochs=history)


def commit_segment(
    state: PartitionState,
    segment: SegmentRef,
    producers: dict[int, tuple[ProducerState, ...]],
) -> PartitionState:
    """The state after ``segment`` (the next offsets of this epoch) is committed."""
    if segment.base != state.high_watermark:
        raise ValueError(f"segment base {segment.base} is not the HW {state.high_watermark}")
    merged = {**state.producers, **producers}
    if len(merged) > MAX_PRODUCERS:
        newest = sorted(merged.items(), key=lambda item: item[1][-1].offset)[-MAX_PRODUCERS:]
        merged = dict(newest)
    max_timestamp, time_marks = _time_bounds_after(state, segment)
    return replace(
        state,
        high_watermark=segment.last + 1,
        segments=(*state.segments, segment)[-RECENT_SEGMENTS:],
        producers=merged,
        max_timestamp=max_timestamp,
        time_marks=time_marks,
    )


def _time_bounds_after(
    state: PartitionState, segment: SegmentRef
) -> tuple[int | None, tuple[tuple[int, int], ...]]:
    """``max_timestamp`` and ``time_marks`` once ``segment`` is committed."""
    below = state.max_timestamp
    if below is None and state.log_start_offset == state.high_watermark:
        below = -1  # nothing readable below this segment: what was there no longer matters
    if below is None:
        return None, state.time_marks  # unknown below: no mark can be true
    marks = state.time_marks
    if segment.base > state.log_start_offset:
        marks = thin_time_marks(
            (*marks, (segment.base, below)),
            state.log_start_offset,
            segment.last + 1,
            MAX_TIME_MARKS,
        )
    return max(below, segment.max_timestamp), marks


def thin_time_marks(
    marks: tuple[tuple[int, int], ...], log_start: int, head: int, limit: int
) -> tuple[tuple[int, int], ...]:
    """At most ``limit`` marks above ``log_start``; while there are too many, drop the inner mark
    whose loss widens a gap the least relative to its distance from ``head``. Look-ups near the
    head (the common case) keep reading little; far back, a look-up may read more."""
    kept = [mark for mark in marks if mark[0] > log_start]
    while len(kept) > max(limit, 2):
        drop = min(
            range(1, len(kept) - 1),
            key=lambda i: (kept[i + 1][0] - kept[i - 1][0]) / (head - kept[i][0]),
        )
        del kept[drop]
    return tuple(kept)


def time_scan_start(state: PartitionState, timestamp: int) -> int:
    """The offset to start looking for the first record at or after ``timestamp``: every record
    below it is older (the highest mark whose bound is below ``timestamp``)."""
    start = state.log_start_offset
    for offset, bound in state.time_marks:
        if bound < timestamp and offset > start:
            start = offset
    return min(start, state.high_watermark)


def is_committed_segment(state: PartitionState, base: int, epoch: int) -> bool:
    """Whether the plain segment written at ``base`` by the owner of ``epoch`` holds committed
    data (a segment below the cleaned range's ``upto`` is superseded by the cleaned objects)."""
    if base >= state.high_watermark:
        return False
    if state.cleaned is not None and base < state.cleaned.upto:
        return False
    start, end = epoch_range(state, epoch)
    return start <= base < end


def is_committed_cleaned(state: PartitionState, generation: int, epoch: int, base: int) -> bool:
    """Whether a cleaned object of ``generation`` written at ``epoch``, covering offsets from
    ``base``, is part of the committed cleaned range (other generations: superseded or a fenced
    or crashed pass's orphans)."""
    cleaned = state.cleaned
    return (
        cleaned is not None
        and (generation, epoch) == (cleaned.generation, cleaned.epoch)
        and base < cleaned.upto
    )


def epoch_range(state: PartitionState, epoch: int) -> tuple[int, int]:
    """[start, end) offsets led by ``epoch``; an epoch missing from history owns nothing."""
    for index, (known_epoch, start) in enumerate(state.epochs):
        if known_epoch == epoch:
            if index + 1 < len(state.epochs):
                return start, state.epochs[index + 1][1]
            return start, state.high_watermark
    if state.epochs and epoch < state.epochs[0][0]:
        # History is trimmed from the front; older epochs end where the oldest known starts.
        return 0, state.epochs[0][1]
    return 0, 0


def end_offset_for_epoch(state: PartitionState, requested_epoch: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch: (largest epoch <= requested, the end offset of that epoch)."""
    chosen = None
    for index, (epoch, _start) in enumerate(state.epochs):
        if epoch <= requested_epoch:
            chosen = index
    if chosen is None:
        return -1, -1
    epoch = state.epochs[chosen][0]
    if chosen + 1 < len(state.epochs):
        return epoch, state.epochs[chosen + 1][1]
    return epoch, state.high_watermark


def advance_log_start(state: PartitionState, offset: int) -> PartitionState:
    """DeleteRecords / retention: records below ``offset`` are no longer served."""
    offset = min(max(offset, state.log_start_offset), state.high_watermark)
    aborted = tuple(txn for txn in state.aborted_txns if txn.last_offset >= offset)
    index = tuple(ref for ref in state.aborted_txn_index if ref.last_offset >= offset)
    return replace(state, log_start_offset=offset, aborted_txns=aborted, aborted_txn_index=index)
