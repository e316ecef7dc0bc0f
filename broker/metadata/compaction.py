"""Periodic compaction of etcd's history, for every etcd a cluster may use.

etcd keeps every revision of every key until it is compacted. A broker commits once per flush
tick (and more), so an uncompacted etcd grows toward its space quota (2 GiB by default), after
which every write fails with NOSPACE: produces stop. The embedded etcd of ``kafscale local``,
the operator's managed etcd and an external one all need it, so the brokers do it themselves:
the lowest-numbered live broker, every ``compaction_interval_s``, compacts to the revision it
saw one interval earlier. History of one interval is kept, so a watch that fell behind by less
than that resumes without a RESYNC (``etcd``), as etcd's own ``--auto-compaction-mode=periodic``
would keep it.

Compaction frees space inside etcd's database file, which etcd reuses; it does not shrink the
file. Giving the space back to the file system takes ``etcdctl defrag`` (see
``docs/etcd-operations.md``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from kafscale.broker.metadata.etcd import Etcd, MetadataError

log = logging.getLogger(__name__)


def compaction_target(previous_revision: int | None, compacted: int) -> int | None:
    """The revision to compact to now: the one seen an interval ago, if not compacted yet."""
    if previous_revision is None or previous_revision <= compacted:
        return None
    return previous_revision


def is_compactor(me: int, live_brokers: Collection[int]) -> bool:
    """One broker compacts: the lowest-numbered live one (no extra etcd key to elect it)."""
    return bool(live_brokers) and min(live_brokers) == me


class Compactor:
    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd
        self._previous: int | None = None
        self.compacted = 0

    async def tick(self) -> None:
        """Compact to the revision of the previous tick; remember this tick's."""
        current = await self._etcd.revision()
        target = compaction_target(self._previous, self.compacted)
        self._previous = current
        if target is None:
            return
        try:
            await self._etcd.compact(target)
        except MetadataError as exc:
            if "compacted" not in str(exc):  # someone compacted further already: fine
                raise
        self.compacted = target
        log.info("etcd history compacted to revision %d", target)

    async def run(self, me: int, live: Callable[[], Collection[int]], interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if not is_compactor(me, live()):
                self._previous = None
                continue
            try:
                await self.tick()
            except MetadataError as exc:
                log.warning("etcd compaction skipped: %s", exc)
