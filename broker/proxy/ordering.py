"""Keeps one client connection's retried produce parts in the order the client sent them.

An idempotent producer numbers its batches per partition, and a broker refuses a batch whose
sequence number is not the next one it expects (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal for the
producer). When a partition moves, the old owner answers several of a client's pipelined
requests NOT_LEADER_OR_FOLLOWER at once. Retried independently, a later request could reach the
new owner before an earlier one; so could a request sent straight to the new owner while an
earlier one is still waiting to be retried. A retry therefore waits for the retries of that
partition that began before it, and a new request waits for every retry of its partitions
still under way. In the common case (no retry) nothing waits: pipelining stays as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

TopicPartition = tuple[str, int]


class RetryOrder:
    def __init__(self) -> None:
        self._last: dict[TopicPartition, asyncio.Future[None]] = {}

    def _unfinished(self, partitions: Iterable[TopicPartition]) -> set[asyncio.Future[None]]:
        found = {self._last.get(tp) for tp in partitions}
        return {future for future in found if future is not None and not future.done()}

    async def before_first_send(self, partitions: Iterable[TopicPartition]) -> None:
        """Wait until no retry of these partitions is under way."""
        waiting = self._unfinished(partitions)
        if waiting:
            await asyncio.wait(waiting)

    def begin_retry(
        self, partitions: Iterable[TopicPartition]
    ) -> tuple[asyncio.Future[None], set[asyncio.Future[None]]]:
        """Take a place in line: this retry's own future (resolve it with ``end``) and the
        earlier retries of the same partitions it must wait for."""
        partitions = list(partitions)
        earlier = self._unfinished(partitions)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in partitions:
            self._last[tp] = mine
        return mine, earlier

    def end(self, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        for tp in [tp for tp, future in self._last.items() if future is mine]:
            del self._last[tp]
