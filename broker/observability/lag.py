"""Consumer lag: a pure decision from committed offsets and high watermarks.

Lag is the high watermark minus the committed offset (never below zero: a commit may be read
before the watermark that covers it arrives through the watch). Partitions of topics that no
longer exist, and negative (unset) commits, have no lag to report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True, order=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int

    @property
    def lag(self) -> int:
        return max(self.high_watermark - self.committed_offset, 0)


def consumer_lag(
    committed: Iterable[tuple[str, Mapping[TopicPartition, int]]],
    high_watermarks: Mapping[TopicPartition, int],
) -> list[PartitionLag]:
    """One entry per (group, committed partition) whose partition still exists, sorted."""
    out: list[PartitionLag] = []
    for group, offsets in committed:
        for (topic, partition), offset in offsets.items():
            high_watermark = high_watermarks.get((topic, partition))
            if high_watermark is None or offset < 0:
                continue
            out.append(PartitionLag(group, topic, partition, offset, high_watermark))
    out.sort()
    return out
