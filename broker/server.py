"""The Kafka listener and the per-connection pipeline.

Clients pipeline requests and match responses strictly in order (aiokafka drops the connection
on the first out-of-order reply), while a produce waits for an object-store upload. So each
connection has a reader that starts every request as its own task and a writer that awaits those
tasks in arrival order: requests run concurrently, responses leave in order. acks=0 produces
resolve to ``None`` and send nothing. The queue between them bounds requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.config import LimitSettings
from kafscale.broker.protocol.framing import FrameTooLarge, read_frame

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Connection:
    """Per-connection state handlers may need.

    ``append_lock`` keeps produce appends in arrival order even when one request waits for a
    lease: idempotent producers pipeline up to five batches per partition and expect them to be
    appended in the order sent.
    """

    peer: str
    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)


class ByteBudget:
    """Bytes of requests in flight on one connection; a request larger than the whole budget
    still runs, alone."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self._used and self._used + size > self._limit:
            await self._freed.wait()
        self._used += size

    def give(self, size: int) -> None:
        self._used -= size
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()


Dispatch = Callable[[bytes, Connection], Coroutine[Any, Any, bytes | None]]


class CloseConnection(Exception):
    """The frame cannot be answered (no readable header): drop the connection."""


class KafkaServer:
    def __init__(self, dispatch: Dispatch, limits: LimitSettings, host: str, port: int) -> None:
        self._dispatch = dispatch
        self._limits = limits
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._slots = asyncio.Semaphore(limits.max_connections)

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connect, self._host, self._port, reuse_address=True, limit=1 << 20
        )

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self, grace_s: float) -> None:
        """Stop accepting, let connections finish what they started, then cut them.

        Connections stop reading new requests at once (an idle client must not hold shutdown
        for the whole grace period); requests already read are answered first.
        """
        await self.stop_accepting()
        for connection in self._connections.values():
            connection.stopping.set()
        if self._connections:
            _, still_open = await asyncio.wait(list(self._connections), timeout=grace_s)
            for task in still_open:
                task.cancel()
            await asyncio.gather(*still_open, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if self._slots.locked():
            log.warning("connection limit %d reached; refusing", self._limits.max_connections)
            writer.close()
            return
        connection = Connection(_peer_name(writer))
        peer = connection.peer
        self._connections[task] = connection
        try:
            async with self._slots:
                await self._serve(reader, writer, connection)
        except* (ConnectionError, asyncio.IncompleteReadError):
            pass
        except* (FrameTooLarge, CloseConnection) as group:
            log.warning("closing %s: %s", peer, group.exceptions[0])
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: Connection
    ) -> None:
        in_order: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._limits.max_in_flight_per_connection)
        budget = ByteBudget(self._limits.max_in_flight_bytes_per_connection)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_write_in_order(in_order, writer, slots, budget))
                group.create_task(self._read_requests(reader, in_order, slots, budget, connection))
        finally:
            await _cancel_queued(in_order)

    async def _read_requests(
        self,
        reader: asyncio.StreamReader,
        in_order: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None],
        slots: asyncio.Semaphore,
        budget: ByteBudget,
        connection: Connection,
    ) -> None:
        while True:
            frame = await self._next_frame(reader, connection)
            if frame is None:
                in_order.put_nowait(None)
                return
            await slots.acquire()
            await budget.take(len(frame))
            # No await between creating the task and queueing it: every task has an owner.
            task = asyncio.create_task(self._dispatch(frame, connection))
            in_order.put_nowait((task, len(frame)))

    async def _next_frame(
        self, reader: asyncio.StreamReader, connection: Connection
    ) -> bytes | None:
        """The next frame, or None at end of stream or once the server is stopping."""
        if connection.stopping.is_set():
            return None
        read = asyncio.ensure_future(read_frame(reader, self._limits.max_frame_bytes))
        stop = asyncio.ensure_future(connection.stopping.wait())
        try:
            await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not read.done():
                read.cancel()
            await asyncio.gather(stop, read, return_exceptions=True)
        if read.cancelled():
            return None
        return read.result()


async def _write_in_order(
    in_order: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None],
    writer: asyncio.StreamWriter,
    slots: asyncio.Semaphore,
    budget: ByteBudget,
) -> None:
    while True:
        queued = await in_order.get()
        if queued is None:
            return
        task, size = queued
        try:
            response = await task  # CloseConnection propagates and ends the connection
        finally:
            slots.release()
            budget.give(size)
        if response:
            writer.write(response)
            await writer.drain()


async def _cancel_queued(
    in_order: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None],
) -> None:
    pending = []
    while not in_order.empty():
        queued = in_order.get_nowait()
        if queued is not None:
            task = queued[0]
            task.cancel()
            pending.append(task)
    await asyncio.gather(*pending, return_exceptions=True)


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
