"""A cluster view's close ends even when a range watch loses the cancellation it is sent.

A broker's stop waited forever in ``ClusterView.close`` after etcd restarted (test_proxy_routes
in CI, and in a loop here: 3 of 11 stops right after an etcd restart): the view's watches ran
in a ``TaskGroup``, which cancels each of its tasks once, and one watch task lost that
cancellation while aetcd created its watch just as etcd answered again; it went on iterating
the created watch, and the group waited for it. Driven here with an in-memory etcd whose range
watch swallows the first cancellation it gets, the way that task did.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd import WatchEvent, WatchEventKind
from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.broker.metadata.view_ranges import VIEW_RANGES

CLUSTER = "close"
CLOSE_BOUND_S = 60.0
"""How long close may take before the test calls it hung (it takes milliseconds): a bound on
the wait, not a speed."""


class CancelLosingEtcd:
    """No keys; each range watch swallows the first cancellation it is sent, then waits for
    events (as a watch created in the step it was cancelled does; none come here)."""

    closed = False

    def __init__(self, ranges: int) -> None:
        self.lost_cancels = 0
        self.watching = 0
        self.all_watching = asyncio.Event()
        self._ranges = ranges
        self._events = asyncio.Event()  # never set

    async def get_ranges_with_revision(
        self, ranges: list[tuple[str, str]]
    ) -> tuple[list[KeyValue], int]:
        return [], 1

    async def watch_range(
        self, first: str, end: str, start: int, on_state: object = None
    ) -> AsyncIterator[WatchEvent]:
        self.watching += 1
        if self.watching == self._ranges:
            self.all_watching.set()
        try:
            await self._events.wait()
        except asyncio.CancelledError:
            self.lost_cancels += 1  # the watch was created all the same: it goes on
        await self._events.wait()
        yield WatchEvent(WatchEventKind.PUT, first, b"", start)


async def test_close_ends_when_a_watch_swallowed_its_first_cancellation() -> None:
    etcd = CancelLosingEtcd(len(VIEW_RANGES))
    view = ClusterView(etcd, CLUSTER)  # type: ignore[arg-type]
    await view.start()
    await asyncio.wait_for(etcd.all_watching.wait(), CLOSE_BOUND_S)
    await asyncio.wait_for(view.close(), CLOSE_BOUND_S)
    assert etcd.lost_cancels == len(VIEW_RANGES)  # each was cancelled again, and ended
