"""Consumer lag: a pure decision from committed offsets and high watermarks.

Lag is the high watermark minus the committed offset (never below zero: a commit may be read
before the watermark that covers it arrives through the watch). Partitions of topics that no
longer exist, and negative (unset) commits, have no lag to report. Which broker reports which
group (``reported_groups``) is decided here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

TopicPartition = tuple[str, int]
C = TypeVar("C")


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


def reported_groups(
    node_id: int,
    coordinated: Mapping[str, Mapping[TopicPartition, C]],
    stored: Mapping[str, Mapping[TopicPartition, C]],
    reporter: Callable[[str], int | None],
) -> list[tuple[str, Mapping[TopicPartition, C]]]:
    """The groups whose lag this broker reports, each with the offsets to report it from.

    Every group is reported by one broker: the one FindCoordinator names for it
    (``reporter``: the live lease holder, else the group's stable pick), so that the sum over
    brokers counts each group once. That broker reports the offsets it coordinates if it
    coordinates the group, else those read from etcd (``stored``): a group nobody coordinates
    (its consumers gone, let go when idle, or not asked for since the brokers restarted) keeps
    its series.
    """
    out: list[tuple[str, Mapping[TopicPartition, C]]] = []
    for group_id, offsets in coordinated.items():
        if reporter(group_id) == node_id:
            out.append((group_id, offsets))
    for group_id, offsets in stored.items():
        if group_id not in coordinated and reporter(group_id) == node_id:
            out.append((group_id, offsets))
    return out
