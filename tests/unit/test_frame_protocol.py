"""The frame reader of ``broker/protocol/framing.py``, driven through the calls a transport
makes (``get_buffer``, ``buffer_updated``, ``eof_received``, ``connection_lost``).

Whatever bytes a peer sends and however the network splits them, the reader delivers the same
frames, never offers a buffer larger than the scratch buffer or the configured maximum, refuses
oversized or negative lengths before allocating a body, ends cleanly only at a frame boundary,
and stops reading the socket while frames wait for the consumer (STYLE "Bound everything",
DESIGN §4).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import zlib
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import pytest
from harness.kafka_server import serving
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale.broker.buffer_pool import BufferPool
from kafscale.broker.config import LimitSettings
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.framing import (
    FIRST_BODY_BYTES,
    FrameProtocol,
    FrameTooLarge,
    frame_buffer_pool,
)
from kafscale.broker.protocol.request_memory import RequestMemory
from kafscale.broker.server import Connection, KafkaServer

pytestmark = pytest.mark.unit

MAX_FRAME = 256
SCRATCH = 16 * 1024  # the protocol's default scratch buffer


class FakeTransport(asyncio.Transport):
    """Records what the protocol asks of the transport; ``receive`` stands in for the socket."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.pauses = 0
        self.resumes = 0
        self.written = bytearray()
        self.closed = False
        self.offered: list[memoryview] = []  # every buffer get_buffer returned
        self._resumed = asyncio.Event()

    def pause_reading(self) -> None:
        if self.reading:
            self.reading = False
            self.pauses += 1
            self._resumed.clear()

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            self.resumes += 1
            self._resumed.set()

    def is_reading(self) -> bool:
        return self.reading

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def receive(self, protocol: FrameProtocol, chunk: bytes) -> bytes:
        """What the event loop does with bytes waiting on the socket: ``recv_into`` whatever
        buffer the protocol offers until they are all read or reading is paused; the rest."""
        data = memoryview(chunk)
        while data and self.reading:
            buffer = protocol.get_buffer(-1)
            assert len(buffer) > 0
            self.offered.append(buffer)
            n = min(len(buffer), len(data))
            buffer[:n] = data[:n]
            protocol.buffer_updated(n)
            data = data[n:]
        return bytes(data)

    async def until_reading(self) -> None:
        while not self.reading:
            await self._resumed.wait()


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def connected(
    max_frame: int = MAX_FRAME,
    scratch: int = SCRATCH,
    buffers: BufferPool | None = None,
    memory: RequestMemory | None = None,
) -> tuple[FrameProtocol, FakeTransport]:
    connects: list[FrameProtocol] = []
    protocol = FrameProtocol(
        max_frame, connects.append, scratch_bytes=scratch, buffers=buffers, memory=memory
    )
    transport = FakeTransport()
    protocol.connection_made(transport)
    assert connects == [protocol]
    return protocol, transport


def hang_up(protocol: FrameProtocol) -> None:
    assert protocol.eof_received() is True  # the transport stays open for responses
    protocol.connection_lost(None)


async def deliver(protocol: FrameProtocol, transport: FakeTransport, chunk: bytes) -> list[bytes]:
    """Receive ``chunk`` with a consumer that takes frames whenever reading pauses; the frames
    it took."""
    taken = []
    while chunk := transport.receive(protocol, chunk):
        while not transport.reading:
            got = await asyncio.wait_for(protocol.read_frame(), 5)
            assert got is not None
            taken.append(bytes(got))
    return taken


async def read_all(protocol: FrameProtocol) -> list[bytes]:
    frames = []
    while (got := await asyncio.wait_for(protocol.read_frame(), 5)) is not None:
        frames.append(bytes(got))
    return frames


