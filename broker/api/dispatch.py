"""From a request frame to a response frame: version checks, decoding, the handler, errors.

A request whose header parses but whose body does not gets an error response carrying its
correlation id; a frame without a readable header closes the connection. An unexpected error
inside a handler is logged with its traceback and answered with UNKNOWN_SERVER_ERROR: the
connection and the broker live on.

An API or version that is not served is answered with UNSUPPORTED_VERSION where the response
has a top-level error code to carry it (DescribeQuorum); where it has none (StreamsGroupDescribe,
ReadShareGroupStateSummary), the connection is closed, as Kafka closes it for an API it does not
enable.
Never an empty success: a client would take that as done.

An Envelope (API 58, from the proxy) goes to ``api/envelope.py``, which runs the request it
carries through this dispatcher as the principal it names.

On a SASL listener, a connection that has not authenticated yet may send ApiVersions,
SaslHandshake and SaslAuthenticate only; any other request closes it (as Kafka does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafscale.broker.api.error_bodies import error_body_of
from kafscale.broker.api.served import SERVED_APIS, ServedApi, api_versions_body
from kafscale.broker.observability.log_limit import ClientEvent, client_log, host_of
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, code_for
from kafscale.broker.protocol.framing import Frame
from kafscale.broker.quotas.enforcement import PRODUCE as PRODUCE_KEY
from kafscale.broker.quotas.enforcement import QUOTA_KEYS, fetched_bytes
from kafscale.broker.security.forwarding import ENVELOPE_KEY
from kafscale.broker.security.sasl import ALLOWED_BEFORE_AUTHENTICATION
from kafscale.broker.server import CloseConnection, Connection

if TYPE_CHECKING:
    from kafscale.broker.app import Broker

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18


@dataclass(frozen=True, slots=True)
class RequestContext:
    header: codec.RequestHeader
    broker: Broker
    connection: Connection

    @property
    def api_version(self) -> int:
        return self.header.api_version


Body = dict[str, Any]
Handler = Callable[[Any, RequestContext], Awaitable[Body | None]]


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """A served API (``api/served.py``: key, name, versions) with the broker's handler."""

    api: ServedApi
    handler: Handler

    @property
    def key(self) -> int:
        return self.api.key

    @property
    def name(self) -> str:
        return self.api.name

    @property
    def min_version(self) -> int:
        return self.api.min_version

    @property
    def max_version(self) -> int:
        return self.api.max_version

    @property
    def advertised_range(self) -> tuple[int, int]:
        return self.api.advertised_range

    def supports(self, version: int) -> bool:
        return self.api.supports(version)


EnvelopeHandler = Callable[
    [Frame, Connection, "Broker", Callable[[Frame, Connection], Awaitable[bytes | None]]],
    Awaitable[bytes | None],
]
"""What runs an Envelope (``api/envelope.py``): the dispatcher itself runs the inner request."""


