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
file. Giving the space back to the file system takes a defragmentation (see
``docs/hardening.md``). When etcd has raised its NOSPACE alarm (the quota is used up
anyway, e.g. by another user of the same etcd), the compactor compacts to the current
revision, defragments every member and disarms the alarm: writes, and so produces, resume.
Meanwhile flush commits fail and produces get REQUEST_TIMED_OUT, which clients retry; nothing
is acknowledged that is not committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.observability.retry_log import RetryLog

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
        """Compact to the revision of the previous tick; remember this tick's. Out of space:
        compact everything, defragment, disarm."""
        current = await self._etcd.revision()
        if "NOSPACE" in await self._etcd.alarms():
            log.error(
                "etcd is out of space (NOSPACE alarm): writes and produces fail; compacting to "
                "revision %d, defragmenting and disarming the alarm",
                current,
            )
            await self._compact(current)
            await self._etcd.recover_space()
            log.warning("etcd NOSPACE alarm disarmed; writes resume")
            self._previous = current
            return
        target = compaction_target(self._previous, self.compacted)
        self._previous = current
        if target is not None:
            await self._compact(target)

    async def _compact(self, target: int) -> None:
        if target <= self.compacted:
            return
        try:
            await self._etcd.compact(target)
        except MetadataError as exc:
            if "compacted" not in str(exc):  # someone compacted further already: fine
                raise
        self.compacted = target
        log.info("etcd history compacted to revision %d", target)

    async def run(self, me: int, live: Callable[[], Collection[int]], interval_s: float) -> None:
        """Every ``interval_s`` while this broker is the compactor; a run of ticks etcd
        refuses is logged once, then summarised (``retry_log``)."""
        retries = RetryLog(log, "etcd compaction skipped")
        while True:
            await asyncio.sleep(interval_s)
            if not is_compactor(me, live()):
                self._previous = None
                continue
            try:
                await self.tick()
            except MetadataError as exc:
                retries.failed(exc)
            else:
                retries.succeeded()