async def stream_through(
    protocol: FrameProtocol, transport: FakeTransport, pieces: Iterable[bytes]
) -> tuple[list[bytes], BaseException | None]:
    """Send ``pieces`` (honouring pause_reading) and hang up, while a consumer reads: the frames
    it got and the error that ended them, if any."""
    frames: list[bytes] = []

    async def send() -> None:
        for piece in pieces:
            data = memoryview(piece)
            while data:
                await transport.until_reading()
                step = min(len(data), 1 + len(data) // 2)  # more than one receive per piece
                rest = transport.receive(protocol, bytes(data[:step]))
                data = data[step - len(rest) :]
                await asyncio.sleep(0)
        hang_up(protocol)

    sender = asyncio.create_task(send())
    error: BaseException | None = None
    try:
        while (got := await asyncio.wait_for(protocol.read_frame(), 5)) is not None:
            frames.append(bytes(got))
    except (FrameTooLarge, ConnectionError) as exc:
        error = exc
    finally:
        if error is None:
            await sender  # a clean end comes only after the sender hung up
        else:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return frames, error


# --- receiving -----------------------------------------------------------------------------


@pytest.mark.parametrize("scratch", [4, 9, SCRATCH])
async def test_frames_split_at_every_byte_boundary(scratch: int) -> None:
    bodies = [b"", b"a", b"hello world", bytes(range(200)), b"z" * MAX_FRAME]
    data = b"".join(frame(body) for body in bodies)
    for cut in range(len(data) + 1):
        protocol, transport = connected(scratch=scratch)
        frames = await deliver(protocol, transport, data[:cut])
        frames += await deliver(protocol, transport, data[cut:])
        hang_up(protocol)
        assert frames + await read_all(protocol) == bodies, f"cut at {cut}"


async def test_frames_arriving_one_byte_at_a_time() -> None:
    bodies = [b"hello", b"", b"w" * 100, b"!", b"", b""]
    for scratch in (4, 6, SCRATCH):
        protocol, transport = connected(scratch=scratch)
        frames = []
        for byte in b"".join(map(frame, bodies)):
            frames += await deliver(protocol, transport, bytes([byte]))
        hang_up(protocol)
        assert frames + await read_all(protocol) == bodies


async def test_several_frames_in_one_receive() -> None:
    protocol, transport = connected()
    bodies = [b"one", b"two", b"three"]
    transport.receive(protocol, b"".join(map(frame, bodies)))
    assert len(transport.offered) == 1
    hang_up(protocol)
    frames = []
    while (got := await protocol.read_frame()) is not None:
        assert isinstance(got, bytes)  # small frames are copied out of the scratch buffer
        frames.append(got)
    assert frames == bodies


async def test_a_large_frame_is_received_into_its_own_buffer() -> None:
    """Not reserved at its announced size: a first buffer of FIRST_BODY_BYTES, then, once that
    is full, one of the whole frame (a MiB frame grows once), received into directly."""
    size = 1024 * 1024 + 3
    body = os.urandom(size)
    protocol, transport = connected(max_frame=2 * size)
    data = frame(body) + frame(b"after") + frame(b"x")[:2]
    transport.receive(protocol, data[:1000])
    first = protocol.get_buffer(-1)
    assert len(first) == FIRST_BODY_BYTES - (1000 - 4)
    transport.receive(protocol, data[1000 : 4 + FIRST_BODY_BYTES])
    rest = protocol.get_buffer(-1)
    # Exactly the rest of the body: the kernel writes into the frame itself, not past it.
    assert len(rest) == size - FIRST_BODY_BYTES
    assert isinstance(rest.obj, bytearray) and len(rest.obj) == size
    for start in range(4 + FIRST_BODY_BYTES, len(data), 4096):
        transport.receive(protocol, data[start : start + 4096])
    assert transport.offered[-2].obj is rest.obj  # no copy through the scratch buffer
    received = await protocol.read_frame()
    assert isinstance(received, memoryview) and received.readonly
    assert received.obj is rest.obj
    assert received == body
    assert await protocol.read_frame() == b"after"  # back to the scratch buffer
    transport.receive(protocol, frame(b"x")[2:])  # with the partial prefix carried over
    assert await protocol.read_frame() == b"x"


async def test_announced_frames_wait_for_request_memory_and_small_ones_do_not() -> None:
    """Two peers announce 1 MiB frames against a budget of 1.5 MiB: the first reserves its
    size (and holds a 64 KiB buffer), the second stops being read until the first one's
    request is answered; a small frame needs no budget."""
    memory = RequestMemory(3 * 512 * 1024)
    big = os.urandom(1024 * 1024)
    first, first_transport = connected(max_frame=2 * len(big), memory=memory)
    second, second_transport = connected(max_frame=2 * len(big), memory=memory)
    first_transport.receive(first, frame(big)[:100])
    assert memory.used_bytes == len(big)
    assert len(first.get_buffer(-1)) == FIRST_BODY_BYTES - 96
    second_transport.receive(second, frame(big)[:100])
    assert not second_transport.reading and memory.waiting == 1
    assert memory.used_bytes == len(big)
    third, third_transport = connected(memory=memory)
    third_transport.receive(third, frame(b"metadata please"))
    assert await third.read_frame() == b"metadata please"
    first_transport.receive(first, frame(big)[100:])
    taken = await first.read_charged_frame()
    assert taken is not None and taken[0] == big and taken[1] == len(big)
    assert not second_transport.reading  # still held: the request is not answered yet
    first.give_back(taken[1])
    assert second_transport.reading and memory.used_bytes == len(big)
    second_transport.receive(second, frame(big)[100:])
    assert await second.read_frame() == big
    assert memory.used_bytes == 0


async def test_a_dropped_connection_gives_its_memory_back() -> None:
    memory = RequestMemory(10 * 1024 * 1024)
    protocol, transport = connected(max_frame=8 * 1024 * 1024, memory=memory)
    transport.receive(protocol, struct.pack(">i", 8 * 1024 * 1024) + b"\0" * 100)
    assert memory.used_bytes == 8 * 1024 * 1024
    assert len(protocol.get_buffer(-1)) == FIRST_BODY_BYTES - 100
    hang_up(protocol)
    assert memory.used_bytes == 0


async def test_a_partial_length_prefix_is_carried_over() -> None:
    protocol, transport = connected(scratch=16)
    first, second = frame(b"0123456789"), frame(b"abcdef")
    transport.receive(protocol, first + second[:3])  # 14 + 3 bytes: over one receive
    assert await protocol.read_frame() == b"0123456789"
    transport.receive(protocol, second[3:])
    assert await protocol.read_frame() == b"abcdef"
    hang_up(protocol)
    assert await protocol.read_frame() is None


async def test_a_frame_that_fits_the_scratch_buffer_stays_there() -> None:
    protocol, transport = connected(scratch=32)
    data = frame(b"a" * 10) + frame(b"b" * 20)
    transport.receive(protocol, data[:20])  # the second frame starts at 14, length known
    transport.receive(protocol, data[20:])
    assert all(buffer.obj is transport.offered[0].obj for buffer in transport.offered)
    assert [await protocol.read_frame() for _ in range(2)] == [b"a" * 10, b"b" * 20]


async def test_decoded_requests_from_a_large_frame() -> None:
    """kio refuses writable buffers; a large frame must reach it read-only."""
    records = os.urandom(200_000)
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 1000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}],
    }
    request = codec.encode_request(0, 9, 42, body)
    protocol, transport = connected(max_frame=1 << 20)
    transport.receive(protocol, request)
    received = await protocol.read_frame()
    assert isinstance(received, memoryview)
    assert codec.peek_header(received) == (0, 9, 42)
    decoded = codec.decode_request(received, codec.request_schema(0, 9))
    assert decoded.body.topic_data[0].partition_data[0].records == records


