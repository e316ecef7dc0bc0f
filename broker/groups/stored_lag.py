"""Committed offsets, read from etcd, of the groups whose lag a broker reports uncoordinated.

Consumer lag is what alerts watch when a group's consumers are gone; and a group whose
consumers are gone is Empty, let go after ``groups.idle_release_ms`` (``release``), and
coordinated by nobody after the brokers restart. Its lag must not vanish then. So each broker
also holds the committed offsets of the stored groups whose stable pick it is (the broker
FindCoordinator names when nobody holds the group's lease), and reports their lag when nobody
coordinates them (``lag.reported_groups``): every group with committed offsets is on exactly
one broker's ``/metrics``.

A scrape never waits on etcd: the offsets are read by a background refresh, one every
``groups.lag_refresh_interval_ms``, going through the stored groups in key order a page
(``store.PAGE_KEYS`` keys) at a time. A refresh reads at most
``groups.lag_refresh_max_groups`` groups; a cluster that stores more is gone through over
several refreshes (a pass), each going on where the last stopped, and each such refresh is
counted (``capped``) and the first of a pass logged. Every broker reads every stored key once
per pass (etcd cannot select one broker's picks by key), decoding and keeping only its own
picks' offsets: memory follows the groups this broker reports, reads follow the keys stored
(``bench/lag_refresh.py`` measures both).

Hand-offs: a coordinator that lets a group go (or loses it) hands over the offsets it held,
which are etcd's (``release`` lets go only of groups etcd holds whole): the series goes on at
once, from the same broker when it is the group's pick (the usual case: clients found it
through FindCoordinator), else from the pick's last refresh. A refresh that read a group before
such a hand-over does not overwrite it. Entries of groups that are gone from etcd, or picked to
another broker since, leave at the end of the pass that no longer finds them here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from kafscale.broker.groups.store import CommittedOffset, GroupStore, TopicPartition
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)

Offsets = Mapping[TopicPartition, CommittedOffset]


class StoredLag:
    """The stored committed offsets of the groups this broker is the stable pick of."""

    def __init__(
        self,
        store: GroupStore,
        picked_here: Callable[[str], bool],
        interval_s: float,
        max_groups: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._picked_here = picked_here
        self._interval_s = interval_s
        self._max_groups = max(1, max_groups)
        self._clock = clock
        self._offsets: dict[str, Offsets] = {}
        self._read_at: dict[str, float] = {}
        """When the read (or hand-over) of each entry started: a later one wins."""
        self._after: str | None = None
        """The last group the pass under way read; None: the next refresh starts a pass."""
        self._seen: set[str] = set()
        """Groups this pass kept (or found handed over): the others leave at its end."""
        self._capped_this_pass = False
        self.reads = 0
        """etcd reads made by refreshes (each one page of at most ``PAGE_KEYS`` keys)."""
        self.capped = 0
        """Refreshes that stopped at ``max_groups`` with groups left for the next ones."""
        self.passes = 0
        """Passes over every stored group completed."""
        self._task: asyncio.Task[None] | None = None

    @property
    def offsets(self) -> Mapping[str, Offsets]:
        """Each held group's stored committed offsets (read-only)."""
        return self._offsets

    def start(self) -> None:
        self._task = start_task(self._run(), name="groups-stored-lag")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def hand_over(self, group_id: str, offsets: Offsets) -> None:
        """A group is no longer coordinated here: ``offsets`` are etcd's now (empty: it has
        none, or was deleted)."""
        if offsets and self._picked_here(group_id):
            self._offsets[group_id] = dict(offsets)
            self._read_at[group_id] = self._clock()
            self._seen.add(group_id)
        else:
            self._forget(group_id)

    async def _run(self) -> None:
        """Runs for the broker's life: a failed refresh is logged, the next one goes on (a run
        of refreshes etcd refuses is logged once, then summarised: ``retry_log``)."""
        retries = RetryLog(log, "consumer lag of stored groups not read")
        while True:
            try:
                await self.refresh()
            except MetadataError as exc:  # out of reach, or refusing (permission denied)
                retries.failed(exc)
            except Exception:
                log.exception("reading the consumer lag of stored groups failed")
            else:
                retries.succeeded()
            await asyncio.sleep(self._interval_s)

    async def refresh(self) -> None:
        """One refresh: the next stored groups, up to ``max_groups``, from where the last
        stopped."""
        started = self._clock()
        if self._after is None:
            self._seen, self._capped_this_pass = set(), False
        read = 0
        async with contextlib.aclosing(
            self._store.committed_offset_pages(self._after, self._picked_here)
        ) as pages:
            async for page, last in pages:
                self.reads += 1
                for group_id, offsets in page:
                    self._apply(group_id, offsets, started)
                if page:
                    self._after = page[-1][0]
                    read += len(page)
                if last:
                    self._end_pass()
                    return
                if read >= self._max_groups:
                    self._note_capped(read)
                    return

    def _apply(self, group_id: str, offsets: Offsets, read_at: float) -> None:
        held_at = self._read_at.get(group_id)
        if held_at is not None and held_at > read_at:
            self._seen.add(group_id)  # handed over after this read began: newer than it
        elif offsets and self._picked_here(group_id):
            self._offsets[group_id] = offsets
            self._read_at[group_id] = read_at
            self._seen.add(group_id)
        else:
            self._forget(group_id)

    def _end_pass(self) -> None:
        gone = [g for g in self._offsets if g not in self._seen]
        for group_id in gone:
            self._forget(group_id)
        self._after, self._seen = None, set()
        self.passes += 1

    def _note_capped(self, read: int) -> None:
        self.capped += 1
        if not self._capped_this_pass:
            self._capped_this_pass = True
            log.warning(
                "consumer lag of stored groups: this refresh read %d groups, the most one may "
                "(groups.lag_refresh_max_groups); the rest follow in the next refreshes, so "
                "some groups' lag is older than groups.lag_refresh_interval_ms",
                read,
            )

    def _forget(self, group_id: str) -> None:
        self._offsets.pop(group_id, None)
        self._read_at.pop(group_id, None)
