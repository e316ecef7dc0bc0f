"""The Kafka listener and the per-connection pipeline.

Clients pipeline requests and match responses strictly in order (aiokafka drops the connection
on the first out-of-order reply), while a produce waits for an object-store upload. So each
connection has a reader that starts every request as its own task and a writer that awaits those
tasks in arrival order: requests run concurrently, responses leave in order. acks=0 produces
resolve to ``None`` and send nothing. The queue between them bounds requests in flight.
Frames come from :class:`~kafscale.broker.protocol.framing.FrameProtocol`, which stops reading
the socket while the reader is held up by those bounds.

What a hostile or careless peer can hold is bounded broker-wide as well: large request frames
take their memory from one ``RequestMemory`` budget (given back once the request is answered),
a connection with nothing received, sent or in flight for ``connections_max_idle_ms`` is
closed, and one client address may hold at most ``max_connections_per_address`` connections.
So are the log lines such a peer causes (``observability/log_limit``): the first few of each
kind per client host, then a count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.buffer_pool import BufferPool
from kafscale.broker.config import LimitSettings
from kafscale.broker.observability.log_limit import (
    LIMITERS,
    ClientEvent,
    client_log,
    host_of,
    summarise_periodically,
)
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.framing import (
    Frame,
    FrameProtocol,
    FrameTooLarge,
    frame_buffer_pool,
)
from kafscale.broker.protocol.request_memory import RequestMemory
from kafscale.broker.protocol.request_order import runs_alone
from kafscale.broker.security.listeners import (
    DEFAULT_LISTENER_NAME,
    Listener,
    SecurityProtocol,
)
from kafscale.broker.security.sasl import SaslSession
from kafscale.broker.security.tls import principal_from_certificate
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)


ANONYMOUS = "User:ANONYMOUS"


@dataclass(slots=True)
class Connection:
    """Per-connection state handlers may need.

    ``append_lock`` keeps produce appends in arrival order even when one request waits for a
    lease: idempotent producers pipeline up to five batches per partition and expect them to be
    appended in the order sent. ``principal`` is who the connection authenticated as (Kafka's
    ``User:<name>``), what authorization decides on; unauthenticated listeners leave Kafka's
    anonymous principal. ``listener`` is the name of the listener the client came in on
    (Metadata answers with that listener's addresses); ``sasl`` is None unless the listener
    uses SASL, and then holds the login's progress; ``token_authenticated`` says the login
    used a delegation token (such a connection may not create or renew tokens).
    ``close_after_response`` ends the
    connection once the current answer is sent (a failed login).
    """

    peer: str
    principal: str = ANONYMOUS
    listener: str = DEFAULT_LISTENER_NAME
    sasl: SaslSession | None = None
    token_authenticated: bool = False  # logged in with a delegation token (KIP-48)
    close_after_response: bool = False
    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    in_flight: int = 0  # requests read and not yet answered
    # A client over its quota (KIP-219: answered at once, then muted for its throttle time);
    # shared with the connections enveloped requests run on (``api/envelope.py``).
    muted: Mute = field(default_factory=lambda: Mute())
    # For an enveloped request (``api/envelope.py``): the proxy's connection it came over. State
    # that ends with the client's connection (share sessions) belongs to that one: the proxy
    # keeps one broker connection per client connection and closes it with the client's.
    carrier: Connection | None = None

    @property
    def session_owner(self) -> Connection:
        """The connection whose closing ends this client's sessions."""
        return self.carrier if self.carrier is not None else self

    def mute(self, throttle_ms: int) -> None:
        """Start no further request of this connection for ``throttle_ms``."""
        until = asyncio.get_running_loop().time() + throttle_ms / 1000
        self.muted.until = max(self.muted.until, until)


@dataclass(slots=True)
class Mute:
    """Event-loop time until which a connection starts no further request."""

    until: float = 0.0

    def remaining_s(self, clock: Callable[[], float]) -> float:
        """How long the connection's next request must wait (0: at once), by the event loop's
        ``clock``. A plain call, no await and no clock read for a connection never muted: it
        runs before every request."""
        return max(self.until - clock(), 0.0) if self.until else 0.0


@dataclass(frozen=True, slots=True)
class ServerEndpoint:
    """One listener as the server opens it: TLS context and SASL mechanisms included."""

    listener: Listener
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanisms: tuple[str, ...] = ()


def new_connection(
    peer: str, endpoint: ServerEndpoint, peer_certificate: bytes | None
) -> Connection:
    """A connection's starting state on ``endpoint``: a SASL login still to do, or the
    principal of a verified client certificate (SASL names the principal when both are used,
    as in Kafka)."""
    listener = endpoint.listener
    if listener.protocol.uses_sasl:
        return Connection(peer, listener=listener.name, sasl=SaslSession(endpoint.sasl_mechanisms))
    principal = ANONYMOUS
    if peer_certificate is not None:
        principal = principal_from_certificate(peer_certificate)
    return Connection(peer, principal=principal, listener=listener.name)


class ByteBudget:
    """Bytes of requests in flight on one connection (or produced bytes not yet durable, on
    the whole broker); a request larger than the whole budget still runs, alone."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._freed = asyncio.Event()

    @property
    def used(self) -> int:
        return self._used

    async def take(self, size: int) -> None:
        while not self.try_take(size):
            await self._freed.wait()

    def try_take(self, size: int) -> bool:
        """Take ``size`` if ``take`` would not wait; else take nothing and say so."""
        if self._used and self._used + size > self._limit:
            return False
        self._used += size
        return True

    def give(self, size: int) -> None:
        self._used -= size
        freed, self._freed = self._freed, asyncio.Event()
        freed.set()


Dispatch = Callable[[Frame, Connection], Coroutine[Any, Any, bytes | None]]


class CloseConnection(Exception):
    """The frame cannot be answered (no readable header): drop the connection."""


class LoginFailed(CloseConnection):
    """A failed SASL login's connection is closed: the failure has its line already
    (``api/sasl``), so the close writes none (a client retrying a wrong password in a loop
    costs one line per attempt, not two, until the log limit counts them)."""


Queued = tuple[asyncio.Task[bytes | None], int, int] | None
"""A request's task, its frame's size and the bytes of request memory it holds; None ends."""


def idle_connections(activity: list[tuple[float, int]], now: float, max_idle_s: float) -> list[int]:
    """Indexes of connections (last activity, requests in flight) idle for ``max_idle_s``."""
    return [
        index
        for index, (last_active, in_flight) in enumerate(activity)
        if in_flight == 0 and now - last_active >= max_idle_s
    ]


_BACKLOG = 128
# Largest frame a SASL connection may send before it has logged in (Kafka's
# sasl.server.max.receive.size): an anonymous peer cannot make the broker take in 100 MiB.
SASL_MAX_RECEIVE_BYTES = 512 * 1024


ConnectionClosed = Callable[[Connection], Coroutine[Any, Any, None]]
"""Called once a connection has ended (the proxy closes the broker connections it opened for
it)."""


class KafkaServer:
    """Every listener of a broker; the limits (connections, request memory) are shared.

    Without ``endpoints`` it opens one PLAINTEXT listener on ``host``:``port``.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        limits: LimitSettings,
        host: str,
        port: int,
        on_closed: ConnectionClosed | None = None,
        endpoints: Sequence[ServerEndpoint] | None = None,
    ) -> None:
        self._dispatch = dispatch
        self._on_closed = on_closed
        self._limits = limits
        self._endpoints = (
            list(endpoints)
            if endpoints
            else [
                ServerEndpoint(
                    Listener(DEFAULT_LISTENER_NAME, host, port, SecurityProtocol.PLAINTEXT)
                )
            ]
        )
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], tuple[Connection, FrameProtocol]] = {}
        self._slots = asyncio.Semaphore(limits.max_connections)
        self._per_address: Counter[str] = Counter()
        self.frame_buffers: BufferPool = frame_buffer_pool()
        self.request_memory = RequestMemory(limits.queued_max_request_bytes)
        self._idle_sweeper: asyncio.Task[None] | None = None
        self._log_summaries: asyncio.Task[None] | None = None
        self._log_limit_attached = False  # LIMITERS attached, not yet detached

    @property
    def port(self) -> int:
        """The first listener's bound port."""
        assert self._servers, "server not started"
        return int(self._servers[0].sockets[0].getsockname()[1])

    @property
    def ports(self) -> dict[str, int]:
        """Each listener's bound port, by listener name."""
        return {
            endpoint.listener.name: int(server.sockets[0].getsockname()[1])
            for endpoint, server in zip(self._endpoints, self._servers, strict=True)
        }

    async def start(self, accepting: bool = True) -> None:
        """Bind the listeners. With ``accepting=False`` the ports are taken (and known) but
        connections wait in the backlog until ``accept()``: a broker registers its port before
        it can answer, and a client that reaches it early must wait, not get an error."""
        try:
            for endpoint in self._endpoints:
                self._servers.append(await self._bind(endpoint, accepting))
        except BaseException:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self._idle_sweeper = start_task(self._close_idle(), name="idle-connections")
        for limiter in LIMITERS:
            limiter.attach()
        self._log_limit_attached = True
        self._log_summaries = start_task(summarise_periodically(), name="client-log-summaries")

    async def _bind(self, endpoint: ServerEndpoint, accepting: bool) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        listener = endpoint.listener
        server = await loop.create_server(
            lambda: FrameProtocol(
                self._limits.max_frame_bytes,
                lambda protocol: self._on_connect(protocol, endpoint),
                buffers=self.frame_buffers,
                memory=self.request_memory,
            ),
            listener.host,
            listener.port,
            reuse_address=True,
            start_serving=accepting,
            backlog=_BACKLOG,
            ssl=endpoint.ssl_context,
        )
        if not accepting:  # asyncio listens only when it starts serving; queue until then
            for sock in server.sockets:
                with sock.dup() as listening:
                    listening.listen(_BACKLOG)
        return server

    async def accept(self) -> None:
        assert self._servers, "server not started"
        for server in self._servers:
            await server.start_serving()

    async def stop_accepting(self) -> None:
        for server in self._servers:
            server.close()
        for sweeper in (self._idle_sweeper, self._log_summaries):
            if sweeper is not None:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
        self._idle_sweeper = self._log_summaries = None

    async def _close_idle(self) -> None:
        """Close connections idle for ``connections_max_idle_ms`` (checked ten times per it)."""
        max_idle_s = self._limits.connections_max_idle_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max_idle_s / 10)
            open_now = list(self._connections.values())
            activity = [(p.last_active, c.in_flight) for c, p in open_now]
            for index in idle_connections(activity, loop.time(), max_idle_s):
                connection, protocol = open_now[index]
                client_log(
                    log, logging.INFO, ClientEvent.IDLE_CLOSED, host_of(connection.peer),
                    "closing %s: idle for %g s", connection.peer, max_idle_s,
                )  # fmt: skip
                protocol.transport.abort()

    async def close(self, grace_s: float) -> None:
        """Stop accepting, let connections finish what they started, then cut them.

        Connections stop reading new requests at once (an idle client must not hold shutdown
        for the whole grace period); requests already read are answered first.
        """
        await self.stop_accepting()
        for _, protocol in self._connections.values():
            protocol.stop()
        if self._connections:
            _, still_open = await asyncio.wait(list(self._connections), timeout=grace_s)
            for task in still_open:
                task.cancel()
            await asyncio.gather(*still_open, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        if self._log_limit_attached:  # the last server of the process ends the windows
            self._log_limit_attached = False
            for limiter in LIMITERS:
                limiter.detach()

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def _on_connect(self, protocol: FrameProtocol, endpoint: ServerEndpoint) -> None:
        METRICS.connections_accepted += 1
        peer = _peer_name(protocol.transport)
        try:
            connection = new_connection(peer, endpoint, _peer_certificate(protocol.transport))
        except ValueError as exc:  # a verified certificate whose subject cannot be read
            client_log(
                log, logging.WARNING, ClientEvent.BAD_CERTIFICATE, host_of(peer),
                "closing %s: unreadable client certificate: %s", peer, exc,
            )  # fmt: skip
            protocol.transport.abort()
            return
        if connection.sasl is not None:
            protocol.limit_frames(SASL_MAX_RECEIVE_BYTES)
        if connection.principal != ANONYMOUS:
            client_log(  # keyed by identity too: one user's logins hide no other's
                log, logging.INFO, ClientEvent.AUTHENTICATED,
                f"{host_of(peer)} as {connection.principal}",
                "%s on %s authenticated by certificate as %s",
                peer, connection.listener, connection.principal,
            )  # fmt: skip
        task = asyncio.create_task(self._serve(protocol, connection))
        self._connections[task] = (connection, protocol)

    async def _serve(self, protocol: FrameProtocol, connection: Connection) -> None:
        task = asyncio.current_task()
        assert task is not None
        address = _peer_address(protocol.transport)
        self._per_address[address] += 1
        try:
            if self._slots.locked():
                METRICS.connection_refused("max_connections")
                client_log(
                    log, logging.WARNING, ClientEvent.CONNECTION_REFUSED, address,
                    "connection limit %d reached; refusing %s",
                    self._limits.max_connections, connection.peer,
                )  # fmt: skip
                return
            if self._per_address[address] > self._limits.max_connections_per_address:
                METRICS.connection_refused("max_connections_per_address")
                client_log(
                    log, logging.WARNING, ClientEvent.CONNECTION_REFUSED, address,
                    "%s has %d connections open (limit %d); refusing",
                    address,
                    self._per_address[address] - 1,
                    self._limits.max_connections_per_address,
                )  # fmt: skip
                return
            async with self._slots:
                await self._pipeline(protocol, connection)
        except* ConnectionError:
            pass
        except* FrameTooLarge as group:
            METRICS.malformed_requests += 1
            client_log(
                log, logging.WARNING, ClientEvent.MALFORMED_REQUEST, address,
                "closing %s: %s", connection.peer, group.exceptions[0],
            )  # fmt: skip
        except* LoginFailed:
            pass  # logged where it failed
        except* CloseConnection as group:
            client_log(
                log, logging.WARNING, ClientEvent.CONNECTION_CLOSED, address,
                "closing %s: %s", connection.peer, group.exceptions[0],
            )  # fmt: skip
        except* Exception as group:  # a bug: end this connection, log it, keep the broker
            client_log(
                log, logging.ERROR, ClientEvent.INTERNAL_ERROR, address,
                "closing %s after an internal error", connection.peer, exc_info=group,
            )  # fmt: skip
        finally:
            self._per_address[address] -= 1
            if not self._per_address[address]:
                del self._per_address[address]
            self._connections.pop(task, None)
            protocol.release()
            protocol.transport.close()
            try:
                await protocol.wait_closed()
            finally:
                if self._on_closed is not None:
                    await self._on_closed(connection)

    async def _pipeline(self, protocol: FrameProtocol, connection: Connection) -> None:
        in_order: asyncio.Queue[Queued] = asyncio.Queue()
        slots = asyncio.Semaphore(self._limits.max_in_flight_per_connection)
        budget = ByteBudget(self._limits.max_in_flight_bytes_per_connection)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_write_in_order(in_order, protocol, slots, budget, connection))
                group.create_task(
                    self._read_requests(protocol, in_order, slots, budget, connection)
                )
        finally:
            await _cancel_queued(in_order, protocol)

    async def _read_requests(
        self,
        protocol: FrameProtocol,
        in_order: asyncio.Queue[Queued],
        slots: asyncio.Semaphore,
        budget: ByteBudget,
        connection: Connection,
    ) -> None:
        running: set[asyncio.Task[bytes | None]] = set()  # started, not done
        clock = asyncio.get_running_loop().time
        # read_charged_frame returns None at the end of the stream and once the server stops.
        while (taken := await protocol.read_charged_frame()) is not None:
            frame, charge = taken
            connection.in_flight += 1
            alone = runs_alone(frame)
            try:
                delay_s = connection.muted.remaining_s(clock)
                if delay_s > 0:  # a later mute (set while waiting) applies from the next request
                    await asyncio.sleep(delay_s)
                await slots.acquire()
                await budget.take(len(frame))
                if alone and running:  # Kafka's order: earlier requests are processed first
                    await asyncio.wait(running)
            except BaseException:
                protocol.give_back(charge)
                raise
            # No await between creating the task and queueing it: every task has an owner.
            task = asyncio.create_task(self._dispatch(frame, connection))
            in_order.put_nowait((task, len(frame), charge))
            del frame, taken  # the task's own; its buffer is reused once the task decoded it
            if alone:
                await asyncio.wait({task})  # and later ones after it
            else:
                running.add(task)
                task.add_done_callback(running.discard)
        in_order.put_nowait(None)


