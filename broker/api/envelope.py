"""Envelope (KIP-590, API 58): a request forwarded by the proxy on behalf of its client.

The proxy authenticated the client; the broker authenticated the proxy. The broker runs the
enveloped request as the principal it carries, from the client's address, so every ACL check
(and the group member's client host) is the client's, and answers inside an Envelope response.
It trusts the carried principal only when the connection's own principal may ``CLUSTER_ACTION``
the cluster (a super user may) and it did not log in with a delegation token: anyone else gets
CLUSTER_AUTHORIZATION_FAILED and nothing runs.
An Envelope whose principal or address cannot be read, or that carries a login or another
Envelope, gets INVALID_REQUEST. With authorization off, principals decide nothing and every
Envelope is run. Not advertised in ApiVersions: only the proxy sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.observability.log_limit import ClientEvent, client_log, host_of
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.protocol.framing import Frame
from kafscale.broker.security.forwarding import ENVELOPE_KEY, NOT_IN_ENVELOPE, address_text
from kafscale.broker.server import CloseConnection, Connection

if TYPE_CHECKING:
    from kafscale.broker.app import Broker

log = logging.getLogger(__name__)

ENVELOPE_VERSION = 0
Dispatch = Callable[[Frame, Connection], Awaitable[bytes | None]]


async def handle_envelope(
    frame: Frame, connection: Connection, broker: Broker, dispatch: Dispatch
) -> bytes | None:
    """The response frame to an Envelope (None when the inner request gets no answer:
    a produce with acks=0)."""
    _, api_version, correlation_id = codec.peek_header(frame)
    if api_version != ENVELOPE_VERSION:
        raise CloseConnection(f"Envelope v{api_version} is not served")
    try:
        request = codec.decode_request(frame, codec.request_schema(ENVELOPE_KEY, api_version))
    except codec.DecodeError as exc:
        METRICS.malformed_requests += 1
        client_log(
            log, logging.WARNING, ClientEvent.MALFORMED_REQUEST, host_of(connection.peer),
            "bad Envelope from %s: %s", connection.peer, exc,
        )  # fmt: skip
        return _answer(correlation_id, ErrorCode.INVALID_REQUEST)
    ctx = RequestContext(request.header, broker, connection)
    if connection.token_authenticated:
        # A delegation token is no proxy's login: forwarding as any principal, unmarked,
        # would let a token of a CLUSTER_ACTION principal act as anyone and mint new tokens.
        client_log(
            log, logging.WARNING, ClientEvent.FORWARDING_REFUSED, host_of(connection.peer),
            "%s logged in with a delegation token and may not forward requests", connection.peer,
        )  # fmt: skip
        return _answer(correlation_id, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    if not access.allowed_on_cluster(ctx, Operation.CLUSTER_ACTION):
        client_log(
            log, logging.WARNING, ClientEvent.FORWARDING_REFUSED, host_of(connection.peer),
            "%s (%s) may not forward requests (needs CLUSTER_ACTION on the cluster)",
            connection.peer, connection.principal,
        )  # fmt: skip
        return _answer(correlation_id, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    body = request.body
    try:
        principal, by_token = codec.decode_forwarded_principal(body.request_principal or b"")
        host = address_text(body.client_host_address)
        inner_key, _, _ = codec.peek_header(body.request_data)
    except (codec.DecodeError, ValueError) as exc:
        METRICS.malformed_requests += 1
        client_log(
            log, logging.WARNING, ClientEvent.MALFORMED_REQUEST, host_of(connection.peer),
            "unreadable Envelope from %s: %s", connection.peer, exc,
        )  # fmt: skip
        return _answer(correlation_id, ErrorCode.INVALID_REQUEST)
    if inner_key in NOT_IN_ENVELOPE:
        return _answer(correlation_id, ErrorCode.INVALID_REQUEST)
    forwarded = forwarded_connection(connection, principal, host, by_token)
    response = await dispatch(body.request_data, forwarded)
    if response is None:
        return None
    return codec.encode_response(
        ENVELOPE_KEY,
        ENVELOPE_VERSION,
        correlation_id,
        {"response_data": memoryview(response)[4:], "error_code": ErrorCode.NONE},
    )


def forwarded_connection(
    outer: Connection, principal: str, host: str, token_authenticated: bool = False
) -> Connection:
    """The connection an enveloped request runs on: the client's principal and address, the
    proxy connection's listener and append lock (the proxy keeps one broker connection per
    client connection, so appends stay in the client's order), and its mute: a client over
    its quota holds back this proxy connection, which is that client's own. A client that
    logged in to the proxy with a delegation token stays token-authenticated here."""
    return Connection(
        f"{host}:0",
        principal=principal,
        token_authenticated=token_authenticated,
        listener=outer.listener,
        append_lock=outer.append_lock,
        muted=outer.muted,
        carrier=outer,
    )


def _answer(correlation_id: int, code: ErrorCode) -> bytes:
    return codec.encode_response(
        ENVELOPE_KEY, ENVELOPE_VERSION, correlation_id, {"response_data": None, "error_code": code}
    )
