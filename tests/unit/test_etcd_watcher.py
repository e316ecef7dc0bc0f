"""The watch multiplexer matches each watch creation to its own answer.

Driven with the exact stream that crossed two watches under aetcd's own ``Watcher``: a
creation times out, the next one is pending when etcd's late answer to the first arrives.
The stream here is an in-process stand-in for etcd's Watch RPC that answers creations only
when the test says so, as a slow or frozen etcd does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aetcd
import pytest
from aetcd import rpc
from aetcd import watcher as aetcd_watcher

from kafscale.broker.metadata.etcd_errors import MetadataUnavailable, translate_error
from kafscale.broker.metadata.etcd_watcher import MatchedWatcher, WatchCancelled

TIMEOUT_S = 0.2


class SlowEtcdWatch:
    """etcd's Watch RPC, answering each creation when told to (``answer_next``); like etcd,
    it echoes a requested watch id and numbers the others itself from 0."""

    def __init__(self, reading: bool = True) -> None:
        self.reading = reading  # False: a stuck etcd that reads no request
        self.creates: list[Any] = []
        self._answered = 0
        self._auto_ids = 0
        self._responses: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled: list[int] = []
        self._created = asyncio.Condition()

    def Watch(self, requests: AsyncIterator[Any], metadata: Any = None) -> AsyncIterator[Any]:
        return self._stream(requests)

    async def _stream(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async def read() -> None:
            async for request in requests:
                if request.HasField("create_request"):
                    async with self._created:
                        self.creates.append(request.create_request)
                        self._created.notify_all()
                elif request.HasField("cancel_request"):
                    self.cancelled.append(request.cancel_request.watch_id)

        reader = asyncio.create_task(read()) if self.reading else None
        try:
            while True:
                response = await self._responses.get()
                if isinstance(response, Exception):
                    raise response
                yield response
        finally:
            if reader is not None:
                reader.cancel()

    def answer_next(self, **fields: Any) -> int:
        """Answer the oldest unanswered creation; returns the watch id it got."""
        create = self.creates[self._answered]
        self._answered += 1
        watch_id = create.watch_id
        if watch_id == 0:
            watch_id, self._auto_ids = self._auto_ids, self._auto_ids + 1
        self._responses.put_nowait(rpc.WatchResponse(watch_id=watch_id, created=True, **fields))
        return watch_id

    def answer_last(self) -> int:
        """Answer the newest creation (the older ones went with a broken stream)."""
        self._answered = len(self.creates) - 1
        return self.answer_next()

    def break_stream(self) -> None:
        self._responses.put_nowait(ConnectionResetError("the watch stream broke"))

    def put(self, watch_id: int, key: bytes) -> None:
        event = rpc.Event(type=rpc.Event.PUT, kv=rpc.KeyValue(key=key, value=b"v"))
        self._responses.put_nowait(rpc.WatchResponse(watch_id=watch_id, events=[event]))

    def cancel(self, watch_id: int, reason: str) -> None:
        self._responses.put_nowait(
            rpc.WatchResponse(watch_id=watch_id, canceled=True, cancel_reason=reason)
        )

    async def until_creates(self, count: int) -> None:
        async with self._created:
            await self._created.wait_for(lambda: len(self.creates) >= count)


async def keys_received(watcher: Any, prefix: bytes, into: list[Any]) -> Any:
    async def collect(event: Any) -> None:
        if event is not None:  # None: the watcher shut down
            into.append(event if isinstance(event, Exception) else event.kv.key)

    return await watcher.add_callback(prefix, collect, range_end=prefix + b"\xff")


async def crossed_stream(watcher_class: type) -> tuple[list[Any], SlowEtcdWatch]:
    """/a/'s creation times out; /b/'s is pending when the late answer to /a/'s arrives, then
    its own; then etcd sends a change under each watch it created."""
    etcd = SlowEtcdWatch()
    watcher = watcher_class(etcd, timeout=TIMEOUT_S)
    for_a: list[Any] = []
    for_b: list[Any] = []
    with pytest.raises(aetcd.WatchTimeoutError):
        await keys_received(watcher, b"/a/", for_a)
    creating_b = asyncio.create_task(keys_received(watcher, b"/b/", for_b))
    await etcd.until_creates(2)
    id_of_a = etcd.answer_next()  # late: /a/'s creation was given up
    await asyncio.sleep(0.01)
    id_of_b = etcd.answer_next()
    await creating_b
    etcd.put(id_of_a, b"/a/1")
    etcd.put(id_of_b, b"/b/1")
    await asyncio.sleep(0.05)
    await watcher.shutdown()
    return for_b, etcd


async def test_a_late_answer_to_a_given_up_creation_goes_to_no_other_watch() -> None:
    for_b, etcd = await crossed_stream(MatchedWatcher)
    assert for_b == [b"/b/1"]
    assert etcd.cancelled == [etcd.creates[0].watch_id]  # the abandoned watch is cancelled


async def test_aetcd_alone_crosses_the_watches() -> None:
    """What the stand-in reproduces (so the test above can fail): aetcd's own watcher gives
    /b/'s callback the watch of /a/."""
    for_b, _ = await crossed_stream(aetcd_watcher.Watcher)
    assert for_b == [b"/a/1"]