# --- frame buffers used again ------------------------------------------------------------------

POOLED = 300 * 1024  # over the frame pool's minimum


async def receive_large(protocol: FrameProtocol, transport: FakeTransport, body: bytes) -> Any:
    transport.receive(protocol, frame(body))
    # The event loop lets go of the buffers it received into; the fake keeps them unless told.
    transport.offered.clear()
    return await protocol.read_frame()


async def test_a_decoded_frame_s_buffer_receives_the_next_large_frame() -> None:
    pool = frame_buffer_pool()
    protocol, transport = connected(max_frame=1 << 20, buffers=pool)
    first_body, second_body = os.urandom(POOLED + 5000), os.urandom(POOLED)
    first = await receive_large(protocol, transport, first_body)
    assert first == first_body
    memory = id(first.obj)
    del first  # the request was decoded
    second = await receive_large(protocol, transport, second_body)
    assert id(second.obj) == memory
    assert second == second_body and len(second) == POOLED
    assert (pool.allocated, pool.reused) == (1, 1)


async def test_frames_still_held_are_never_received_into() -> None:
    pool = frame_buffer_pool()
    protocol, transport = connected(max_frame=1 << 20, buffers=pool)
    bodies = [os.urandom(POOLED) for _ in range(4)]
    held = [await receive_large(protocol, transport, body) for body in bodies]
    assert [bytes(view) for view in held] == bodies
    assert (pool.allocated, pool.reused) == (4, 0)
    assert len({id(view.obj) for view in held}) == 4


async def test_frames_below_the_pool_minimum_use_fresh_memory() -> None:
    pool = frame_buffer_pool()
    protocol, transport = connected(max_frame=1 << 20, buffers=pool)
    body = os.urandom(pool.min_pooled_bytes - 1)
    assert await receive_large(protocol, transport, body) == body
    assert (pool.allocated, pool.reused, pool.size_bytes) == (0, 0, 0)


# --- lengths and endings ---------------------------------------------------------------------


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**31 - 1, -1, -(2**31)])
async def test_oversized_and_negative_lengths_are_refused(length: int) -> None:
    protocol, transport = connected(scratch=8)
    transport.receive(protocol, frame(b"ok") + struct.pack(">i", length) + b"x" * 3)
    assert not transport.reading  # nothing after a bad length is read
    assert all(len(buffer.obj) <= 8 for buffer in transport.offered)  # no body allocated
    assert await protocol.read_frame() == b"ok"  # frames before it still count
    with pytest.raises(FrameTooLarge, match=str(length)):
        await protocol.read_frame()
    assert not transport.reading


async def test_a_frame_of_exactly_the_maximum_is_accepted() -> None:
    protocol, transport = connected(scratch=16)
    transport.receive(protocol, frame(b"m" * MAX_FRAME))
    assert await protocol.read_frame() == b"m" * MAX_FRAME


@pytest.mark.parametrize("data", [b"", frame(b"abc")])
async def test_a_clean_end_of_stream_is_none(data: bytes) -> None:
    protocol, transport = connected()
    transport.receive(protocol, data)
    hang_up(protocol)
    assert await read_all(protocol) == ([b"abc"] if data else [])
    assert await protocol.read_frame() is None


@pytest.mark.parametrize("scratch", [8, SCRATCH])
@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00", frame(b"abcdefghij")[:-1]])
async def test_an_end_inside_a_frame_is_a_connection_error(data: bytes, scratch: int) -> None:
    protocol, transport = connected(scratch=scratch)
    transport.receive(protocol, frame(b"first") + data)
    hang_up(protocol)
    assert await protocol.read_frame() == b"first"
    with pytest.raises(ConnectionError):
        await protocol.read_frame()


async def test_a_broken_connection_wakes_a_waiting_reader() -> None:
    protocol, _ = connected()
    waiting = asyncio.create_task(protocol.read_frame())
    await asyncio.sleep(0)
    assert not waiting.done()
    protocol.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(waiting, 5)


async def test_stop_ends_reading_at_once_even_with_frames_waiting() -> None:
    protocol, transport = connected()
    waiting = asyncio.create_task(protocol.read_frame())
    await asyncio.sleep(0)
    transport.receive(protocol, frame(b"one") + frame(b"two"))
    assert await asyncio.wait_for(waiting, 5) == b"one"
    protocol.stop()
    assert await protocol.read_frame() is None  # "two" was received but is not delivered

    idle, _ = connected()
    waiting = asyncio.create_task(idle.read_frame())
    await asyncio.sleep(0)
    idle.stop()
    assert await asyncio.wait_for(waiting, 5) is None


