"""A byte-bounded LRU of recent segment bodies, so fresh data is served without a GET."""

from __future__ import annotations

from collections import OrderedDict


class SegmentCache:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[str, bytes | memoryview] = OrderedDict()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> bytes | memoryview | None:
        body = self._entries.get(key)
        if body is not None:
            self._entries.move_to_end(key)
        return body

    def put(self, key: str, body: bytes | memoryview) -> None:
        if len(body) > self._max_bytes:
            return
        previous = self._entries.pop(key, None)
        if previous is not None:
            self._bytes -= len(previous)
        self._entries[key] = body
        self._bytes += len(body)
        while self._bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted)

    def discard_prefix(self, prefix: str) -> None:
        for key in [k for k in self._entries if k.startswith(prefix)]:
            self._bytes -= len(self._entries.pop(key))
