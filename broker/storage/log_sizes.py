"""The size in bytes of each partition this broker owns, and the "log dir" it lives in.

DescribeLogDirs asks every broker for its partitions' sizes. A partition's size is the bytes of
its committed segment objects that are still kept: the ones from the segment holding the log
start offset on (what ``retention.bytes`` weighs, and what Kafka's ``Log.size`` counts: whole
segments, the one holding the log start included). Index objects are not counted.

Nothing here lists the object store per request. Each partition keeps a ``SizeLedger`` (the
retention janitor's structure) per ownership epoch, brought up to date from the partition
state's ``recent_segments`` (the newest 32 committed segments, with their sizes): as long as
those reach back to where the ledger's certainty ends (or to the log start), no listing is
needed at all, so a new or short partition is never listed. Only a partition that committed
more than 32 segments since it was last asked (or the first time, when its oldest kept segment
is older than its recent ones) is listed, from where the ledger stopped.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.storage.janitor import list_committed_since
from kafscale.broker.storage.object_store import ObjectStore
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.size_ledger import SizeLedger

TopicPartition = tuple[str, int]
UNKNOWN = -1


def log_dir_name(settings: StorageSettings) -> str:
    """The name of the one "log dir" a broker reports: where its store keeps segments."""
    prefix = settings.prefix.strip("/")
    if settings.kind is StorageKind.S3:
        return f"s3://{settings.bucket}/{prefix}" if prefix else f"s3://{settings.bucket}"
    root = settings.local_dir.resolve()
    return str(root / prefix if prefix else root)


def volume_bytes(settings: StorageSettings) -> tuple[int, int]:
    """(total, usable) bytes of the volume under a local directory; (-1, -1) for S3, whose
    capacity is not a number it tells, or when the directory cannot be examined."""
    if settings.kind is not StorageKind.LOCAL:
        return UNKNOWN, UNKNOWN
    try:
        stats = os.statvfs(Path(log_dir_name(settings)))
    except OSError:
        return UNKNOWN, UNKNOWN
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def catch_up_from_state(ledger: SizeLedger, state: PartitionState) -> bool:
    """Bring ``ledger`` up to ``state`` from its recent segments alone, if they cover every
    kept segment the ledger lacks: True if done (nothing to list), False if a listing is
    needed. Segments are contiguous, so the recent ones cover the rest when the oldest of them
    starts at or below where the ledger's certainty ends, or at or below the log start (the
    segments before the one holding it are not counted)."""
    if ledger.listed_below >= state.high_watermark:
        return True
    segments = state.segments
    if not segments or segments[0].base > max(ledger.listed_below, state.log_start_offset):
        return False
    ledger.add([(s.base, s.size) for s in segments], state.high_watermark)
    return True


class LogSizes:
    """Per owned partition, its ledger; asked by DescribeLogDirs."""

    def __init__(self, cluster: str, store: ObjectStore) -> None:
        self._cluster = cluster
        self._store = store
        self._ledgers: dict[TopicPartition, SizeLedger] = {}

    async def size_of(self, owned: OwnedPartition) -> int:
        """The partition's kept committed bytes (raises ObjectStoreError if a listing fails)."""
        state = owned.state  # as of one commit: a flush committing meanwhile is the next answer
        prefix = keys.partition_object_prefix(
            self._cluster, owned.topic, owned.topic_id, owned.partition
        )
        ledger = self._ledgers.get(owned.tp)
        if ledger is None or (ledger.prefix, ledger.epoch) != (prefix, owned.epoch):
            ledger = SizeLedger(prefix, owned.epoch)
        if not catch_up_from_state(ledger, state):
            await list_committed_since(self._store, prefix, state, ledger)
        ledger.trim(state.log_start_offset)
        self._ledgers[owned.tp] = ledger  # only once caught up: a failed listing starts again
        return sum(ledger.sizes)

    def keep_only(self, owned: Collection[TopicPartition]) -> None:
        """Forget the ledgers of partitions no longer owned here."""
        for tp in [tp for tp in self._ledgers if tp not in owned]:
            del self._ledgers[tp]
