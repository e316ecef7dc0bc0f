"""Connections from the proxy to brokers, and the per-client pool of them.

Every client connection gets its own connection to each broker it needs. Brokers answer a
connection's requests in order, so sharing one upstream connection between clients would make a
client's long poll hold up everyone else's acks; with one per client connection, a client waits
only behind its own requests, exactly as it would talking to the broker directly. The proxy
writes a client's requests for a broker in the order the client sent them, which is what keeps
an idempotent producer's batches in sequence.

A request is written synchronously (``send``), and its response arrives on a future matched by
correlation id; a response frame's length is checked before it is read, like a request's.

A connection speaks as its ``UpstreamLink`` says: over TLS (with the proxy's certificate, its
identity on the brokers) or not, logged in with SASL (the proxy's user) or not, and with each
request inside an Envelope (KIP-590) carrying the client's principal and address, or bare. An
Envelope the broker refuses (the proxy is not allowed to forward) fails the request with
:class:`ForwardingRefused`, which no retry helps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.observability.log_limit import ClientEvent, client_log
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.login import LoginFailed, SaslLogin, log_in
from kafscale.broker.proxy.ordering import ProduceOrder
from kafscale.broker.proxy.share_sessions import ClientSessions
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">i")
_CORRELATION = struct.Struct(">i")
_CORRELATION_OFFSET = 4  # after the request header's api key and version


class UpstreamError(ConnectionError):
    """The broker could not be reached, or the connection broke before the answer came."""


class ForwardingRefused(Exception):
    """The broker refused the Envelope (its error code): it does not trust the proxy."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(f"the broker refused the forwarded request: {code.name}")
        self.code = code


ENVELOPE_KEY, ENVELOPE_VERSION = 58, 0
PROXY_CLIENT_ID = "kafscale-proxy"


@dataclass(frozen=True, slots=True)
class UpstreamLink:
    """How one client's requests reach the brokers: TLS or not, enveloped or not."""

    ssl_context: ssl.SSLContext | None = None
    principal: bytes | None = None  # the client's, encoded; None: requests go bare
    client_address: bytes = b""
    login: SaslLogin | None = None  # the proxy's own SASL login to the brokers
    listener: str | None = None  # the brokers' listener to use; None: their main address

    def address(self, broker: BrokerInfo) -> tuple[str, int]:
        if self.listener is None:
            return broker.host, broker.port
        return broker.endpoint(self.listener)

    def wrap(self, frame: bytes) -> bytes:
        """``frame`` (a whole request frame, length prefix included) as this link sends it."""
        if self.principal is None:
            return frame
        body = {
            "request_data": memoryview(frame)[_LENGTH.size :],
            "request_principal": self.principal,
            "client_host_address": self.client_address,
        }
        (correlation_id,) = _CORRELATION.unpack_from(frame, _LENGTH.size + _CORRELATION_OFFSET)
        return codec.encode_request(
            ENVELOPE_KEY, ENVELOPE_VERSION, correlation_id, body, PROXY_CLIENT_ID
        )

    def unwrap(self, body: bytes) -> bytes:
        """The response body inside a broker's answer; raises ForwardingRefused."""
        if self.principal is None:
            return body
        try:
            envelope = codec.decode_response(body, ENVELOPE_KEY, ENVELOPE_VERSION)
        except Exception as exc:  # kio raises its own errors
            raise UpstreamError(f"unreadable Envelope response: {exc}") from exc
        code = ErrorCode(int(envelope.error_code))
        if code != ErrorCode.NONE or envelope.response_data is None:
            raise ForwardingRefused(code)
        return bytes(envelope.response_data)


@dataclass(slots=True)
class UpstreamStats:
    """Proxy-wide figures for ``/status``."""

    open: int = 0
    opened: int = 0
    failed: int = 0
    requests: int = 0
    retries: dict[str, int] = field(default_factory=dict)

    def count_retry(self, reason: str) -> None:
        self.retries[reason] = self.retries.get(reason, 0) + 1


