"""Log lines a remote client can cause, limited: the first few of each kind, then a count.

A client that reconnects in a loop with a wrong password (librdkafka retries forever), or sends
garbage as fast as it can, would otherwise write one line per attempt: thousands a second, a
full disk and a drowned log pipeline, and the one line an operator needs lost among them.
Each such line belongs to a :class:`ClientEvent` (a fixed kind: "SASL authentication failed")
and comes from a client host. Per (kind, host) the first ``lines_per_window`` lines of a
window of ``window_s`` are written; later ones are only counted, and when the window ends one
line says how many were left out::

    suppressed 1,234 similar messages within 60 s: SASL authentication failed (last from 10.0.0.7)

Keying by host (a successful login's by host and principal) means one noisy client cannot
hide another's first lines. The key map is
bounded: past ``max_keys`` (kind, host) pairs, new hosts share one key per kind, so an address
scan cannot grow it. Metrics count every event (``METRICS``); only the log is limited.

:func:`decide` and :func:`expired_keys` are the pure decisions, with the clock passed in;
:class:`LogLimiter` keeps the windows and writes; :func:`client_log` is what call sites call.
Everything runs on the event loop thread, as the counters in ``metrics`` do.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kafscale.broker.observability.metrics import METRICS

_log = logging.getLogger(__name__)


class ClientEvent(enum.StrEnum):
    """The kinds of line a remote client can cause at will (a bounded set: a metric label)."""

    MALFORMED_REQUEST = "malformed request"
    UNSUPPORTED_REQUEST = "unsupported API or version"
    SASL_FAILURE = "SASL authentication failed"
    AUTHENTICATED = "client authenticated"
    CONNECTION_CLOSED = "connection closed by the server"
    CONNECTION_REFUSED = "connection refused over a limit"
    IDLE_CLOSED = "idle connection closed"
    BAD_CERTIFICATE = "unreadable client certificate"
    FORWARDING_REFUSED = "forwarding refused"
    UPSTREAM_FAILED = "request to a broker failed"
    INTERNAL_ERROR = "internal error"
    UNREADABLE_GROUP = "unreadable group record"
    GROUP_CHANGE = "group state change"
    TRANSACTION_CHANGE = "transaction state change"
    PRODUCE_REFUSED = "produce refused"


@dataclass(frozen=True, slots=True)
class LogPolicy:
    """First ``lines_per_window`` lines per kind and host per ``window_s``; at most
    ``max_keys`` (kind, host) windows (plus one shared window per kind beyond)."""

    lines_per_window: int = 10
    window_s: float = 60.0
    max_keys: int = 1024


OTHER_HOSTS = "other hosts"
"""The host of the shared per-kind window once ``max_keys`` hosts have windows of their own."""

Key = tuple[ClientEvent, str]


@dataclass(frozen=True, slots=True)
class Window:
    """One key's current window: when it started, lines written and left out, and the host
    of the last event (the summary names it)."""

    started_s: float
    logged: int = 0
    suppressed: int = 0
    last_host: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    window: Window
    """The key's window after this event."""
    log: bool
    """Write this event's line."""
    last_logged: bool
    """This is the window's last line written: say that further ones are counted."""
    ended: Window | None
    """The window this event closed, when it left lines out (to be summarised first)."""


def window_over(window: Window, now_s: float, policy: LogPolicy) -> bool:
    return now_s - window.started_s >= policy.window_s


def decide(window: Window | None, now_s: float, host: str, policy: LogPolicy) -> Decision:
    """Write or count one event of a key whose current window is ``window`` (None: none yet).

    Per window, never more than ``lines_per_window`` are written, and every event is either
    written or counted in ``suppressed``, exactly once."""
    ended = None
    if window is None or window_over(window, now_s, policy):
        if window is not None and window.suppressed:
            ended = window
        window = Window(now_s)
    if window.logged < policy.lines_per_window:
        logged = window.logged + 1
        return Decision(
            replace(window, logged=logged, last_host=host),
            log=True,
            last_logged=logged == policy.lines_per_window,
            ended=ended,
        )
    return Decision(
        replace(window, suppressed=window.suppressed + 1, last_host=host),
        log=False,
        last_logged=False,
        ended=ended,
    )


def key_for(windows: Mapping[Key, object], event: ClientEvent, host: str, policy: LogPolicy) -> Key:
    """The key an event is counted under: its own host's while there is room for it."""
    key = (event, host)
    if key in windows or len(windows) < policy.max_keys:
        return key
    return (event, OTHER_HOSTS)


def expired_keys(
    windows: Iterable[tuple[Key, Window]], now_s: float, policy: LogPolicy
) -> list[Key]:
    """Keys whose window is over, from ``windows`` in the order they started (oldest first):
    the scan stops at the first window still running, so it costs what it removes."""
    over = []
    for key, window in windows:
        if not window_over(window, now_s, policy):
            break
        over.append(key)
    return over


def summary_message(event: ClientEvent, window: Window, policy: LogPolicy) -> str:
    return (
        f"suppressed {window.suppressed:,} similar messages within {policy.window_s:g} s: "
        f"{event} (last from {window.last_host})"
    )


