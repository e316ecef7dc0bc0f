"""Retention by time and size: which whole segments may go. A pure decision.

Retention applies to topics whose ``cleanup.policy`` includes ``delete``. A compacted topic
(``compact`` alone: Kafka Connect's config and offset topics, a schema registry's ``_schemas``)
is never trimmed by time or size in Kafka, only compacted; KafScale does not compact, so such a
topic keeps every record, a superset of what a compacted log holds (readers of compacted topics
already take the last value per key).

Kafka deletes whole segments, never part of one: the new log start offset is the base of the
oldest segment that is kept. A segment's age is taken from its creation time (when it was
flushed, which is when its newest record was appended), so nothing is deleted early.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    base: int
    size: int
    created_at_ms: int


def retention_limits(configs: Mapping[str, str]) -> tuple[int, int]:
    """``(retention.ms, retention.bytes)`` as they apply to a topic with these effective configs;
    ``-1`` for no limit, both for a topic that is compacted only."""
    policies = {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}
    if "delete" not in policies:
        return -1, -1
    return int(configs["retention.ms"]), int(configs["retention.bytes"])


def decide_log_start(
    segments: Sequence[SegmentFacts],
    high_watermark: int,
    log_start_offset: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
) -> int:
    """The log start offset after retention (never lower than the current one).

    ``segments``: the committed segments, oldest first. ``-1`` disables a limit.
    """
    if not segments:
        return log_start_offset  # nothing listed (yet): never expire what we cannot see
    ordered = sorted(segments, key=lambda s: s.base)
    keep_from = 0
    if retention_ms >= 0:
        while keep_from < len(ordered) and ordered[keep_from].created_at_ms < now_ms - retention_ms:
            keep_from += 1
    if retention_bytes >= 0:
        total = sum(s.size for s in ordered[keep_from:])
        while keep_from < len(ordered) and total > retention_bytes:
            total -= ordered[keep_from].size
            keep_from += 1
    if keep_from == 0:
        # Nothing expired: the start stays, even where the listing starts above it (a
        # compaction pass committed and its superseded objects went during the listing; read
        # as "the log starts at the first listed segment", that dropped every cleaned record).
        return log_start_offset
    new_start = ordered[keep_from].base if keep_from < len(ordered) else high_watermark
    return max(log_start_offset, min(new_start, high_watermark))


def deletable_bases(segment_bases: Sequence[int], log_start_offset: int) -> list[int]:
    """Bases of segments lying wholly below the log start (the next segment starts at or before
    it); the segment containing the log start stays."""
    ordered = sorted(set(segment_bases))
    return [
        base
        for index, base in enumerate(ordered)
        if index + 1 < len(ordered) and ordered[index + 1] <= log_start_offset
    ]
