"""Length-prefixed frames: the size is checked before a byte of the body is read."""

from __future__ import annotations

import asyncio
import struct

_LENGTH = struct.Struct(">i")


class FrameTooLarge(Exception):
    """The peer announced a frame larger than the configured maximum (or a negative one)."""


async def read_frame(reader: asyncio.StreamReader, max_frame_bytes: int) -> bytes | None:
    """The next frame's bytes, or None on a clean end of stream before a new frame."""
    try:
        prefix = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    (length,) = _LENGTH.unpack(prefix)
    if length < 0 or length > max_frame_bytes:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {max_frame_bytes}")
    return await reader.readexactly(length)