@dataclass(slots=True)
class _Entry:
    window: Window
    logger: logging.Logger  # where the key's summary goes: where its lines went
    level: int


class LogLimiter:
    """The windows of one process. Its entries are kept in the order their windows started
    (a key whose window restarts moves to the end), so ending windows is a scan from the
    front."""

    def __init__(
        self, policy: LogPolicy | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy = policy or LogPolicy()
        self._clock = clock
        self._entries: dict[Key, _Entry] = {}
        self._users = 0

    def attach(self) -> None:
        """A server starts writing through this limiter (see :meth:`detach`)."""
        self._users += 1

    def detach(self) -> None:
        """A server stops: when it was the last one, every window ends now (its summaries
        written: no count is lost with the process). The brokers (and proxy) of ``kafscale
        local`` share one limiter: one of them stopping must not end the windows of the
        others, which would then write their first lines again at once."""
        self._users = max(0, self._users - 1)
        if not self._users:
            self.summarise_all()

    def __len__(self) -> int:
        return len(self._entries)

    def log(
        self,
        logger: logging.Logger,
        level: int,
        event: ClientEvent,
        host: str,
        msg: str,
        *args: object,
        exc_info: Any = None,
    ) -> None:
        """``logger.log(level, msg, *args)``, unless the key's window has written its share:
        then only counted (and summarised when the window ends)."""
        if not logger.isEnabledFor(level):
            return
        now_s = self._clock()
        self.summarise_ended(now_s)
        policy = self.policy
        key = key_for(self._entries, event, host, policy)
        entry = self._entries.get(key)
        decision = decide(entry.window if entry else None, now_s, host, policy)
        if decision.ended is not None:  # the sweep above ends windows first; never here
            logger.log(level, "%s", summary_message(event, decision.ended, policy))
        if entry is None or decision.window.started_s != entry.window.started_s:
            self._entries.pop(key, None)  # a new window goes to the end: start order
            self._entries[key] = _Entry(decision.window, logger, level)
        else:
            entry.window, entry.logger, entry.level = decision.window, logger, level
        if not decision.log:
            METRICS.client_log_suppressed(event.value)
            return
        if decision.last_logged:
            msg += " (further such lines from %s are counted for %g s, then summarised)"
            args = (*args, host, policy.window_s)
        logger.log(level, msg, *args, exc_info=exc_info)

    def summarise_ended(self, now_s: float | None = None) -> None:
        """End the windows that are over, one summary line each that left lines out."""
        now_s = self._clock() if now_s is None else now_s
        windows = ((key, entry.window) for key, entry in self._entries.items())
        for key in expired_keys(windows, now_s, self.policy):
            self._summarise(key, self._entries.pop(key))

    def summarise_all(self) -> None:
        """End every window now (at shutdown): no count is lost with the process."""
        entries, self._entries = self._entries, {}
        for key, entry in entries.items():
            self._summarise(key, entry)

    def _summarise(self, key: Key, entry: _Entry) -> None:
        if entry.window.suppressed:
            entry.logger.log(entry.level, "%s", summary_message(key[0], entry.window, self.policy))


CLIENT_LOG = LogLimiter()
"""The process's limiter (``kafscale local`` brokers share it, as they share one log)."""

REFUSAL_LOG = LogLimiter(LogPolicy(lines_per_window=1, window_s=10.0))
"""What producers are told instead of an ack (``api.produce_refusals``): one line per
partition per 10 s, then a count. A producer retries a refused batch every ~100 ms for as long
as ``delivery.timeout.ms`` (minutes), so ten lines a minute per key would still be a flood of
one partition's retries; one line per 10 s is enough to say what a stalled producer was told."""

LIMITERS = (CLIENT_LOG, REFUSAL_LOG)
"""The process's limiters: attached, swept and summarised together by its servers."""


def client_log(
    logger: logging.Logger,
    level: int,
    event: ClientEvent,
    host: str,
    msg: str,
    *args: object,
    exc_info: Any = None,
) -> None:
    """Log a line a remote client caused, within the process's limits (see the module)."""
    CLIENT_LOG.log(logger, level, event, host, msg, *args, exc_info=exc_info)


MAX_NAME_CHARS = 200
"""Of a client-chosen name (a group or transactional id, up to 32 KiB), what a key keeps."""


def named(what: str, name: str) -> str:
    """The key "host" of lines about one group or transactional id (``what``: "group"):
    their first lines per window are that one's, so a client churning its own group hides
    no other group's. Bounded like hosts (``max_keys``), and cut to ``MAX_NAME_CHARS``."""
    return f"{what} {name[:MAX_NAME_CHARS]}"


def host_of(peer: str) -> str:
    """The host of a ``host:port`` peer name (IPv6 included): what lines are keyed by."""
    host, colon, _ = peer.rpartition(":")
    return host if colon else peer


async def summarise_periodically(*limiters: LogLimiter) -> None:
    """Write the summaries of ended windows even when their client has gone quiet (checked
    ten times per shortest window); runs until cancelled. No limiter given: ``LIMITERS``."""
    limiters = limiters or LIMITERS
    interval_s = min(limiter.policy.window_s for limiter in limiters) / 10
    while True:
        await asyncio.sleep(interval_s)
        for limiter in limiters:
            limiter.summarise_ended()
