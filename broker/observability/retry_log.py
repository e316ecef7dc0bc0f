"""Log lines of a loop that retries while etcd (or another dependency) refuses: the first
failure, then a summary now and then, and the recovery; not one line per attempt.

The broker's background loops (the ownership reconcile, the rebalancer, a new session after
one was lost, a watch's reload) try again every second or so while etcd refuses. Each attempt
used to log a WARNING: an etcd outage of a few minutes wrote hundreds of identical lines per
loop and broker, and hid the line that said when it started. Now a run of failures writes
one WARNING at the first, then at most one "still failing after N attempts / X s" every
``SUMMARY_INTERVAL_S``, and one INFO when an attempt succeeds again, saying how long it took.

:func:`on_failure` and :func:`on_success` are the pure decisions (the clock is passed in);
:class:`RetryLog` keeps the state of one loop and writes the lines to its logger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

SUMMARY_INTERVAL_S = 30.0
"""At most one summary line per loop this often while its failures go on."""


@dataclass(frozen=True, slots=True)
class RetryState:
    """A loop's current run of failures (none: ``failures == 0``)."""

    failures: int = 0
    """Consecutive failed attempts."""
    first_failure_s: float = 0.0
    """When the run began (the clock's time of its first failure)."""
    last_line_s: float = 0.0
    """When a line about this run was last written."""


@dataclass(frozen=True, slots=True)
class LogLine:
    level: int
    message: str


def reason(error: object) -> str:
    """An error as a log line says it. A TimeoutError (``asyncio.timeout``) has no text of its
    own: a line read "keepalive failed: ; retrying", and ``repr`` only "TimeoutError()"."""
    text = str(error)
    if text:
        return text
    if isinstance(error, TimeoutError):
        return "no answer in time"
    return type(error).__name__


def on_failure(
    state: RetryState,
    now_s: float,
    what: str,
    error: object,
    interval_s: float = SUMMARY_INTERVAL_S,
    level: int = logging.WARNING,
) -> tuple[RetryState, LogLine | None]:
    """The state after a failed attempt at ``now_s``, and the line to write, if any: one at
    ``level`` for the first failure of a run, a summary once ``interval_s`` has passed since
    the last line, else nothing."""
    failures = state.failures + 1
    if failures == 1:
        return RetryState(1, now_s, now_s), LogLine(level, f"{what}: {reason(error)}; retrying")
    if now_s - state.last_line_s < interval_s:
        return RetryState(failures, state.first_failure_s, state.last_line_s), None
    elapsed_s = now_s - state.first_failure_s
    line = LogLine(
        level,
        f"{what}: still failing after {failures} attempts / {elapsed_s:.0f} s: {reason(error)}",
    )
    return RetryState(failures, state.first_failure_s, now_s), line


def on_success(state: RetryState, now_s: float, what: str) -> tuple[RetryState, LogLine | None]:
    """The state after a successful attempt, and an INFO if it ends a run of failures."""
    if state.failures == 0:
        return state, None
    elapsed_s = now_s - state.first_failure_s
    line = LogLine(
        logging.INFO,
        f"{what}: recovered after {state.failures} failed attempts / {elapsed_s:.0f} s",
    )
    return RetryState(), line


class RetryLog:
    """The log of one retry loop: call :meth:`failed` on each failed attempt and
    :meth:`succeeded` on each successful one. ``level`` is the failures' (WARNING; INFO where
    waiting is expected, as for an operator whose etcd is still starting)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = SUMMARY_INTERVAL_S,
        level: int = logging.WARNING,
    ) -> None:
        self._logger = logger
        self._what = what
        self._clock = clock
        self._interval_s = interval_s
        self._level = level
        self.state = RetryState()

    def failed(self, error: object) -> None:
        now_s = self._clock()
        self.state, line = on_failure(
            self.state, now_s, self._what, error, self._interval_s, self._level
        )
        self._write(line)

    def succeeded(self) -> None:
        self.state, line = on_success(self.state, self._clock(), self._what)
        self._write(line)

    def _write(self, line: LogLine | None) -> None:
        if line is not None:
            self._logger.log(line.level, "%s", line.message)
