"""A bound on how long a broker or proxy takes to stop once told to (SIGTERM, SIGINT).

The graceful stop hands partitions over, answers the requests already read and closes the
etcd and object-store clients; each step waits on etcd, S3 or a library's task. One step that
never ends kept the process alive for good: a broker whose etcd had just restarted waited
forever for a watch task that had swallowed its cancellation (test_proxy_routes in CI). Inside
Kubernetes the kubelet's SIGKILL ends that after ``terminationGracePeriodSeconds``; elsewhere
(``kafscale local``, systemd, a test harness) nothing did.

So the stop runs under a deadline: ``limits.shutdown_grace_s`` for the graceful part plus
``CLOSE_MARGIN_S`` to close the clients. Past it the process logs what each of its tasks still
waits on and exits with ``EXIT_STOP_DEADLINE``. A thread checks the same deadline a moment later
in case the event loop itself cannot run (a blocking call) or the loop's own teardown hangs.
Exiting there loses nothing acknowledged: a produce is acked only once its batches are in
object storage and its offsets in etcd; leases the handoff could not release expire with the
session TTL, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

CLOSE_MARGIN_S = 5.0
"""Beyond the graceful part's grace: closing the etcd and object-store clients, each call of
which has its own timeout."""

THREAD_SLACK_S = 2.0
"""How much later than the event loop's deadline the watchdog thread acts."""

EXIT_STOP_DEADLINE = 124
"""The exit code of a stop cut short by the deadline (``timeout(1)``'s)."""


def stop_bound_s(shutdown_grace_s: float) -> float:
    """Seconds from the stop signal to the exit, at most."""
    return shutdown_grace_s + CLOSE_MARGIN_S


async def stop_within(
    stop: Callable[[], Coroutine[Any, Any, None]],
    bound_s: float,
    on_deadline: Callable[[], None] | None = None,
) -> None:
    """Run ``stop``; if it has not ended after ``bound_s``, log every task's stack and exit the
    process. Arms the watchdog thread first, which also covers what runs after ``stop``
    returns (the event loop's teardown). ``on_deadline`` runs (from either) right before the
    exit: ``kafscale local`` wakes its etcd child there (``EmbeddedEtcd.wake``)."""
    arm_exit_thread(bound_s + THREAD_SLACK_S, on_deadline)
    stopping = asyncio.create_task(stop(), name="stop")  # a task: its stack stays to be shown
    done, _ = await asyncio.wait({stopping}, timeout=bound_s)
    if done:
        stopping.result()  # its failure is the caller's
        return
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    log.error(
        "stopping took over %g s; exiting without waiting further. Tasks still running:\n%s",
        bound_s,
        task_stacks(tasks),
    )
    exit_now(on_deadline)


def arm_exit_thread(
    after_s: float, on_deadline: Callable[[], None] | None = None
) -> threading.Timer:
    """A daemon thread that exits the process after ``after_s`` unless it has exited by then,
    dumping every thread's stack to stderr first (and running ``on_deadline``)."""
    timer = threading.Timer(after_s, _exit_from_thread, args=(after_s, on_deadline))
    timer.daemon = True
    timer.name = "stop-deadline"
    timer.start()
    return timer


def _exit_from_thread(after_s: float, on_deadline: Callable[[], None] | None) -> None:
    print(
        f"kafscale: still running {after_s:g} s after being told to stop; exiting. Threads:",
        file=sys.stderr,
        flush=True,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    exit_now(on_deadline)


def exit_now(on_deadline: Callable[[], None] | None = None) -> None:
    """Flush the logs and end the process at once: no more cleanup, which is what hung, but
    ``on_deadline`` (bounded by its owner) first."""
    if on_deadline is not None:
        try:
            on_deadline()
        except Exception:  # the exit must happen whatever it raised
            log.exception("before exiting")
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # a broken log stream must not keep us alive
            handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOP_DEADLINE)


def task_stacks(tasks: Iterable[asyncio.Task[Any]]) -> str:
    """Each task's name and the chain of awaits it is suspended in, innermost last."""
    lines: list[str] = []
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"task {task.get_name()}:")
        lines += [f"  {where}" for where in await_chain(task.get_coro())]
    return "\n".join(lines)


def await_chain(awaitable: object, limit: int = 50) -> list[str]:
    """``file:line function`` of each coroutine or async generator ``awaitable`` waits in, down
    to the first awaitable that is neither (a future, a library's C object), shown by repr.
    (``Task.print_stack`` shows only the outermost frame of a suspended task, and fails on
    frames of compiled extensions.)"""
    chain: list[str] = []
    current: object = awaitable
    while current is not None and len(chain) < limit:
        frame = _frame_of(current)
        if frame is None:
            chain.append(f"<{current!r:.200}>")
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        current = _awaiting(current)
    return chain


def _frame_of(awaitable: object) -> FrameType | None:
    for attribute in ("cr_frame", "ag_frame", "gi_frame"):
        frame = getattr(awaitable, attribute, None)
        if isinstance(frame, FrameType):
            return frame
    return None


def _awaiting(awaitable: object) -> object:
    for attribute in ("cr_await", "ag_await", "gi_yieldfrom"):
        inner = getattr(awaitable, attribute, None)
        if inner is not None:
            return _generator_behind(inner)
    return None


def _generator_behind(awaitable: object) -> object:
    """The async generator an ``async for`` step (``async_generator_asend``, which exposes
    nothing) runs, found among what it refers to; anything else as it is."""
    if type(awaitable).__name__ in ("async_generator_asend", "async_generator_athrow"):
        for referent in gc.get_referents(awaitable):
            if inspect.isasyncgen(referent):
                return referent
    return awaitable
