"""The per-connection pipeline of ``broker/server.py`` with a fake dispatch function: requests
run concurrently, responses leave in request order, acks=0 requests answer nothing, and a bad
frame or an unanswerable request closes only its own connection (DESIGN §4, STYLE "Async")."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from harness.kafka_server import serving as harness_serving

from kafscale.broker.config import LimitSettings
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.server import CloseConnection, Connection, KafkaServer, Mute

pytestmark = pytest.mark.unit

MAX_FRAME = 1024
SILENT = 1_000_000  # correlation ids at or above: no response (acks=0)
CLOSE = 2_000_000  # correlation ids at or above: CloseConnection


def request(correlation_id: int, payload: bytes = b"", api_key: int = 0) -> bytes:
    body = struct.pack(">hhi", api_key, 7, correlation_id) + payload
    return struct.pack(">i", len(body)) + body


@dataclass
class FakeDispatch:
    """Sleeps a random short time, then answers with the request's correlation id."""

    delays_s: Callable[[int], float] = lambda cid: random.uniform(0, 0.02)
    running: set[int] = field(default_factory=set)
    started: list[int] = field(default_factory=list)
    max_concurrent: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_started(self, count: int) -> None:
        while len(self.started) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 5)

    async def __call__(self, frame: bytes, connection: Connection) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        assert isinstance(connection, Connection)
        self.started.append(correlation_id)
        self.changed.set()
        self.running.add(correlation_id)
        self.max_concurrent = max(self.max_concurrent, len(self.running))
        try:
            await asyncio.sleep(self.delays_s(correlation_id))
        finally:
            self.running.discard(correlation_id)
        if correlation_id >= CLOSE:
            raise CloseConnection("unparsable header")
        if correlation_id >= SILENT:
            return None
        return struct.pack(">ii", 4, correlation_id)


def serving(
    dispatch: FakeDispatch, max_in_flight: int = 64
) -> contextlib.AbstractAsyncContextManager[KafkaServer]:
    limits = LimitSettings(max_frame_bytes=MAX_FRAME, max_in_flight_per_connection=max_in_flight)
    return harness_serving(dispatch, limits)


