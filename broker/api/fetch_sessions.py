"""Incremental fetch sessions (KIP-227), the way the Java client and kafka-python fetch.

A consumer of many partitions otherwise names every partition in every fetch, and is told about
every one in every response, whether anything changed or not. With a session, the broker keeps
the partitions and their fetch positions; a request names only what changed (new positions,
added or forgotten partitions), and a response carries only partitions with records, a moved
high watermark or log start, or an error. Clients that do not ask for a session (librdkafka,
aiokafka: epoch -1) fetch as before.

Decisions only: which partitions a request reads and which results its response carries. The
sessions live in this broker's memory; a client that loses one (a restart, eviction) gets
FETCH_SESSION_ID_NOT_FOUND and starts a new one with a full request, as the protocol intends.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.protocol.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full request: open a session (closing the one named, if any)
FINAL_EPOCH = -1  # a full request without a session (closing the one named, if any)
MAX_EPOCH = 2**31 - 1

PartitionKey = tuple[Any, int]  # (topic name, or topic id from Fetch v13, as sent; partition)


@dataclass(frozen=True, slots=True)
class FetchPosition:
    fetch_offset: int
    max_bytes: int
    current_leader_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What a response would say of a partition, as far as choosing it goes."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    has_records: bool


@dataclass(slots=True)
class _Cached:
    position: FetchPosition
    high_watermark: int = -1  # as last sent; -1: never sent, or last sent with an error
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchSession:
    id: int
    epoch: int  # the epoch the next request must carry
    partitions: dict[PartitionKey, _Cached] = field(default_factory=dict)


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= MAX_EPOCH else epoch + 1


@dataclass(slots=True)
class FetchContext:
    """One request's view: the partitions to read, in the order to fill the response."""

    session: FetchSession | None
    incremental: bool
    epoch: int = 0  # the session's epoch once this request was taken in

    @property
    def session_id(self) -> int:
        return self.session.id if self.session is not None else INVALID_SESSION_ID

    @property
    def overtaken(self) -> bool:
        """Whether another request of the session was taken in while this one waited (a
        duplicate): its answer is INVALID_FETCH_SESSION_EPOCH, as Kafka's is."""
        return self.session is not None and self.session.epoch != self.epoch

    def partitions(
        self, requested: Sequence[tuple[PartitionKey, FetchPosition]]
    ) -> list[tuple[PartitionKey, FetchPosition]]:
        if self.session is None:
            return list(requested)
        return [(key, cached.position) for key, cached in self.session.partitions.items()]

    def respond(self, results: Sequence[tuple[PartitionKey, PartitionResult]]) -> list[bool]:
        """Which of ``results`` (read for ``partitions()``) go into the response: all of a full
        one; of an incremental one those with records, a moved high watermark or log start, or
        an error. The session remembers what it sent, and moves the partitions it sent records
        of to the end of its order (as Kafka does), so a response cut short by ``max_bytes``
        serves the others next: moving every partition sent (a moved high watermark
        included) kept their order, and the first one with data took every response."""
        session = self.session
        if session is None:
            return [True] * len(results)
        chosen = []
        for key, result in results:
            cached = session.partitions.get(key)
            if cached is None:  # not from this session (cannot be): say it, as a full one would
                chosen.append(True)
                continue
            changed = (
                result.has_records
                or result.error_code != ErrorCode.NONE
                or result.high_watermark != cached.high_watermark
                or result.log_start_offset != cached.log_start_offset
            )
            send = changed or not self.incremental
            if send:
                errored = result.error_code != ErrorCode.NONE
                cached.high_watermark = -1 if errored else result.high_watermark
                cached.log_start_offset = result.log_start_offset
                if self.incremental and result.has_records:
                    session.partitions[key] = session.partitions.pop(key)
            chosen.append(send)
        return chosen


def _random_id() -> int:
    return random.randint(1, MAX_EPOCH)


class FetchSessionCache:
    """This broker's sessions, the least recently used evicted beyond ``slots``."""

    def __init__(self, slots: int, new_id: Callable[[], int] = _random_id) -> None:
        self._slots = slots
        self._new_id = new_id
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def context(
        self,
        session_id: int,
        epoch: int,
        requested: Sequence[tuple[PartitionKey, FetchPosition]],
        forgotten: Sequence[PartitionKey],
    ) -> FetchContext | ErrorCode:
        """The context of a request, or the top-level error to answer it with."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self._sessions.pop(session_id, None)
            if epoch == FINAL_EPOCH or self._slots <= 0:
                return FetchContext(None, incremental=False)
            opened = self._open(requested)
            return FetchContext(opened, incremental=False, epoch=opened.epoch)
        session = self._sessions.get(session_id)
        if session is None:
            return ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        if epoch != session.epoch:
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH
        for key, position in requested:
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = _Cached(position)
            else:
                cached.position = position
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:  # all forgotten: the session ends, as in Kafka
            del self._sessions[session_id]
            return FetchContext(None, incremental=False)
        self._sessions.move_to_end(session_id)
        session.epoch = next_epoch(epoch)
        return FetchContext(session, incremental=True, epoch=session.epoch)

    def _open(self, requested: Sequence[tuple[PartitionKey, FetchPosition]]) -> FetchSession:
        while len(self._sessions) >= self._slots:
            self._sessions.popitem(last=False)
        session_id = self._new_id()
        while session_id in self._sessions or session_id == INVALID_SESSION_ID:
            session_id = self._new_id()
        session = FetchSession(session_id, next_epoch(INITIAL_EPOCH))
        for key, position in requested:
            session.partitions[key] = _Cached(position)
        self._sessions[session_id] = session
        return session
