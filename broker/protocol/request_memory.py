"""The broker-wide budget of request bytes held in memory (Kafka's ``queued.max.request.bytes``).

A peer chooses how large a frame it announces; without a common budget, a thousand connections
each announcing a frame near the maximum would make the broker reserve a thousand such buffers.
Connections take from this budget as their frame buffers grow (``framing``) and give back once
the request has been answered (``server``). When it is spent, a connection stops reading its
socket (TCP back-pressure) and waits in line until bytes are given back; frames small enough for
a connection's fixed receive buffer need nothing from it, so small requests (metadata, offsets,
heartbeats) are served while large ones wait. One frame larger than the whole budget may still
be received when nothing else holds any.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable

Waiter = Callable[[], None]


class RequestMemory:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self._waiters: deque[Waiter] = deque()

    def try_take(self, size: int) -> bool:
        """Take ``size`` bytes if they fit (or nothing else is taken); False otherwise."""
        if self.used_bytes and self.used_bytes + size > self.limit_bytes:
            return False
        self.used_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return True

    def give(self, size: int) -> None:
        """Give ``size`` bytes back and let waiting connections try again, oldest first."""
        if size <= 0:
            return
        self.used_bytes -= size
        for _ in range(len(self._waiters)):
            if self.used_bytes >= self.limit_bytes:
                break
            self._waiters.popleft()()  # it takes what it needs, or waits again at the back

    def wait(self, waiter: Waiter) -> None:
        """Call ``waiter`` once bytes are given back (it must then try again)."""
        self._waiters.append(waiter)

    def cancel(self, waiter: Waiter) -> None:
        with contextlib.suppress(ValueError):  # not waiting (any more)
            self._waiters.remove(waiter)

    @property
    def waiting(self) -> int:
        return len(self._waiters)
