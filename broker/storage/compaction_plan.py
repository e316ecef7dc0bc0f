"""Whether and how far to clean a compacted partition: pure decisions, as Kafka's LogCleaner
makes them (``docs/compaction.md``).

A pass cleans from the log start up to a *dirty end*: the base of a plain segment, so that a
plain segment never straddles what was cleaned. The end never passes the newest committed
segment (Kafka never cleans the active segment), the last stable offset (an open transaction's
data is not decided yet) nor a segment younger than ``min.compaction.lag.ms``. A pass runs when
the dirty bytes are at least ``min.cleanable.dirty.ratio`` of everything since the log start, or
when dirty data is older than ``max.compaction.lag.ms``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kafscale.broker.metadata.partition_state import PartitionState

NO_LAG_LIMIT_MS = 2**63 - 1  # Kafka's default max.compaction.lag.ms: Long.MAX_VALUE

COMPACTION_DEFAULTS: dict[str, str] = {
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(NO_LAG_LIMIT_MS),
    "delete.retention.ms": "86400000",
}


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """A compacted topic's cleaning settings (Kafka's topic configs of the same names)."""

    min_dirty_ratio: float = 0.5
    min_lag_ms: int = 0
    max_lag_ms: int = NO_LAG_LIMIT_MS
    delete_retention_ms: int = 86_400_000


@dataclass(frozen=True, slots=True)
class PlainSegment:
    """A committed plain segment at or above the cleaned range: offsets [base, end)."""

    base: int
    end: int
    size: int
    created_at_ms: int


def is_compacted(configs: Mapping[str, str]) -> bool:
    """Whether a topic with these effective configs is cleaned (``compact`` or
    ``compact,delete``)."""
    return "compact" in {p.strip() for p in configs.get("cleanup.policy", "delete").split(",")}


def cleaner_config(configs: Mapping[str, str]) -> CleanerConfig:
    """The topic's cleaning settings; a value that does not parse takes Kafka's default."""
    merged = {**COMPACTION_DEFAULTS, **configs}

    def number(name: str) -> float:
        try:
            return float(merged[name])
        except ValueError:
            return float(COMPACTION_DEFAULTS[name])

    return CleanerConfig(
        min_dirty_ratio=number("min.cleanable.dirty.ratio"),
        min_lag_ms=int(number("min.compaction.lag.ms")),
        max_lag_ms=int(number("max.compaction.lag.ms")),
        delete_retention_ms=int(number("delete.retention.ms")),
    )


def last_stable_offset(state: PartitionState) -> int:
    """The first offset of the oldest open transaction, or the high watermark."""
    return min([state.high_watermark, *state.open_txns.values()])


def cleanable_end(
    segments: Sequence[PlainSegment], last_stable: int, now_ms: int, min_lag_ms: int
) -> int | None:
    """The furthest dirty end: the end of the longest run of ``segments`` (oldest first, every
    committed one at or above the cleaned range) that excludes the newest, ends at or below
    ``last_stable`` and holds no segment younger than ``min_lag_ms``. None: nothing cleanable."""
    end = None
    for segment in list(segments)[:-1]:
        if segment.end > last_stable or segment.created_at_ms > now_ms - min_lag_ms:
            break
        end = segment.end
    return end


def should_clean(
    segments: Sequence[PlainSegment],
    dirty_end: int,
    cleaned_bytes: int,
    now_ms: int,
    config: CleanerConfig,
) -> bool:
    """Whether a pass up to ``dirty_end`` is due: the dirty ratio reached
    ``min.cleanable.dirty.ratio`` (dirty bytes over cleaned plus all plain bytes), or the oldest
    dirty segment is older than ``max.compaction.lag.ms``."""
    dirty = [s for s in segments if s.end <= dirty_end]
    if not dirty:
        return False
    dirty_bytes = sum(s.size for s in dirty)
    total = cleaned_bytes + sum(s.size for s in segments)
    if total > 0 and dirty_bytes / total >= config.min_dirty_ratio:
        return True
    oldest = min(s.created_at_ms for s in dirty)
    return config.max_lag_ms < NO_LAG_LIMIT_MS and oldest < now_ms - config.max_lag_ms


def plan_dirty_end(
    segments: Sequence[PlainSegment],
    state: PartitionState,
    cleaned_bytes: int,
    now_ms: int,
    config: CleanerConfig,
) -> int | None:
    """The dirty end of the pass to run now, or None when none is due."""
    end = cleanable_end(segments, last_stable_offset(state), now_ms, config.min_lag_ms)
    if end is None or not should_clean(segments, end, cleaned_bytes, now_ms, config):
        return None
    return end


def fitting_end(bases: Sequence[int], dirty_end: int, first_unfit: int | None) -> int | None:
    """Where the pass ends when the offset map filled: the last segment boundary (one of
    ``bases``, the dirty inputs' bases, plus ``dirty_end``) at or below ``first_unfit``, the
    base of the first input whose keys did not all fit (None: all fit). None: not even the
    first dirty segment fits; the pass cannot make progress."""
    if first_unfit is None:
        return dirty_end
    boundaries = [b for b in [*bases, dirty_end] if b <= first_unfit]
    if not boundaries or boundaries[-1] == bases[0]:
        return None
    return max(boundaries)


def tile_outputs(sizes: Sequence[int], target_bytes: int) -> list[range]:
    """Consecutive runs of inputs merged into one cleaned object each, up to about
    ``target_bytes`` of cleaned data (a larger input is an object of its own)."""
    groups: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        if index > start and total + size > target_bytes:
            groups.append(range(start, index))
            start, total = index, 0
        total += size
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups
