"""Fuzz target for the frame reader (``broker/protocol/framing.py``): whatever bytes a peer
sends, the reader never asks for more than the configured maximum, refuses oversized or
negative lengths before reading the body, ends cleanly only at a frame boundary, and reports
truncation (STYLE "Bound everything", DESIGN §4)."""

from __future__ import annotations

import asyncio
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafscale.broker.protocol.framing import FrameTooLarge, read_frame

pytestmark = pytest.mark.unit

MAX_FRAME = 256


class RecordingReader(asyncio.StreamReader):
    """A StreamReader that remembers every ``readexactly`` size asked of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.requested: list[int] = []
        self.feed_data(data)
        self.feed_eof()

    async def readexactly(self, n: int) -> bytes:
        self.requested.append(n)
        return await super().readexactly(n)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


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


def expected_outcome(data: bytes, position: int) -> tuple[str, int]:
    """What the next read_frame call must do at ``position``: (outcome, next position)."""
    remaining = len(data) - position
    if remaining == 0:
        return "eof", position
    if remaining < 4:
        return "truncated", len(data)
    (length,) = struct.unpack_from(">i", data, position)
    if length < 0 or length > MAX_FRAME:
        return "too_large", position + 4
    if remaining - 4 < length:
        return "truncated", len(data)
    return "frame", position + 4 + length


async def read_all(data: bytes) -> None:
    reader = RecordingReader(data)
    position = 0
    while True:
        outcome, next_position = expected_outcome(data, position)
        if outcome == "eof":
            assert await read_frame(reader, MAX_FRAME) is None
            break
        if outcome == "truncated":
            with pytest.raises(asyncio.IncompleteReadError):
                await read_frame(reader, MAX_FRAME)
            break
        if outcome == "too_large":
            with pytest.raises(FrameTooLarge):
                await read_frame(reader, MAX_FRAME)
            assert reader.requested[-1] == 4  # the body was never asked for
            break
        body = await read_frame(reader, MAX_FRAME)
        assert body == data[position + 4 : next_position]
        position = next_position
    assert all(0 <= n <= MAX_FRAME for n in reader.requested)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams)
def test_read_frame_on_any_byte_stream(data: bytes) -> None:
    asyncio.run(read_all(data))


@pytest.mark.parametrize("length", [MAX_FRAME + 1, 2**31 - 1, -1, -(2**31)])
async def test_oversized_and_negative_lengths_are_refused_before_reading(length: int) -> None:
    reader = RecordingReader(struct.pack(">i", length) + b"x" * 10)
    with pytest.raises(FrameTooLarge):
        await read_frame(reader, MAX_FRAME)
    assert reader.requested == [4]


async def test_clean_end_of_stream_is_none() -> None:
    assert await read_frame(RecordingReader(b""), MAX_FRAME) is None
    reader = RecordingReader(frame(b"abc"))
    assert await read_frame(reader, MAX_FRAME) == b"abc"
    assert await read_frame(reader, MAX_FRAME) is None


async def test_frame_of_exactly_the_maximum_and_empty_frames() -> None:
    reader = RecordingReader(frame(b"m" * MAX_FRAME) + frame(b""))
    assert await read_frame(reader, MAX_FRAME) == b"m" * MAX_FRAME
    assert await read_frame(reader, MAX_FRAME) == b""


@pytest.mark.parametrize("data", [b"\x00", b"\x00\x00\x00", frame(b"abcdef")[:-1]])
async def test_truncation_raises_incomplete_read(data: bytes) -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(RecordingReader(data), MAX_FRAME)


async def test_frames_arriving_in_pieces() -> None:
    reader = asyncio.StreamReader()
    data = frame(b"hello") + frame(b"world")

    async def trickle() -> None:
        for i in range(len(data)):
            reader.feed_data(data[i : i + 1])
            await asyncio.sleep(0)
        reader.feed_eof()

    feeder = asyncio.create_task(trickle())
    assert await read_frame(reader, MAX_FRAME) == b"hello"
    assert await read_frame(reader, MAX_FRAME) == b"world"
    assert await read_frame(reader, MAX_FRAME) is None
    await feeder