async def _write_in_order(
    in_order: asyncio.Queue[Queued],
    protocol: FrameProtocol,
    slots: asyncio.Semaphore,
    budget: ByteBudget,
    connection: Connection,
) -> None:
    """Responses in request order. Answers that are ready together (a flush round acks every
    request it carried at once) go out in one write: each write to a loopback socket is a
    system call that also runs the receiving side's TCP processing, 8-10 % of the broker's CPU
    (py-spy) when rounds carry two or three small produce requests each."""
    queued = await in_order.get()
    while queued is not None:
        responses: list[bytes] = []
        held: list[Queued] = []  # taken from the queue after the batch, not answered yet
        try:
            try:
                await _answers_ready_together(
                    queued, in_order, slots, budget, protocol, connection, responses, held
                )
            finally:
                if responses:
                    protocol.write_many(responses)
            if connection.sasl is not None and connection.sasl.authenticated:
                protocol.lift_frame_limit()  # before the next read: the client may send now
            await protocol.drain()
            if connection.close_after_response:
                raise LoginFailed("authentication failed")
        except BaseException:
            for item in held:
                in_order.put_nowait(item)  # for _cancel_queued (order no longer matters)
            raise
        queued = held[0] if held else await in_order.get()


async def _answers_ready_together(
    queued: tuple[asyncio.Task[bytes | None], int, int],
    in_order: asyncio.Queue[Queued],
    slots: asyncio.Semaphore,
    budget: ByteBudget,
    protocol: FrameProtocol,
    connection: Connection,
    responses: list[bytes],
    held: list[Queued],
) -> None:
    """Await ``queued``'s answer, then take the answers of the requests after it that are
    done and succeeded already (into ``responses``); the first item taken from the queue that
    is not such a request (or the end marker) goes into ``held``."""
    item = queued
    while True:
        task, size, charge = item
        try:
            response = await task  # CloseConnection propagates and ends the connection
        finally:
            slots.release()
            budget.give(size)
            protocol.give_back(charge)
            connection.in_flight -= 1
        if response:
            responses.append(response)
        if connection.close_after_response or (
            connection.sasl is not None and not connection.sasl.authenticated
        ):
            return  # a SASL exchange: each answer goes out, and is acted on, alone
        if in_order.empty():
            return
        following = in_order.get_nowait()
        if following is None or not _answered(following[0]):
            held.append(following)
            return
        item = following


def _answered(task: asyncio.Task[bytes | None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


async def _cancel_queued(in_order: asyncio.Queue[Queued], protocol: FrameProtocol) -> None:
    pending = []
    while not in_order.empty():
        queued = in_order.get_nowait()
        if queued is not None:
            task, _, charge = queued
            task.cancel()
            pending.append(task)
            protocol.give_back(charge)
    await asyncio.gather(*pending, return_exceptions=True)


def _peer_address(transport: asyncio.BaseTransport) -> str:
    """The client's address without its port: what the per-address limit counts."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer)


def _peer_certificate(transport: asyncio.BaseTransport) -> bytes | None:
    """The client's verified certificate (DER) on a TLS listener, if it sent one."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return bytes(der) if der else None


def _peer_name(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
