"""Length-prefixed frames read straight off the socket, and the write side's flow control.

Produce frames are large (a megabyte and more) and arrive back to back; a stream buffer copied
each one twice (into the buffer, then out of it, moving the rest down) and cost a fifth of the
broker's CPU. :class:`FrameProtocol` receives into a fixed scratch buffer instead, where small
frames are copied out once, several per receive; a frame too large for the scratch buffer gets a
buffer of its own as soon as its length is known, and the kernel writes the rest of its body
straight into it. Those buffers come from a pool shared by the server's connections and go back
to it once the frame is received; the pool hands one out again when nothing refers to it any
more, i.e. once the request was decoded (``buffer_pool``). A producer at full speed sends a
frame of about a MiB every few milliseconds, and a fresh buffer for each cost a fifth of the
broker's CPU per MiB produced. The length is checked before a buffer is taken, so a peer cannot
make the broker allocate more than the configured maximum, and reading pauses while frames wait
for the consumer, so a client cannot make the broker buffer without bound.

A large frame's announced size is reserved from the broker-wide ``RequestMemory`` budget before
a byte of it is stored (all at once, as Kafka's memory pool does: frames that each hold part of
the budget and wait for more could wait for each other forever); when the budget is spent, the
connection stops reading until memory is given back. Its buffer, though, is not allocated at
that size: it starts at ``FIRST_BODY_BYTES`` and grows (by ``BODY_GROWTH``, up to the announced
size) as the bytes arrive. A peer that announces 100 MiB and sends nothing more holds 64 KiB of
memory; the budget bounds what all of them can hold. A frame of about a MiB (a producer's) grows
once, straight to its size: one extra copy of 64 KiB.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from typing import TypeAlias, cast

from kafscale.broker.buffer_pool import BufferPool
from kafscale.broker.protocol.request_memory import RequestMemory

_LENGTH = struct.Struct(">i")
_SCRATCH_BYTES = 16 * 1024
# Received frames the consumer has not taken yet; above this, the socket is not read.
_MAX_WAITING_FRAMES = 2
# Frame buffers of ~1 MiB a server keeps for reuse: a producer at full speed has about four in
# use (one being received, two waiting, one being decoded), plus a few of other sizes. With 16
# MiB all but a few of ~210 frames per 200 MiB were reused, with 8 MiB 96-97 %, and the broker's
# peak RSS is kept 8 MiB lower. Smaller frames come from malloc's heap.
FRAME_POOL_BYTES = 8 * 1024 * 1024
FRAME_POOL_MIN_BYTES = 256 * 1024
FRAME_POOL_STEP = 64 * 1024
FIRST_BODY_BYTES = 64 * 1024
BODY_GROWTH = 32


def frame_buffer_pool() -> BufferPool:
    """The pool a server's connections share for their large frames."""
    return BufferPool(min_pooled_bytes=FRAME_POOL_MIN_BYTES, capacity_step=FRAME_POOL_STEP)


Frame: TypeAlias = bytes | memoryview


class FrameTooLarge(Exception):
    """The peer announced a frame larger than the configured maximum (or a negative one)."""