class Dispatcher:
    def __init__(
        self,
        table: Mapping[int, ApiSpec],
        broker: Broker,
        envelope: EnvelopeHandler | None = None,
    ) -> None:
        self._table = table
        self._broker = broker
        self._envelope = envelope

    async def __call__(self, frame: Frame, connection: Connection) -> bytes | None:
        peer = connection.peer
        api_key, api_version, correlation_id = admit(frame, connection)
        if api_key == ENVELOPE_KEY and self._envelope is not None:
            return await self._envelope(frame, connection, self._broker, self)
        spec = self._table.get(api_key)
        if spec is None or not spec.supports(api_version):
            api = spec.api if spec is not None else None
            return encode_unsupported(SERVED_APIS, api, api_key, api_version, correlation_id, peer)
        schema = codec.request_schema(api_key, api_version)
        try:
            request = codec.decode_request(frame, schema)
        except codec.DecodeError as exc:
            METRICS.malformed_requests += 1
            client_log(
                log, logging.WARNING, ClientEvent.MALFORMED_REQUEST, host_of(peer),
                "bad %s v%d from %s: %s", spec.name, api_version, peer, exc,
            )  # fmt: skip
            return encode_error(
                spec.api, None, api_version, correlation_id, ErrorCode.INVALID_REQUEST
            )
        request_bytes = len(frame)
        # The decoded request holds its own copy of the records; without this the frame (up to
        # a MiB per produce) would stay alive until the ack.
        del frame
        context = RequestContext(request.header, self._broker, connection)
        started = time.perf_counter()
        try:
            body = await spec.handler(request.body, context)
        except KafkaError as exc:
            METRICS.request(spec.name, time.perf_counter() - started, failed=True)
            return encode_error(spec.api, request.body, api_version, correlation_id, exc.code)
        except Exception as exc:
            client_log(
                log, logging.ERROR, ClientEvent.INTERNAL_ERROR, host_of(peer),
                "%s v%d from %s failed", spec.name, api_version, peer, exc_info=True,
            )  # fmt: skip
            METRICS.request(spec.name, time.perf_counter() - started, failed=True)
            return encode_error(spec.api, request.body, api_version, correlation_id, code_for(exc))
        METRICS.request(spec.name, time.perf_counter() - started, failed=False)
        if api_key in QUOTA_KEYS and self._broker.quota_enforcer.enforcing:
            body = self._throttle(api_key, request_bytes, body, context)
        if body is None:
            return None
        return codec.encode_response(api_key, api_version, correlation_id, body)

    def _throttle(
        self, api_key: int, request_bytes: int, body: Body | None, context: RequestContext
    ) -> Body | None:
        """Charge a Produce's request bytes or a Fetch's record bytes to the client's quota;
        over it, the answer carries the throttle time and the connection is muted for it."""
        nbytes = request_bytes if api_key == PRODUCE_KEY else fetched_bytes(body)
        connection = context.connection
        throttle_ms = self._broker.quota_enforcer.charge(
            api_key, connection.principal, context.header.client_id, nbytes
        )
        if not throttle_ms:
            return body
        connection.mute(throttle_ms)
        if body is None:  # acks=0: nothing to tell, the mute alone slows the client
            return None
        earlier = codec.millis(body.get("throttle_time", 0))
        return {**body, "throttle_time": max(throttle_ms, earlier)}


def admit(frame: Frame, connection: Connection) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a request the connection may send; a frame without
    a readable header, or a request other than ApiVersions, SaslHandshake and SaslAuthenticate
    before the SASL login, closes the connection (Kafka's authenticator closes it too,
    IllegalSaslStateException). The broker's and the proxy's rule: one function."""
    try:
        api_key, api_version, correlation_id = codec.peek_header(frame)
    except codec.DecodeError as exc:
        METRICS.malformed_requests += 1
        raise CloseConnection(str(exc)) from exc
    sasl = connection.sasl
    if sasl and not sasl.authenticated and api_key not in ALLOWED_BEFORE_AUTHENTICATION:
        raise CloseConnection(f"api {api_key} before SASL authentication")
    return api_key, api_version, correlation_id


def encode_unsupported(
    served: Mapping[int, ServedApi],
    spec: ServedApi | None,
    api_key: int,
    api_version: int,
    correlation_id: int,
    peer: str,
) -> bytes:
    if api_key == API_VERSIONS_KEY:
        # KIP-511: answer with v0 so that any client can read the supported range.
        body = api_versions_body(served, ErrorCode.UNSUPPORTED_VERSION)
        return codec.encode_response(API_VERSIONS_KEY, 0, correlation_id, body)
    if spec is not None and spec.advertised_range[0] <= api_version < spec.min_version:
        client_log(
            log, logging.WARNING, ClientEvent.UNSUPPORTED_REQUEST, host_of(peer),
            "%s v%d from %s is advertised but not served (only v%d+); closing connection",
            spec.name, api_version, peer, spec.min_version,
        )  # fmt: skip
    else:
        client_log(
            log, logging.WARNING, ClientEvent.UNSUPPORTED_REQUEST, host_of(peer),
            "api %d v%d from %s is not served", api_key, api_version, peer,
        )  # fmt: skip
    if not codec.has_error_code(api_key, api_version):
        raise CloseConnection(f"api {api_key} v{api_version} is not served")
    return codec.encode_response(
        api_key, api_version, correlation_id, {"error_code": ErrorCode.UNSUPPORTED_VERSION}
    )


def encode_error(
    spec: ServedApi,
    request: Any,
    api_version: int,
    correlation_id: int,
    code: ErrorCode,
) -> bytes:
    try:
        if request is not None:
            body = error_body_of(spec.key)(request, code)
        else:  # the body did not parse: nothing to echo, only a top-level code if any
            body = {"error_code": code} if codec.has_error_code(spec.key, api_version) else {}
        return codec.encode_response(spec.key, api_version, correlation_id, body)
    except Exception as exc:
        # The request decoded but cannot even be echoed in an error answer: no response
        # the client could match is possible, so end the connection (not the broker).
        raise CloseConnection(f"cannot answer {spec.name} v{api_version}: {exc}") from exc