# --- flow control ----------------------------------------------------------------------------


async def test_reading_pauses_while_the_consumer_lags_and_resumes_when_it_catches_up() -> None:
    protocol, transport = connected()
    for i in range(2):
        transport.receive(protocol, frame(b"%d" % i))
        assert transport.reading
    transport.receive(protocol, frame(b"2"))  # a third frame waiting: stop reading
    assert not transport.reading and transport.pauses == 1
    assert await protocol.read_frame() == b"0"
    assert not transport.reading  # still two waiting
    assert await protocol.read_frame() == b"1"
    assert transport.reading and transport.resumes == 1
    assert await protocol.read_frame() == b"2"
    assert transport.pauses == 1


async def test_a_burst_of_small_frames_pauses_reading_once() -> None:
    protocol, transport = connected()
    bodies = [b"%04d" % i for i in range(500)]
    assert transport.receive(protocol, b"".join(map(frame, bodies))) == b""  # one receive
    assert not transport.reading and transport.pauses == 1
    assert [await protocol.read_frame() for _ in bodies] == bodies
    assert transport.reading and transport.resumes == 1


async def test_writes_wait_while_the_transport_is_over_its_high_water_mark() -> None:
    protocol, transport = connected()
    protocol.write(b"response")
    await asyncio.wait_for(protocol.drain(), 1)  # not paused: returns at once
    protocol.pause_writing()
    draining = asyncio.create_task(protocol.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    protocol.resume_writing()
    await asyncio.wait_for(draining, 5)
    assert transport.written == b"response"

    protocol.pause_writing()
    draining = asyncio.create_task(protocol.drain())
    await asyncio.sleep(0)
    protocol.connection_lost(None)
    with pytest.raises(ConnectionResetError):
        await asyncio.wait_for(draining, 5)
    with pytest.raises(ConnectionResetError):
        await protocol.drain()
    await asyncio.wait_for(protocol.wait_closed(), 5)


# --- any byte stream ------------------------------------------------------------------------


def expected_frames(data: bytes) -> tuple[list[bytes], type[BaseException] | None]:
    """The frames a reader must deliver from ``data`` and the error that must end them."""
    frames, position = [], 0
    while position < len(data):
        if len(data) - position < 4:
            return frames, ConnectionError
        (length,) = struct.unpack_from(">i", data, position)
        if length < 0 or length > MAX_FRAME:
            return frames, FrameTooLarge
        if len(data) - position - 4 < length:
            return frames, ConnectionError
        frames.append(data[position + 4 : position + 4 + length])
        position += 4 + length
    return frames, None


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


bodies = st.binary(max_size=MAX_FRAME)
streams = st.one_of(
    st.binary(max_size=600),  # noise
    st.lists(bodies, max_size=5).map(lambda bs: b"".join(map(frame, bs))),  # well-formed
    st.tuples(st.lists(bodies, max_size=4), st.binary(max_size=40)).map(  # frames then noise
        lambda t: b"".join(map(frame, t[0])) + t[1]
    ),
    st.tuples(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=40)).map(
        lambda t: struct.pack(">i", t[0]) + t[1]  # any length prefix
    ),
)


async def check_stream(data: bytes, cuts: list[int], scratch: int) -> None:
    protocol, transport = connected(scratch=scratch)
    frames, error = await stream_through(protocol, transport, split(data, cuts))
    want_frames, want_error = expected_frames(data)
    assert frames == want_frames
    if want_error is None:
        assert error is None
    else:
        assert isinstance(error, want_error)
    # Never a buffer beyond the scratch buffer or a body of at most the maximum.
    assert all(len(buffer.obj) <= max(scratch, MAX_FRAME) for buffer in transport.offered)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams, st.lists(st.integers(0, 1000), max_size=8), st.sampled_from([4, 7, 64, SCRATCH]))
def test_any_byte_stream_split_anywhere(data: bytes, cuts: list[int], scratch: int) -> None:
    asyncio.run(check_stream(data, cuts, scratch))


