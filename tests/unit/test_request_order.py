"""Which requests a connection runs alone (``protocol.request_order``): admin writes, and an
Envelope (KIP-590) exactly when the request it carries is one, as the proxy wraps them."""

from __future__ import annotations

import struct

import pytest

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.request_order import (
    ORDERED_API_KEYS,
    enveloped_api_key,
    runs_alone,
)
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.security.forwarding import ENVELOPE_KEY

pytestmark = pytest.mark.unit

PRODUCE, FETCH, LIST_OFFSETS, DELETE_RECORDS, CREATE_TOPICS, OFFSET_DELETE = 0, 1, 2, 21, 19, 47
ALICE = b"\x00\x00\x00\x0aUser:alice\x00"  # a serialized principal, as the proxy sends it


def request(api_key: int, correlation_id: int = 1, client_id: bytes | None = b"app") -> bytes:
    """A request frame with its length prefix (header v1: the client id is an int16 string)."""
    client = struct.pack(">h", -1) if client_id is None else struct.pack(">h", len(client_id))
    body = struct.pack(">hhi", api_key, 0, correlation_id) + client + (client_id or b"") + b"body"
    return struct.pack(">i", len(body)) + body


def enveloped(api_key: int, client_id: bytes | None = b"app") -> bytes:
    """The proxy's Envelope around a request, without the length prefix (as frames arrive)."""
    link = UpstreamLink(principal=ALICE, client_address=bytes([10, 0, 0, 7]))
    return link.wrap(request(api_key, client_id=client_id))[4:]


@pytest.mark.parametrize("api_key", sorted(ORDERED_API_KEYS))
def test_an_envelope_carrying_an_admin_write_runs_alone(api_key: int) -> None:
    assert runs_alone(request(api_key)[4:])
    assert enveloped_api_key(enveloped(api_key)) == api_key
    assert runs_alone(enveloped(api_key))


@pytest.mark.parametrize("api_key", [PRODUCE, FETCH, LIST_OFFSETS, 8, 12])
def test_an_envelope_carrying_anything_else_stays_concurrent(api_key: int) -> None:
    assert not runs_alone(request(api_key)[4:])
    assert not runs_alone(enveloped(api_key))


def test_the_inner_key_is_found_past_any_client_id_and_header_tagged_fields() -> None:
    long_client = b"c" * 300  # a two-byte varint would follow a longer request_data
    assert enveloped_api_key(enveloped(DELETE_RECORDS, client_id=long_client)) == DELETE_RECORDS
    assert enveloped_api_key(enveloped(CREATE_TOPICS, client_id=None)) == CREATE_TOPICS
    # An Envelope whose header carries a tagged field (tag 5, three bytes) is read past it.
    frame = bytearray(enveloped(OFFSET_DELETE))
    client_end = 8 + 2 + int.from_bytes(frame[8:10], "big")
    assert frame[client_end] == 0  # no tagged fields in the proxy's header
    frame[client_end : client_end + 1] = bytes([1, 5, 3]) + b"abc"
    assert enveloped_api_key(bytes(frame)) == OFFSET_DELETE
    assert runs_alone(bytes(frame))


def test_an_unreadable_envelope_is_not_held_for() -> None:
    """Its handler answers INVALID_REQUEST; reading it here must not fail on the way."""
    header = struct.pack(">hhi", ENVELOPE_KEY, 0, 1)
    for frame in (
        header,  # no client id
        header + struct.pack(">h", 50) + b"short",  # client id past the end
        header + struct.pack(">h", -1) + b"\x00",  # no request_data
        header + struct.pack(">h", -1) + b"\x00\x00",  # request_data null
        header + struct.pack(">h", -1) + b"\x00\x02\x00",  # one byte: no api key
        header + struct.pack(">h", -1) + b"\x00" + b"\xff" * 6,  # varint too long
        header + struct.pack(">h", -1) + b"\x01\x05\x7f",  # tagged field past the end
    ):
        assert enveloped_api_key(frame) is None, frame
        assert not runs_alone(frame)


def test_the_proxy_envelope_is_what_the_broker_decodes() -> None:
    """The reading above agrees with the codec the Envelope handler uses."""
    frame = enveloped(DELETE_RECORDS)
    decoded = codec.decode_request(frame, codec.request_schema(ENVELOPE_KEY, 0))
    inner_key, _, _ = codec.peek_header(decoded.body.request_data)
    assert inner_key == enveloped_api_key(frame) == DELETE_RECORDS
