"""A proxy's upstream reader that ends fails every request waiting on it, the one it was
reading the answer to included, and an unexpected end says so in the log.

The reader task of a proxy-to-broker connection handled a dropped connection and a bad frame,
but anything else ended it silently (a bare ``asyncio.create_task``), and the request whose
answer it was reading had already been taken off the waiting list: an Envelope answer that
does not decode left that request waiting for good. A real loopback server plays the broker.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

import pytest

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.proxy.upstream import Upstream, UpstreamError, UpstreamLink, UpstreamStats

_LENGTH = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class _BuggyLink(UpstreamLink):
    def unwrap(self, body: bytes) -> bytes:
        raise RuntimeError("a bug while reading an answer")


async def _answer_every_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A broker that answers each request with its correlation id and two bytes that are no
    response body of any API."""
    try:
        while True:
            (length,) = _LENGTH.unpack(await reader.readexactly(4))
            frame = await reader.readexactly(length)
            writer.write(_LENGTH.pack(6) + frame[4:8] + b"\xff\xff")  # id after key, version
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


_API_VERSIONS_V0 = struct.pack(">hhi", 18, 0, 0) + struct.pack(">h", 1) + b"t"


async def test_a_request_whose_envelope_answer_does_not_decode_fails_instead_of_waiting() -> None:
    server = await asyncio.start_server(_answer_every_request, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    broker = BrokerInfo(node_id=7, host="127.0.0.1", port=port)
    link = UpstreamLink(principal=b"User:alice")  # requests go inside an Envelope
    upstream = await Upstream.connect(broker, 10.0, 1 << 20, UpstreamStats(), link)
    try:
        answer = upstream.send(_API_VERSIONS_V0)
        with pytest.raises(UpstreamError, match="unreadable Envelope response"):
            await asyncio.wait_for(answer, timeout=30)  # a bound on a hang, not a speed
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()


async def test_an_unexpected_reader_error_fails_the_waiting_requests_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = await asyncio.start_server(_answer_every_request, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    broker = BrokerInfo(node_id=7, host="127.0.0.1", port=port)
    upstream = await Upstream.connect(broker, 10.0, 1 << 20, UpstreamStats(), _BuggyLink())
    try:
        answer = upstream.send(_API_VERSIONS_V0)
        with pytest.raises(UpstreamError, match="reading from broker 7 failed"):
            await asyncio.wait_for(answer, timeout=30)  # a bound on a hang, not a speed
        assert not upstream.usable
        for _ in range(100):  # the done callback runs once the task has ended
            if any("background task upstream-7 ended" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.01)
        assert any("background task upstream-7 ended" in r.getMessage() for r in caplog.records)
    finally:
        await upstream.close()
        server.close()
        await server.wait_closed()