# --- through a real socket --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def blocked_server(release: asyncio.Event) -> AsyncIterator[KafkaServer]:
    async def dispatch(frame: bytes | memoryview, connection: Connection) -> bytes | None:
        await release.wait()
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        return struct.pack(">ii", 4, correlation_id)

    limits = LimitSettings(max_frame_bytes=1 << 20, max_in_flight_per_connection=1)
    async with serving(dispatch, limits) as server:
        yield server


async def test_a_server_stops_reading_a_client_it_cannot_keep_up_with() -> None:
    release = asyncio.Event()
    async with blocked_server(release) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        count = 50
        payload = b"p" * 10_000
        writer.write(
            b"".join(frame(struct.pack(">hhi", 0, 7, cid) + payload) for cid in range(count))
        )
        ((_, protocol),) = server._connections.values()
        for _ in range(500):
            if not protocol.transport.is_reading():
                break
            await asyncio.sleep(0.01)
        assert not protocol.transport.is_reading()
        release.set()
        answers = [struct.unpack(">ii", await reader.readexactly(8))[1] for _ in range(count)]
        assert answers == list(range(count))
        assert protocol.transport.is_reading()
        writer.close()
        await writer.wait_closed()


def numbered_requests(sizes: list[int]) -> list[bytes]:
    """Request frame bodies with correlation ids 0, 1, ... and random payloads of ``sizes``."""
    return [struct.pack(">hhi", 0, 7, cid) + os.urandom(size) for cid, size in enumerate(sizes)]


def checksum_answer(frame: bytes | memoryview) -> bytes:
    """The frame's correlation id and CRC-32, as the test servers answer."""
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    return struct.pack(">iI", correlation_id, zlib.crc32(frame))


def test_a_server_on_uvloop_receives_frames_intact_and_answers_in_order() -> None:
    """The broker runs on uvloop, whose transports are not ``asyncio.Transport`` subclasses and
    which calls ``get_buffer`` from libuv's read loop."""
    uvloop = pytest.importorskip("uvloop")
    requests = numbered_requests([0, 10, 70_000, 1000, 500_000, 3, 65_530])

    async def checksum(frame: bytes | memoryview, connection: Connection) -> bytes | None:
        return checksum_answer(frame)

    async def scenario() -> None:
        server = KafkaServer(checksum, LimitSettings(max_frame_bytes=1 << 20), "127.0.0.1", 0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"".join(map(frame, requests)))
            writer.write_eof()  # responses are still owed after the client half-closes
            for correlation_id, request in enumerate(requests):
                answer = struct.unpack(">iI", await asyncio.wait_for(reader.readexactly(8), 5))
                assert answer == (correlation_id, zlib.crc32(request))
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
        finally:
            await server.close(grace_s=1.0)

    uvloop.run(scenario())


def test_a_server_reuses_frame_buffers_only_once_requests_are_done_with_them() -> None:
    """Requests hold their frames across awaits while later frames arrive: a buffer handed out
    again too early would change a frame under its request, and the checksum with it."""
    uvloop = pytest.importorskip("uvloop")
    sizes = [1_000_000 - (7919 * i) % 300_000 for i in range(60)]  # as a busy producer sends
    requests = numbered_requests(sizes)

    async def checksum_later(frame: bytes | memoryview, connection: Connection) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        await asyncio.sleep(0.001 * (correlation_id % 4))
        return checksum_answer(frame)

    async def scenario() -> KafkaServer:
        async with serving(checksum_later, LimitSettings(max_frame_bytes=1 << 20)) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            for start in range(0, len(requests), 6):  # bursts of pipelined requests
                writer.write(b"".join(map(frame, requests[start : start + 6])))
                for correlation_id in range(start, min(start + 6, len(requests))):
                    answer = await asyncio.wait_for(reader.readexactly(8), 5)
                    expected = (correlation_id, zlib.crc32(requests[correlation_id]))
                    assert struct.unpack(">iI", answer) == expected
            writer.close()
        return server

    pool = uvloop.run(scenario()).frame_buffers
    assert pool.reused > len(sizes) // 2
    assert pool.allocated + pool.reused == len(sizes)
