"""A handler's failure as a Warning Event on its resource, one line, rate-limited.

kopf logs a failed handler (with its traceback) and retries it; it posts nothing a user sees in
``kubectl describe``: kopf 1.45 posts log records as Events only with
``settings.posting.loggers`` on, and then every warning of every handler, tracebacks included,
as ``Error``/``Logging``, with no limit. Here a failure becomes one Warning Event with reason
:data:`REASON` and a one-line message (the handler, the error, whether it is retried). The
same message on the same resource is posted at most once per interval while a retry loop runs
(the API server and ``kubectl describe`` merge identical Events, but a post per retry is still
a write per retry); a different message, or a failure after a success, is posted at once.

What was posted is kept per resource and handler only as long as it can hold a post back: a
resource's entries go when a handler of it succeeds on its deletion (a finalizer's delete
handler, the drain of a terminating pod), and any entry older than the interval goes at the
next failure, so resources deleted while failing (a finalizer removed by hand, a pod whose
drain failed) do not grow the table for the life of the operator.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import kopf

from kafscale.operator.events import WARNING, Notice

REASON = "ReconcileFailed"


class ToldPermanentError(kopf.PermanentError):  # type: ignore[misc]
    """A failure whose condition change has posted its own Event already (``InvalidSpec``):
    kopf treats it as any PermanentError; no ``ReconcileFailed`` repeats it."""


class ToldTemporaryError(kopf.TemporaryError):  # type: ignore[misc]
    """A retried failure whose condition change has posted its own Event (``ClusterNotFound``)."""


MAX_MESSAGE_CHARS = 600  # an Event's message is meant to be short; the log keeps the rest

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
Key = tuple[str, str]  # (resource uid or namespace/name, handler)
Posted = tuple[str, float]  # (message, monotonic seconds)


def one_line(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def failure_notice(handler: str, exc: BaseException) -> Notice:
    """What to say about ``handler`` failing with ``exc`` (kopf's retry rules decide what is
    said about the next attempt)."""
    problem = str(exc) or type(exc).__name__
    if isinstance(exc, kopf.PermanentError):
        after = "not retried until the resource changes"
    elif isinstance(exc, kopf.TemporaryError):
        after = f"retrying in {exc.delay:g} s" if exc.delay else "retrying"
    else:
        problem = f"{type(exc).__name__}: {problem}"
        after = "retrying with backoff"
    return Notice(WARNING, REASON, one_line(f"{handler} failed: {problem}; {after}"))


def post_due(last: Posted | None, message: str, now_s: float, interval_s: float) -> bool:
    """Whether to post ``message`` now, given the last one posted for the same resource and
    handler: always when it says something new, else once per ``interval_s``."""
    if last is None:
        return True
    said, at_s = last
    return said != message or now_s - at_s >= interval_s


def _ident(body: Any) -> str | None:
    meta = (body or {}).get("metadata") or {}
    ident = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
    return str(ident) if meta else None


def _key(body: Any, handler: str) -> Key | None:
    ident = _ident(body)
    return None if ident is None else (ident, handler)


def _deleting(body: Any) -> bool:
    return bool(((body or {}).get("metadata") or {}).get("deletionTimestamp"))


class HandlerErrors:
    """Posts handler failures as Events (see the module); one per operator process."""

    def __init__(
        self,
        interval_s: float,
        post: Callable[[Any, Notice], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._post = post or _kopf_post
        self._clock = clock
        self._posted: dict[Key, Posted] = {}

    def failed(self, body: Any, handler: str, exc: BaseException) -> None:
        key = _key(body, handler)
        if key is None or isinstance(exc, ToldPermanentError | ToldTemporaryError):
            return
        notice = failure_notice(handler, exc)
        now_s = self._clock()
        self._drop_expired(now_s)
        if post_due(self._posted.get(key), notice.message, now_s, self._interval_s):
            self._posted[key] = (notice.message, now_s)
            self._post(body, notice)

    def succeeded(self, body: Any, handler: str) -> None:
        key = _key(body, handler)
        if key is None:
            return
        if _deleting(body):  # the resource goes now: what its other handlers said goes too
            self._posted = {k: v for k, v in self._posted.items() if k[0] != key[0]}
        self._posted.pop(key, None)

    def _drop_expired(self, now_s: float) -> None:
        """Drop entries that can no longer hold a post back (:func:`post_due` is true for
        them as for no entry at all)."""
        self._posted = {
            key: last for key, last in self._posted.items() if now_s - last[1] < self._interval_s
        }

    @property
    def tracked(self) -> int:
        """How many (resource, handler) failures are kept."""
        return len(self._posted)

    def reported(self, handler: F) -> F:
        """Wrap a kopf handler (its name, kopf's handler id, is kept) so that its failures
        are posted; the exception still reaches kopf, which logs and retries as before."""
        name = handler.__name__

        @functools.wraps(handler)
        async def run(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("body")
            try:
                result = await handler(*args, **kwargs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed(body, name, exc)
                raise
            self.succeeded(body, name)
            return result

        return run  # type: ignore[return-value]


def _kopf_post(body: Any, notice: Notice) -> None:
    kopf.event(body, type=notice.type, reason=notice.reason, message=notice.message)
