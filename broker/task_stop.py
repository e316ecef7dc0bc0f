"""Stopping a background task for good.

``task.cancel(); with suppress(CancelledError): await task`` has two holes: a task whose code
swallows one cancellation (a library's ``except CancelledError: pass`` around an await) keeps
running, so the ``await`` never returns; and the suppression also swallows a cancellation of
the caller itself. A proxy's shutdown hung for good on the first in CI (a watch task that lived
on after its close). ``log_failure`` makes sure a background task that ends by an exception
says so in the log, once, when it ends (not only when someone stops it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

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


def log_failure(task: asyncio.Task[T]) -> asyncio.Task[T]:
    """``task``, whose end by an exception is logged once, with its traceback, when it ends.

    A background task that raised ended silently before: ``cancel_and_wait`` retrieves its
    exception at shutdown without a word, so a cluster view whose watch died froze with no
    line in the log while the broker went on answering from it."""
    task.add_done_callback(_log_exception)
    return task


def _log_exception(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("background task %s ended: %r", task.get_name(), error, exc_info=error)


def start_task(coroutine: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """``asyncio.create_task`` for background work, its failure logged (``log_failure``)."""
    return log_failure(asyncio.create_task(coroutine, name=name))