class FrameProtocol(asyncio.BufferedProtocol):
    """One client connection: frames in through :meth:`read_frame`, responses out through
    :meth:`write` and :meth:`drain`.

    ``on_connect`` is called once the transport is set; whoever serves the connection starts
    there. A frame is ``bytes`` when it fitted the scratch buffer, otherwise a read-only view of
    the buffer it was received into (read-only because kio's readers refuse writable buffers),
    taken from ``buffers`` (None: fresh memory for each).
    """

    def __init__(
        self,
        max_frame_bytes: int,
        on_connect: Callable[[FrameProtocol], None],
        scratch_bytes: int = _SCRATCH_BYTES,
        buffers: BufferPool | None = None,
        memory: RequestMemory | None = None,
    ) -> None:
        assert scratch_bytes >= _LENGTH.size, "a length prefix must fit the scratch buffer"
        self._max_frame_bytes = max_frame_bytes
        self._configured_max_frame_bytes = max_frame_bytes
        self._on_connect = on_connect
        self._transport: asyncio.Transport | None = None
        # Never resized: receives write through memoryviews of it.
        self._scratch = bytearray(scratch_bytes)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0  # scratch[_start:_end] is received but not yet a whole frame
        self._end = 0
        self._buffers = buffers
        self._body: bytearray | memoryview | None = None  # the large frame being received
        self._body_view = memoryview(b"")
        self._body_filled = 0
        self._body_length = 0  # the announced size of the frame being received
        self._body_charge = 0  # bytes of it taken from ``memory``
        self._memory = memory
        self._waiting_for_memory = False
        self._frames: deque[tuple[Frame, int]] = deque()  # with the bytes each holds of memory
        self._ended = False  # no frames after those in _frames
        self._error: BaseException | None = None  # raised once _frames is empty
        self._stopped = False
        self._reading_paused = False
        self._frame_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._lost = False
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.last_active = asyncio.get_running_loop().time()  # last byte received or sent

    @property
    def transport(self) -> asyncio.Transport:
        assert self._transport is not None, "not connected"
        return self._transport

    # --- the consumer's side ----------------------------------------------------------------

    async def read_frame(self) -> Frame | None:
        """The next frame, or None at a clean end of stream or once :meth:`stop` was called.

        Raises :class:`FrameTooLarge` for a bad length and :class:`ConnectionError` when the
        connection breaks or ends inside a frame, after the frames received before that.
        """
        taken = await self.read_charged_frame()
        if taken is None:
            return None
        frame, charge = taken
        self.give_back(charge)
        return frame

    async def read_charged_frame(self) -> tuple[Frame, int] | None:
        """:meth:`read_frame` and the bytes of ``memory`` the frame holds: the caller gives them
        back (:meth:`give_back`) once it is done with the request."""
        while True:
            if self._stopped:
                return None
            if self._frames:
                taken = self._frames.popleft()
                if len(self._frames) < _MAX_WAITING_FRAMES:
                    self._resume_reading()
                return taken
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            self._frame_waiter = asyncio.get_running_loop().create_future()
            try:
                await self._frame_waiter
            finally:
                self._frame_waiter = None

    def stop(self) -> None:
        """Deliver no more frames, also none already received (the server is stopping)."""
        self._stopped = True
        self._wake_reader()

    def limit_frames(self, max_frame_bytes: int) -> None:
        """Accept frames up to ``max_frame_bytes`` only (a SASL connection before its login,
        as Kafka's ``sasl.server.max.receive.size``), until :meth:`lift_frame_limit`."""
        self._max_frame_bytes = min(max_frame_bytes, self._configured_max_frame_bytes)

    def lift_frame_limit(self) -> None:
        self._max_frame_bytes = self._configured_max_frame_bytes

    def give_back(self, charge: int) -> None:
        """Return a frame's bytes to the broker-wide budget (see :meth:`read_charged_frame`)."""
        if self._memory is not None and charge:
            self._memory.give(charge)

    def release(self) -> None:
        """Give back the memory of frames never taken and of a frame half received; for the
        connection's owner, once it is done with the connection."""
        self._stopped = True
        while self._frames:
            self.give_back(self._frames.popleft()[1])
        self._drop_body()
        if self._memory is not None:
            self._memory.cancel(self._retry_with_memory)
        self._waiting_for_memory = False

    def write(self, data: bytes) -> None:
        self._check_open()
        self.last_active = asyncio.get_running_loop().time()
        self.transport.write(data)

    def write_many(self, data: list[bytes]) -> None:
        """Several frames in one go: one system call (``writev``) where the transport can."""
        self._check_open()
        self.last_active = asyncio.get_running_loop().time()
        if len(data) == 1:
            self.transport.write(data[0])
        else:
            self.transport.writelines(data)

    def _check_open(self) -> None:
        """A client that closed its connection with requests still in flight (KafkaJS on
        disconnect) is gone once the first late answer meets its reset: the rest are dropped as
        a closed connection. uvloop raises RuntimeError on a write to a closed transport, which
        logged an ERROR with a traceback per such client."""
        if self._lost or self.transport.is_closing():
            raise ConnectionResetError("Connection lost")

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._writing_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiter = waiter
        try:
            await waiter
        finally:
            self._drain_waiter = None

    async def wait_closed(self) -> None:
        await self._closed

    # --- asyncio's side ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, though not necessarily an asyncio.Transport subclass (uvloop's).
        self._transport = cast(asyncio.Transport, transport)
        self._on_connect(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is not None:
            return self._body_view[self._body_filled :]
        # Move the start of a partial frame to the front, making room for the rest of it.
        pending = self._end - self._start
        if self._start:
            self._scratch_view[:pending] = self._scratch_view[self._start : self._end]
            self._start, self._end = 0, pending
        return self._scratch_view[pending:]

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = asyncio.get_running_loop().time()
        if self._ended:
            return
        if self._body is not None:
            self._body_filled += nbytes
            if self._body_filled < len(self._body):
                return
            if self._body_filled < self._body_length:
                self._grow_body()
                return
            self._frames.append((self._body_view.toreadonly(), self._body_charge))
            self._body_charge = 0
            if self._buffers is not None:
                self._buffers.give_back(self._body, FRAME_POOL_BYTES)
            self._body, self._body_view = None, memoryview(b"")
        else:
            self._end += nbytes
            self._split_scratch()
        self._wake_reader()
        if len(self._frames) > _MAX_WAITING_FRAMES:
            self._pause_reading()

    def eof_received(self) -> bool:
        if self._body is not None or self._end > self._start:
            self._end_frames(ConnectionError("connection closed inside a frame"))
        else:
            self._end_frames(None)
        # Keep the transport open: responses may still be owed. TLS has no half-close (asyncio
        # closes it anyway, and logs a warning per connection when asked to keep it open).
        return self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None:
            error = exc if isinstance(exc, ConnectionError) else ConnectionError(str(exc))
            self._end_frames(error)
        else:
            self.eof_received()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionResetError("Connection lost"))
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- helpers ----------------------------------------------------------------------------

    def _split_scratch(self) -> None:
        """Queue every whole frame in the scratch buffer; give a partial frame that cannot fit
        there a buffer of its own."""
        view = self._scratch_view
        start, end = self._start, self._end
        while end - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(view, start)
            if length < 0 or length > self._max_frame_bytes:
                limit = self._max_frame_bytes
                self._end_frames(
                    FrameTooLarge(f"frame of {length} bytes exceeds the limit of {limit}")
                )
                self._pause_reading()  # nothing after a bad length is read
                return
            body_start = start + _LENGTH.size
            body_end = body_start + length
            if body_end <= end:
                self._frames.append((bytes(view[body_start:body_end]), 0))
                start = body_end
            elif _LENGTH.size + length > len(view):
                if not self._take_memory(length):
                    break  # the frame's start stays in the scratch buffer meanwhile
                self._body_length, self._body_charge = length, length
                first = min(length, max(FIRST_BODY_BYTES, end - body_start))
                self._set_body(self._new_buffer(first))
                self._body_view[: end - body_start] = view[body_start:end]
                self._body_filled = end - body_start
                start = end
            else:
                break  # the rest of it fits after the part already here
        self._start, self._end = start, end

    def _new_buffer(self, size: int) -> bytearray | memoryview:
        return bytearray(size) if self._buffers is None else self._buffers.take(size)

    def _set_body(self, body: bytearray | memoryview | None) -> None:
        self._body = body
        self._body_view = memoryview(b"") if body is None else memoryview(body)

    def _grow_body(self) -> None:
        """The body's buffer is full but the frame is not: a larger one (its memory is
        reserved already)."""
        assert self._body is not None
        old_size = len(self._body)
        size = min(self._body_length, old_size * BODY_GROWTH)
        grown = self._new_buffer(size)
        memoryview(grown)[:old_size] = self._body_view
        old = self._body
        self._set_body(grown)
        if self._buffers is not None:
            self._buffers.give_back(old, FRAME_POOL_BYTES)

    def _take_memory(self, size: int) -> bool:
        """Take ``size`` bytes from the budget; if it is spent, pause reading and wait."""
        if self._memory is None or self._memory.try_take(size):
            return True
        if not self._waiting_for_memory:
            self._waiting_for_memory = True
            self._memory.wait(self._retry_with_memory)
            self._pause_reading()
        return False

    def _retry_with_memory(self) -> None:
        """Memory was given back: take up the frame where it waited."""
        self._waiting_for_memory = False
        if self._ended or self._lost:
            return
        self._split_scratch()
        self._wake_reader()
        if not self._waiting_for_memory and len(self._frames) <= _MAX_WAITING_FRAMES:
            self._resume_reading()

    def _drop_body(self) -> None:
        self.give_back(self._body_charge)
        self._body_charge = 0
        self._set_body(None)

    def _end_frames(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        self._drop_body()
        self._start = self._end = 0
        self._wake_reader()

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and not self._ended and not self._waiting_for_memory:
            self._reading_paused = False
            self.transport.resume_reading()

    def _wake_reader(self) -> None:
        if self._frame_waiter is not None and not self._frame_waiter.done():
            self._frame_waiter.set_result(None)
