"""aetcd's watch multiplexer, with each watch creation matched to its own answer.

aetcd 1.0 runs every watch of a client over one gRPC stream and takes the next ``created``
answer on that stream as the answer to whichever creation is pending *now*. A creation that
timed out (etcd slow or frozen for longer than the call timeout, which CPU load or a restart
makes happen) still gets its answer later, and that answer was handed to the next creation,
often another prefix's: that watch then received the other prefix's events and never its own,
silently and for as long as the stream lived. A proxy whose cluster watch was crossed this way
routed to owners that had moved away; two proxies disagreed for minutes (docs/proxy.md).

Here every creation carries a watch id of our choosing (``watch_id`` in etcd's
WatchCreateRequest, which etcd echoes), and a ``created`` answer is accepted only by the
creation that asked for that id; a late answer for an abandoned creation is cancelled. Two more
gaps are closed on the way: a creation etcd refuses (``canceled``) or answers with a compacted
revision fails at once instead of at the timeout, and a watch that etcd cancels later without a
compaction (aetcd ignored it: the watch just went quiet) ends with ``WatchCancelled``, so the
adapter re-creates it from its last revision; and a stream that breaks while its request queue
is full (creations piled up behind an etcd that stopped reading) no longer blocks the watcher
for good (aetcd waited, holding its lock, for room in a queue nobody would read again).

It also keeps the newest revision its stream has heard (any answer's header, progress
notifications included) and can ask etcd for one (``request_progress``), and a watch found
stalled (``watch_progress``) can be ended with an error (``fail_watch``): a member that stopped
following the cluster keeps the stream open and silent, so nothing else would end it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import aetcd
from aetcd import rpc
from aetcd import watcher as aetcd_watcher

from kafscale.broker.task_stop import cancel_and_wait


class WatchCancelled(aetcd.ClientError):  # type: ignore[misc]
    """etcd cancelled a watch (or refused to create one) for a reason other than compaction."""


class WatchStalled(WatchCancelled):
    """The watch's member stopped delivering while the cluster went on (``watch_progress``)."""


class MatchedWatcher(aetcd_watcher.Watcher):  # type: ignore[misc]
    """aetcd's ``Watcher`` whose creations are matched to their answers by watch id."""

    _callbacks: dict[int, Any]
    _request_queue: asyncio.Queue[Any]
    _request_handler: asyncio.Task[None] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ids = itertools.count(1)
        self.heard_revision = 0
        """The newest revision any answer on this stream carried in its header."""

    def request_progress(self) -> None:
        """Ask etcd for a progress notification (it answers with its current revision). Never
        waits: with the request queue full, the stream is already behind and the ask can go."""
        request = rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())
        with contextlib.suppress(asyncio.QueueFull):
            self._request_queue.put_nowait(request)

    async def fail_watch(self, watch_id: int, error: Exception) -> None:
        """End the watch with ``error`` (its iterator raises it) and ask etcd to cancel it,
        without waiting on a stream or a lock a stalled member may hold up."""
        callback = self._callbacks.pop(watch_id, None)
        if callback is None:
            return
        with contextlib.suppress(asyncio.QueueFull):
            self._request_queue.put_nowait(self._build_watch_cancel_request(watch_id=watch_id))
        await self._process_callback(callback, error)

    async def _enqueue_watch_create(self, *args: Any, **kwargs: Any) -> None:
        """Called by ``add_callback`` under the lock with ``_new_callback`` set: stamp the
        creation with an id of ours and remember it on the pending callback."""
        request = self._build_watch_create_request(*args, **kwargs)
        watch_id = kwargs.get("watch_id") or next(self._ids)
        request.create_request.watch_id = watch_id  # aetcd's builder drops it
        self._new_callback.requested_id = watch_id
        await self._request_queue.put(request)

    async def _handle_response(self, response: Any) -> None:
        self.heard_revision = max(self.heard_revision, int(response.header.revision))
        if response.created:
            await self._handle_created(response)
        elif response.canceled and response.compact_revision == 0:
            await self._handle_cancelled(response)
        else:
            await super()._handle_response(response)

    async def _terminate_stream(self, error: BaseException | None) -> None:
        """aetcd's own, except that the end-of-requests mark is dropped when the old queue is
        full: the old stream is cancelled below anyway, and waiting for room there (under the
        lock) hung every later watch creation."""
        async with self._lock:
            if self._new_callback is not None:
                self._new_callback.error = error
                self._new_callback_ready.notify_all()
            callbacks, self._callbacks = self._callbacks, {}
            with contextlib.suppress(asyncio.QueueFull):
                self._request_queue.put_nowait(None)
            self._request_queue = asyncio.Queue(maxsize=10)
        for callback in callbacks.values():
            await self._process_callback(callback, error)
        async with self._request_handler_lock:
            handler, self._request_handler = self._request_handler, None
            if handler is not None and handler is not asyncio.current_task():
                await cancel_and_wait(handler)

    async def _handle_created(self, response: Any) -> None:
        async with self._lock:
            pending = self._new_callback
            if pending is None or getattr(pending, "requested_id", None) != response.watch_id:
                # The answer to a creation that was given up (timed out): never anyone else's.
                if not response.canceled:
                    await self._enqueue_watch_cancel(watch_id=response.watch_id)
                return
            if response.canceled or response.compact_revision != 0:
                pending.error = refusal(response)
            else:
                self._callbacks[response.watch_id] = pending
                pending.watch_id = response.watch_id
            self._new_callback_ready.notify_all()

    async def _handle_cancelled(self, response: Any) -> None:
        async with self._lock:
            callback = self._callbacks.pop(response.watch_id, None)
        if callback is not None:
            await self._process_callback(callback, refusal(response))


def refusal(response: Any) -> Exception:
    """The error a watch ends with when etcd refuses or cancels it."""
    if response.compact_revision != 0:
        compacted: Exception = aetcd.RevisionCompactedError(response.compact_revision)
        return compacted
    reason = response.cancel_reason or "no reason given"
    return WatchCancelled(f"etcd cancelled watch {response.watch_id}: {reason}")