async def connect(server: KafkaServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def read_response(reader: asyncio.StreamReader) -> int:
    size, correlation_id = struct.unpack(">ii", await reader.readexactly(8))
    assert size == 4
    return int(correlation_id)


async def assert_closed(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> None:
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(reader.read(), timeout_s) == b""


async def round_trip(server: KafkaServer, correlation_id: int) -> None:
    reader, writer = await connect(server)
    writer.write(request(correlation_id))
    await writer.drain()
    assert await asyncio.wait_for(read_response(reader), 5) == correlation_id
    writer.close()
    await writer.wait_closed()


async def within(awaitable: Awaitable[None], timeout_s: float = 10.0) -> None:
    await asyncio.wait_for(awaitable, timeout_s)


async def test_pipelined_requests_are_answered_in_order_and_acks0_skipped() -> None:
    rng = random.Random(7)
    dispatch = FakeDispatch(delays_s=lambda cid: rng.uniform(0, 0.03))
    ids = [SILENT + i if i % 7 == 3 else i for i in range(50)]
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        writer.write(b"".join(request(cid) for cid in ids))  # all 50 at once
        await writer.drain()
        expected = [cid for cid in ids if cid < SILENT]

        async def read_expected() -> list[int]:
            return [await read_response(reader) for _ in expected]

        assert await asyncio.wait_for(read_expected(), 10) == expected
        assert dispatch.max_concurrent > 1  # requests ran concurrently
        assert sorted(dispatch.started) == sorted(ids)
        writer.close()
        await writer.wait_closed()


@dataclass
class MutingDispatch(FakeDispatch):
    """Mutes the connection for ``mute_ms`` on request 1 (a client over its quota, KIP-219);
    records the event-loop time each request started and when the mute ends."""

    mute_ms: int = 300
    started_at: dict[int, float] = field(default_factory=dict)
    muted_until: float = 0.0

    async def __call__(self, frame: bytes, connection: Connection) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        self.started_at[correlation_id] = asyncio.get_running_loop().time()
        if correlation_id == 1:
            connection.mute(self.mute_ms)
            self.muted_until = connection.muted.until
        return await super().__call__(frame, connection)


async def test_a_muted_connection_starts_its_next_request_when_the_mute_ends() -> None:
    """Request 1 is answered at once; request 2, sent right behind it, starts only after the
    mute (an order of event-loop times, not a speed)."""
    dispatch = MutingDispatch(delays_s=lambda cid: 0)
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        writer.write(request(1))
        await writer.drain()
        assert await asyncio.wait_for(read_response(reader), 5) == 1
        writer.write(request(2))
        await writer.drain()
        assert await asyncio.wait_for(read_response(reader), 5) == 2
        writer.close()
        await writer.wait_closed()
    assert dispatch.started_at[2] >= dispatch.muted_until > dispatch.started_at[1]


def test_a_connection_never_muted_waits_for_nothing() -> None:
    assert Mute().remaining_s(lambda: 5.0) == 0.0
    assert Mute(until=5.0).remaining_s(lambda: 3.5) == 1.5
    assert Mute(until=5.0).remaining_s(lambda: 6.0) == 0.0


@dataclass
class OverlapDispatch(FakeDispatch):
    """Also records which requests were running when each one started."""

    overlapping: dict[int, set[int]] = field(default_factory=dict)

    async def __call__(self, frame: bytes, connection: Connection) -> bytes | None:
        (correlation_id,) = struct.unpack_from(">i", frame, 4)
        self.overlapping[correlation_id] = set(self.running)
        return await super().__call__(frame, connection)


async def test_an_admin_write_runs_after_the_requests_before_it_and_before_those_after() -> None:
    """Kafka processes a connection's requests in order; we run them concurrently except
    admin writes (DeleteRecords here, api key 21): confluent-kafka's AdminClient sends
    ListOffsets right behind DeleteRecords and must read the new log start."""
    dispatch = OverlapDispatch(delays_s=lambda cid: 0.03 if cid in (1, 2, 4) else 0.0)
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        frames = [request(1), request(2), request(3, api_key=21), request(4), request(5)]
        writer.write(b"".join(frames))
        await writer.drain()
        answers = [await asyncio.wait_for(read_response(reader), 5) for _ in range(5)]
        assert answers == [1, 2, 3, 4, 5]
        writer.close()
        await writer.wait_closed()
    assert dispatch.overlapping[2] == {1}  # ordinary requests still run concurrently
    assert dispatch.overlapping[3] == set()  # the admin write waited for 1 and 2
    assert dispatch.overlapping[4] == set()  # and 4 for it
    assert dispatch.overlapping[5] == {4}


async def test_an_enveloped_admin_write_is_ordered_like_the_write_it_carries() -> None:
    """Behind the proxy every request comes inside an Envelope (KIP-590), one broker
    connection per client connection: DeleteRecords and the ListOffsets sent right behind it
    must still run one after the other, the rest concurrently."""
    link = UpstreamLink(principal=b"\x00\x00\x00\x0aUser:alice\x00")
    dispatch = OverlapDispatch(delays_s=lambda cid: 0.03 if cid in (1, 2, 4) else 0.0)
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        kinds = {1: 0, 2: 1, 3: 21, 4: 2, 5: 0}  # Produce, Fetch, DeleteRecords, ListOffsets
        writer.write(b"".join(link.wrap(request(cid, api_key=k)) for cid, k in kinds.items()))
        await writer.drain()
        answers = [await asyncio.wait_for(read_response(reader), 5) for _ in range(5)]
        assert answers == [1, 2, 3, 4, 5]
        writer.close()
        await writer.wait_closed()
    assert dispatch.overlapping[2] == {1}  # forwarded requests still run concurrently
    assert dispatch.overlapping[3] == set()  # the enveloped DeleteRecords waited for 1 and 2
    assert dispatch.overlapping[4] == set()  # and the ListOffsets behind it for it
    assert dispatch.overlapping[5] == {4}


async def test_responses_are_still_sent_after_the_client_half_closes() -> None:
    dispatch = FakeDispatch(delays_s=lambda cid: 0.05 - cid * 0.004)  # later ones finish first
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        writer.write(b"".join(request(cid) for cid in range(10)))
        writer.write_eof()
        responses = [await asyncio.wait_for(read_response(reader), 5) for _ in range(10)]
        assert responses == list(range(10))
        await assert_closed(reader)
        writer.close()


async def test_answers_ready_together_leave_in_one_write_in_request_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush round acks the requests it carried at once: their answers go out in one write
    (one system call), still in request order; a request answered later gets a write of its
    own, and an acks=0 request among them answers nothing."""
    from kafscale.broker.protocol.framing import FrameProtocol

    writes: list[int] = []
    original = FrameProtocol.write_many

    def counting(self: FrameProtocol, data: list[bytes]) -> None:
        writes.append(len(data))
        original(self, data)

    monkeypatch.setattr(FrameProtocol, "write_many", counting)
    ids = [0, 1, SILENT + 2, 3, 4, 5, 6]
    late = 5
    arrived: list[int] = []
    release, release_late = asyncio.Event(), asyncio.Event()

    class TogetherDispatch(FakeDispatch):
        async def __call__(self, frame: bytes, connection: Connection) -> bytes | None:
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            arrived.append(correlation_id)
            if len(arrived) == len(ids):
                release.set()  # every request is in: answer all but the late one at once
            await (release_late if correlation_id == late else release).wait()
            return await super().__call__(frame, connection)

    dispatch = TogetherDispatch(delays_s=lambda cid: 0.0)
    async with serving(dispatch) as server:
        reader, writer = await connect(server)
        writer.write(b"".join(request(cid) for cid in ids))
        await writer.drain()
        first = [await asyncio.wait_for(read_response(reader), 5) for _ in range(4)]
        release_late.set()
        rest = [await asyncio.wait_for(read_response(reader), 5) for _ in range(2)]
        assert first + rest == [0, 1, 3, 4, late, 6]
        assert writes == [4, 2]  # 0, 1, 3, 4 at once; 5 once done, with 6, done before it
        writer.close()
        await writer.wait_closed()


async def test_in_flight_limit_bounds_concurrency_and_keeps_order() -> None:
    dispatch = FakeDispatch()
    async with serving(dispatch, max_in_flight=2) as server:
        reader, writer = await connect(server)
        writer.write(b"".join(request(cid) for cid in range(30)))
        responses = [await asyncio.wait_for(read_response(reader), 5) for _ in range(30)]
        assert responses == list(range(30))
        assert dispatch.max_concurrent <= 2  # "requests processed at once on one connection"
        writer.close()


async def test_oversized_frame_closes_only_that_connection() -> None:
    dispatch = FakeDispatch()
    async with serving(dispatch) as server:
        bystander_reader, bystander = await connect(server)
        reader, writer = await connect(server)
        writer.write(request(1))
        assert await asyncio.wait_for(read_response(reader), 5) == 1
        writer.write(struct.pack(">i", MAX_FRAME + 1) + b"\x00" * 16)  # announced, not sent
        await within(assert_closed(reader))
        assert 0 not in dispatch.started
        bystander.write(request(2))
        assert await asyncio.wait_for(read_response(bystander_reader), 5) == 2
        await round_trip(server, 3)  # and new connections are served
        bystander.close()
        writer.close()


async def test_negative_frame_length_closes_the_connection() -> None:
    async with serving(FakeDispatch()) as server:
        reader, writer = await connect(server)
        writer.write(struct.pack(">i", -5))
        await within(assert_closed(reader))
        writer.close()
        await round_trip(server, 4)


async def test_close_connection_from_dispatch_drops_the_connection() -> None:
    dispatch = FakeDispatch(delays_s=lambda cid: 0.0)
    async with serving(dispatch) as server:
        bystander_reader, bystander = await connect(server)
        reader, writer = await connect(server)
        writer.write(request(1) + request(2) + request(CLOSE) + request(3))
        assert await asyncio.wait_for(read_response(reader), 5) == 1
        assert await asyncio.wait_for(read_response(reader), 5) == 2
        await within(assert_closed(reader))  # nothing for CLOSE or anything after it
        bystander.write(request(5))
        assert await asyncio.wait_for(read_response(bystander_reader), 5) == 5
        await round_trip(server, 6)
        bystander.close()
        writer.close()


async def test_closing_a_connection_leaves_no_request_running() -> None:
    """Every request task has an owner: when the connection ends, requests still queued or
    waiting for a queue slot are cancelled, not left running unowned (STYLE "Async rules")."""
    dispatch = FakeDispatch(delays_s=lambda cid: 0.05 if cid >= CLOSE else 3.0)
    async with serving(dispatch, max_in_flight=1) as server:
        reader, writer = await connect(server)
        writer.write(request(CLOSE) + b"".join(request(cid) for cid in range(1, 6)))
        await within(assert_closed(reader))
        await asyncio.sleep(0.2)
        assert dispatch.running == set(), f"requests still running: {sorted(dispatch.running)}"
        writer.close()


async def test_a_vanished_client_does_not_stop_the_server() -> None:
    dispatch = FakeDispatch(delays_s=lambda cid: 0.3)
    async with serving(dispatch) as server:
        _, writer = await connect(server)
        writer.write(b"".join(request(cid) for cid in range(5)))
        await writer.drain()
        await dispatch.wait_started(5)
        writer.transport.abort()  # the client goes away mid-request
        await round_trip(server, 9)
        await asyncio.sleep(0.5)  # its responses meet a closed socket; nothing breaks
        await round_trip(server, 10)


async def test_close_lets_in_flight_requests_finish_within_the_grace_period() -> None:
    dispatch = FakeDispatch(delays_s=lambda cid: 0.1)
    limits = LimitSettings(max_frame_bytes=MAX_FRAME)
    server = KafkaServer(dispatch, limits, "127.0.0.1", 0)
    await server.start()
    port = server.port
    reader, writer = await connect(server)
    writer.write(request(1))
    await writer.drain()
    await dispatch.wait_started(1)
    closing = asyncio.create_task(server.close(grace_s=0.5))
    assert await asyncio.wait_for(read_response(reader), 5) == 1
    writer.close()
    await asyncio.wait_for(closing, 5)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_client_reaching_a_starting_server_waits_and_is_then_answered() -> None:
    """A broker binds its port, registers it, then accepts: a client that connects in between
    (a proxy or client still routing to a restarted broker's address) must wait for an answer,
    not get an error from a broker that cannot serve yet."""
    dispatch = FakeDispatch(delays_s=lambda cid: 0)
    limits = LimitSettings(max_frame_bytes=MAX_FRAME)
    server = KafkaServer(dispatch, limits, "127.0.0.1", 0)
    await server.start(accepting=False)
    try:
        reader, writer = await connect(server)  # the kernel's backlog takes the connection
        writer.write(request(5))
        await writer.drain()
        response = asyncio.create_task(read_response(reader))
        done, _ = await asyncio.wait([response], timeout=0.3)
        assert not done and dispatch.started == []
        await server.accept()
        assert await asyncio.wait_for(response, 5) == 5
        writer.close()
    finally:
        await server.close(grace_s=1.0)
