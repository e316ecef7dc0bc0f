"""Stopping a background task for good.

``task.cancel(); with suppress(CancelledError): await task`` has two holes: a task whose code
swallows one cancellation (a library's ``except CancelledError: pass`` around an await) keeps
running, so the ``await`` never returns; and the suppression also swallows a cancellation of
the caller itself. A proxy's shutdown hung for good on the first in CI (a watch task that lived
on after its close).
"""

from __future__ import annotations

import asyncio
from typing import Any

_RECANCEL_S = 1.0  # how long a cancelled task gets before it is cancelled again


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` until it has ended; the caller's own cancellation still propagates."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_S)
    if not task.cancelled():
        task.exception()  # retrieved (not logged as never retrieved); its failure ends with it
