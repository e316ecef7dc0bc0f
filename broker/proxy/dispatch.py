"""From a client's request frame to the proxy's response frame.

The same rules as the broker's dispatcher (``broker/api/dispatch.py``), with the APIs and
versions the brokers serve (``broker/api/served.py``) and their error bodies
(``broker/api/error_bodies.py``), never the brokers' handlers: an unsupported version gets
UNSUPPORTED_VERSION (ApiVersions falls back to v0), a body that does not parse gets
INVALID_REQUEST with its correlation id (the broker's request guard checks it before anything
is allocated), a frame without a readable header closes the connection. A broker that cannot
be reached in time is answered as the broker answers a lost lease; an unexpected error is
logged and answered UNKNOWN_SERVER_ERROR, and the proxy lives on.

On a SASL listener the broker's rule holds here too: before the login only ApiVersions,
SaslHandshake and SaslAuthenticate, anything else closes the connection. A request a broker
would not take from the proxy (its Envelope refused) is answered CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable

from kafscale.broker.api.dispatch import admit, encode_error, encode_unsupported
from kafscale.broker.observability.log_limit import ClientEvent, client_log, host_of
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.protocol.framing import Frame
from kafscale.broker.proxy.answers import PROXY_TABLE
from kafscale.broker.proxy.forward import Call
from kafscale.broker.proxy.handlers import HANDLERS, ProxyContext, ProxyRequest, Raw
from kafscale.broker.proxy.upstream import ForwardingRefused, UpstreamError, UpstreamPool
from kafscale.broker.server import Connection

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">i")


class ProxyDispatcher:
    def __init__(
        self,
        context: Callable[[], ProxyContext],
        pool_of: Callable[[Connection], UpstreamPool],
    ) -> None:
        self._context = context
        self._pool_of = pool_of

    async def __call__(self, frame: Frame, connection: Connection) -> bytes | None:
        api_key, api_version, correlation_id = admit(frame, connection)
        spec = PROXY_TABLE.get(api_key)
        handler = HANDLERS.get(api_key)
        if spec is None or handler is None or not spec.supports(api_version):
            return encode_unsupported(
                PROXY_TABLE, spec, api_key, api_version, correlation_id, connection.peer
            )
        try:
            decoded = codec.decode_request(frame, codec.request_schema(api_key, api_version))
        except codec.DecodeError as exc:
            METRICS.malformed_requests += 1
            client_log(
                log, logging.WARNING, ClientEvent.MALFORMED_REQUEST, host_of(connection.peer),
                "bad %s v%d from %s: %s", spec.name, api_version, connection.peer, exc,
            )  # fmt: skip
            return encode_error(spec, None, api_version, correlation_id, ErrorCode.INVALID_REQUEST)
        call = Call(api_key, api_version, decoded.header.client_id)
        pool = self._pool_of(connection)
        request = ProxyRequest(call, decoded.body, frame, pool, self._context(), connection)
        started = time.perf_counter()
        try:
            answer = await handler(request)
        except UpstreamError as exc:
            METRICS.request(spec.name, time.perf_counter() - started, failed=True)
            client_log(
                log, logging.WARNING, ClientEvent.UPSTREAM_FAILED, host_of(connection.peer),
                "%s v%d from %s: %s", spec.name, api_version, connection.peer, exc,
            )  # fmt: skip
            code = (
                ErrorCode.NOT_COORDINATOR if api_key in _GROUP_KEYS else ErrorCode.REQUEST_TIMED_OUT
            )
            return encode_error(spec, decoded.body, api_version, correlation_id, code)
        except ForwardingRefused as exc:
            METRICS.request(spec.name, time.perf_counter() - started, failed=True)
            code = (
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                if exc.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                else ErrorCode.UNKNOWN_SERVER_ERROR
            )
            return encode_error(spec, decoded.body, api_version, correlation_id, code)
        except Exception:
            METRICS.request(spec.name, time.perf_counter() - started, failed=True)
            client_log(
                log, logging.ERROR, ClientEvent.INTERNAL_ERROR, host_of(connection.peer),
                "%s v%d from %s failed", spec.name, api_version, connection.peer,
                exc_info=True,
            )  # fmt: skip
            return encode_error(
                spec, decoded.body, api_version, correlation_id, ErrorCode.UNKNOWN_SERVER_ERROR
            )
        METRICS.request(spec.name, time.perf_counter() - started, failed=False)
        if answer is None:
            return None
        if isinstance(answer, Raw):
            return _with_correlation_id(answer.body, correlation_id)
        return codec.encode_response(api_key, api_version, correlation_id, answer)


_GROUP_KEYS = frozenset({8, 9, 11, 12, 13, 14, 15, 42, 47, 76})


def _with_correlation_id(body: bytes, correlation_id: int) -> bytes:
    """A broker's response body as the client's response frame."""
    return _LENGTH.pack(len(body)) + _LENGTH.pack(correlation_id) + body[_LENGTH.size :]
