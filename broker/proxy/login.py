"""The proxy logging in to a broker's SASL listener, right after connecting.

SaslHandshake v1 names the mechanism; SaslAuthenticate v2 carries PLAIN's one message, or
SCRAM's two (the server's final signature is checked). Any refusal is a :class:`LoginFailed`
with the broker's message: the proxy's credential is wrong or the broker does not offer the
mechanism, a configuration error that retrying does not mend, logged by the caller.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.sasl_client import ScramClient, plain_message
from kafscale.broker.security.scram import AuthenticationFailed, ScramMechanism

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
_LENGTH = struct.Struct(">i")
_CLIENT_ID = "kafscale-proxy"


class LoginFailed(Exception):
    """The broker refused the proxy's SASL login."""


@dataclass(frozen=True, slots=True)
class SaslLogin:
    mechanism: str
    username: str
    password: str
    token_auth: bool = False  # SCRAM with a delegation token (tests log in with one)


async def log_in(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    login: SaslLogin,
    max_frame_bytes: int,
) -> None:
    """Authenticate this fresh connection; raises LoginFailed (or OSError on the socket)."""
    call = _Calls(reader, writer, max_frame_bytes)
    handshake = await call(SASL_HANDSHAKE, 1, {"mechanism": login.mechanism})
    if int(handshake.error_code) != ErrorCode.NONE:
        raise LoginFailed(
            f"the broker does not offer SASL {login.mechanism} "
            f"(it offers {', '.join(handshake.mechanisms) or 'none'})"
        )
    scram = ScramMechanism.from_sasl_name(login.mechanism)
    if scram is None:
        await _authenticate(call, plain_message(login.username, login.password))
        return
    client = ScramClient(scram, login.username, login.password, token_auth=login.token_auth)
    server_first = await _authenticate(call, client.first_message())
    try:
        final = client.final_message(server_first)
        client.check_final(await _authenticate(call, final))
    except AuthenticationFailed as exc:
        raise LoginFailed(str(exc)) from exc


async def _authenticate(call: _Calls, message: bytes) -> bytes:
    answer = await call(SASL_AUTHENTICATE, 2, {"auth_bytes": message})
    if int(answer.error_code) != ErrorCode.NONE:
        raise LoginFailed(answer.error_message or ErrorCode(int(answer.error_code)).name)
    return bytes(answer.auth_bytes)


class _Calls:
    """Requests in turn on the connection before its reader task exists."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_frame_bytes: int
    ) -> None:
        self._reader, self._writer, self._max = reader, writer, max_frame_bytes
        self._next_id = 0

    async def __call__(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self._next_id += 1
        self._writer.write(codec.encode_request(api_key, version, self._next_id, body, _CLIENT_ID))
        await self._writer.drain()
        (length,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
        if not 4 <= length <= self._max:
            raise LoginFailed(f"answer of {length} bytes to a SASL request")
        try:
            return codec.decode_response(await self._reader.readexactly(length), api_key, version)
        except (asyncio.IncompleteReadError, OSError):
            raise
        except Exception as exc:  # kio raises its own errors
            raise LoginFailed(f"unreadable answer to a SASL request: {exc}") from exc