class Upstream:
    """One connection to one broker."""

    def __init__(
        self,
        broker: BrokerInfo,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_frame_bytes: int,
        stats: UpstreamStats,
        link: UpstreamLink = UpstreamLink(),
    ) -> None:
        self.broker = broker
        self._link = link
        self._reader = reader
        self._writer = writer
        self._max_frame_bytes = max_frame_bytes
        self._stats = stats
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[bytes]] = {}
        self._error: UpstreamError | None = None
        self._task = start_task(self._read_responses(), name=f"upstream-{broker.node_id}")
        stats.open += 1
        stats.opened += 1

    @classmethod
    async def connect(
        cls,
        broker: BrokerInfo,
        timeout_s: float,
        max_frame_bytes: int,
        stats: UpstreamStats,
        link: UpstreamLink = UpstreamLink(),
    ) -> Upstream:
        host, port = link.address(broker)
        try:
            async with asyncio.timeout(timeout_s):
                reader, writer = await asyncio.open_connection(host, port, ssl=link.ssl_context)
                if link.login is not None:
                    try:
                        await log_in(reader, writer, link.login, max_frame_bytes)
                    except BaseException:
                        writer.close()
                        raise
        except LoginFailed as exc:
            stats.failed += 1
            # Once per client connection while the proxy's credential is wrong: limited.
            client_log(
                log, logging.ERROR, ClientEvent.UPSTREAM_FAILED, f"broker {broker.node_id}",
                "cannot log in to broker %d at %s:%d: %s", broker.node_id, host, port, exc,
            )  # fmt: skip
            raise UpstreamError(f"broker {broker.node_id} refused the proxy's login") from exc
        except (OSError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            stats.failed += 1
            raise UpstreamError(
                f"cannot connect to broker {broker.node_id} at {host}:{port}: {exc}"
            ) from exc
        return cls(broker, reader, writer, max_frame_bytes, stats, link)

    @property
    def usable(self) -> bool:
        return self._error is None and not self._writer.is_closing()

    def send(
        self, frame: bytes | memoryview, expect_response: bool = True
    ) -> asyncio.Future[bytes]:
        """Write ``frame`` (a request without its length prefix; its correlation id is replaced
        by this connection's own) and return the future of its response body. With
        ``expect_response`` false (acks=0) the future is already done with ``b""``."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if self._error is not None:
            future.set_exception(self._error)
            return future
        correlation_id = self._next_id
        self._next_id = (self._next_id + 1) & 0x7FFFFFFF
        header = bytearray(_LENGTH.pack(len(frame)))
        header += frame[:_CORRELATION_OFFSET]
        header += _CORRELATION.pack(correlation_id)
        if expect_response:
            self._pending[correlation_id] = future
        else:
            future.set_result(b"")
        rest = frame[_CORRELATION_OFFSET + _CORRELATION.size :]
        if self._link.principal is None:
            self._writer.write(bytes(header))
            self._writer.write(rest)
        else:
            self._writer.write(self._link.wrap(bytes(header) + bytes(rest)))
        self._stats.requests += 1
        return future

    async def drain(self) -> None:
        """Wait while the socket's write buffer is full (a slow broker slows its clients)."""
        try:
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._fail(UpstreamError(f"broker {self.broker.node_id}: {exc}"))

    async def close(self) -> None:
        self._fail(UpstreamError(f"connection to broker {self.broker.node_id} closed"))
        await cancel_and_wait(self._task)
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def _read_responses(self) -> None:
        try:
            while True:
                (length,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
                if length < _CORRELATION.size or length > self._max_frame_bytes:
                    raise UpstreamError(f"response frame of {length} bytes from the broker")
                body = await self._reader.readexactly(length)
                (correlation_id,) = _CORRELATION.unpack_from(body, 0)
                # Popped once answered: a failure meanwhile fails it with the rest (``_fail``).
                future = self._pending.get(correlation_id)
                if future is not None and not future.done():
                    try:
                        future.set_result(self._link.unwrap(body))
                    except ForwardingRefused as exc:
                        client_log(
                            log, logging.ERROR, ClientEvent.FORWARDING_REFUSED,
                            f"broker {self.broker.node_id}",
                            "broker %d: %s", self.broker.node_id, exc,
                        )  # fmt: skip
                        future.set_exception(exc)
                self._pending.pop(correlation_id, None)
        except (asyncio.IncompleteReadError, OSError, UpstreamError) as exc:
            error = exc if isinstance(exc, UpstreamError) else None
            self._fail(error or UpstreamError(f"broker {self.broker.node_id} dropped: {exc!r}"))
        except Exception as exc:
            # Unexpected (a bug): the requests waiting on this connection fail, so their
            # clients' retries go on, instead of waiting for an answer nobody reads any more;
            # raised on, the task's end is logged (``start_task``).
            self._fail(UpstreamError(f"reading from broker {self.broker.node_id} failed: {exc!r}"))
            raise

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
            self._stats.open -= 1
            self._writer.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


class UpstreamPool:
    """One client connection's connections to brokers, opened on first use."""

    def __init__(
        self,
        timeout_s: float,
        max_frame_bytes: int,
        stats: UpstreamStats,
        link: Callable[[], UpstreamLink] = UpstreamLink,
    ) -> None:
        # Asked when a connection opens, not when the pool is made: the pool exists from the
        # client's first request, its principal only once it has logged in.
        self._link = link
        self._timeout_s = timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._stats = stats
        self._connections: dict[int, Upstream] = {}
        # Held while a request's parts are written: a client's requests reach each broker in
        # the order the client sent them, also when connecting takes a while.
        self.send_lock = asyncio.Lock()
        # This client's produce requests per partition, kept in the client's order.
        self.produce_order = ProduceOrder()
        # This client's share sessions (KIP-932), mapped onto one per owning broker; they end
        # with the connection (closing the upstream connections ends the brokers' sessions).
        self.share_sessions = ClientSessions()

    async def get(self, broker: BrokerInfo) -> Upstream:
        current = self._connections.get(broker.node_id)
        if current is not None and current.usable and current.broker == broker:
            return current
        if current is not None:
            await current.close()
        upstream = await Upstream.connect(
            broker, self._timeout_s, self._max_frame_bytes, self._stats, self._link()
        )
        self._connections[broker.node_id] = upstream
        return upstream

    async def close(self) -> None:
        connections, self._connections = self._connections, {}
        await asyncio.gather(*(c.close() for c in connections.values()), return_exceptions=True)