async def test_a_refused_creation_fails_at_once() -> None:
    etcd = SlowEtcdWatch()
    watcher = MatchedWatcher(etcd, timeout=30)
    creating = asyncio.create_task(keys_received(watcher, b"/a/", []))
    await etcd.until_creates(1)
    etcd.answer_next(canceled=True, cancel_reason="permission denied")
    with pytest.raises(WatchCancelled, match="permission denied"):
        await asyncio.wait_for(creating, 5)
    await watcher.shutdown()


async def test_a_creation_answered_with_a_compacted_revision_fails_at_once() -> None:
    etcd = SlowEtcdWatch()
    watcher = MatchedWatcher(etcd, timeout=30)
    creating = asyncio.create_task(keys_received(watcher, b"/a/", []))
    await etcd.until_creates(1)
    etcd.answer_next(compact_revision=7)
    with pytest.raises(aetcd.RevisionCompactedError):
        await asyncio.wait_for(creating, 5)
    await watcher.shutdown()


async def test_a_watch_etcd_cancels_ends_with_an_outage_to_resume_from() -> None:
    """A watch etcd drops (other than for compaction) must end, not go quiet: the adapter
    then re-creates it from its last revision."""
    etcd = SlowEtcdWatch()
    watcher = MatchedWatcher(etcd, timeout=30)
    received: list[Any] = []
    creating = asyncio.create_task(keys_received(watcher, b"/a/", received))
    await etcd.until_creates(1)
    watch_id = etcd.answer_next()
    await creating
    etcd.cancel(watch_id, "etcdserver: mvcc: required revision is a future revision")
    await asyncio.sleep(0.05)
    await watcher.shutdown()
    assert len(received) == 1 and isinstance(received[0], WatchCancelled)
    assert isinstance(translate_error(received[0], "watch"), MetadataUnavailable)


async def stream_broken_with_a_full_queue(watcher_class: type) -> list[Any]:
    """etcd stops reading; creations pile up until aetcd's request queue (10) is full; the
    stream breaks; then etcd reads again and a new watch is created on a new stream."""
    etcd = SlowEtcdWatch(reading=False)
    watcher = watcher_class(etcd, timeout=0.05)
    for _ in range(10):
        with pytest.raises(aetcd.WatchTimeoutError):
            await keys_received(watcher, b"/a/", [])
    etcd.break_stream()
    await asyncio.sleep(0.05)
    etcd.reading = True
    received: list[Any] = []
    creating = asyncio.create_task(keys_received(watcher, b"/b/", received))
    try:
        await asyncio.wait_for(etcd.until_creates(1), 2)
        etcd.put(etcd.answer_last(), b"/b/1")
        await asyncio.wait_for(creating, 2)
        await asyncio.sleep(0.05)
    finally:
        creating.cancel()
    return received


async def test_a_stream_that_breaks_with_a_full_queue_leaves_watches_working() -> None:
    assert await stream_broken_with_a_full_queue(MatchedWatcher) == [b"/b/1"]


async def test_aetcd_alone_hangs_after_a_stream_breaks_with_a_full_queue() -> None:
    """What the stand-in reproduces: aetcd's own watcher waits forever, holding its lock, for
    room in the dead stream's queue, so no watch can be created again."""
    with pytest.raises(TimeoutError):
        await stream_broken_with_a_full_queue(aetcd_watcher.Watcher)
