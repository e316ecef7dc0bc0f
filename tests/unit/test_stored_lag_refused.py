"""The stored groups' lag refresh while etcd refuses it: one WARNING for the run, no traceback.

etcd refusing the reads (permission denied after a change of roles or users) used to be
logged at ERROR with a traceback at every refresh; now, like etcd out of reach, the run is
logged once (``retry_log``) and the refresh goes on when etcd lets it read again. The real
etcd path is in tests/integration/test_stored_lag.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import pytest

from kafscale.broker.groups.stored_lag import StoredLag
from kafscale.broker.metadata.etcd_errors import MetadataError

REFUSALS = 3


class RefusingStore:
    """Refuses the first ``REFUSALS`` reads, then holds no group. ``again`` is set at the read
    after the first that got through: the refresh loop has logged that one by then."""

    def __init__(self) -> None:
        self.reads = 0
        self.again = asyncio.Event()

    async def committed_offset_pages(
        self, _after: str | None, _picked_here: Callable[[str], bool]
    ) -> AsyncIterator[tuple[list[tuple[str, dict[object, object]]], bool]]:
        self.reads += 1
        if self.reads <= REFUSALS:
            raise MetadataError("etcd get_prefix failed: etcdserver: permission denied")
        if self.reads > REFUSALS + 1:
            self.again.set()
        yield [], True


async def test_refreshes_etcd_refuses_are_logged_once_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kafscale.broker.groups.stored_lag")
    store = RefusingStore()
    lag = StoredLag(store, lambda _: True, interval_s=0.01, max_groups=10)  # type: ignore[arg-type]
    lag.start()
    try:
        await asyncio.wait_for(store.again.wait(), 30)
    finally:
        await lag.close()
    lines = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert [(level, exc_info) for level, _, exc_info in lines] == [
        ("WARNING", None),
        ("INFO", None),
    ], lines
    assert "permission denied" in lines[0][1]
    assert f"recovered after {REFUSALS} failed attempts" in lines[1][1]
