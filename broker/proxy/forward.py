"""Sending requests to the brokers that own them, retrying where ownership moved.

A part of a request goes to the broker the routing table names. When the answer says the
broker no longer owns it (NOT_LEADER_OR_FOLLOWER for a partition, NOT_COORDINATOR or
COORDINATOR_NOT_AVAILABLE for a group) or the connection is refused or drops, the proxy waits
for the route to change (a watch event, or a short back-off), and sends that part again to the
new owner: within ``routing.max_attempts`` and the request's own deadline. A planned drain thus
costs the client a little latency and no error. Errors are read from the parsed answer.
A route whose broker keeps refusing it past ``routing.stale_route_grace_s`` is re-read from
etcd (``staleness``, ``RoutingTable.recheck``), in case the table missed the move.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import split
from kafscale.broker.proxy.config import RoutingSettings
from kafscale.broker.proxy.ordering import Ticket, retry_out_of_order
from kafscale.broker.proxy.routes import RoutingTable
from kafscale.broker.proxy.staleness import RefusalStreaks, RouteKey
from kafscale.broker.proxy.upstream import Upstream, UpstreamError, UpstreamPool, UpstreamStats
from kafscale.broker.task_stop import cancel_and_wait

PARTITION_ROUTE_ERRORS = frozenset(
    {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.LEADER_NOT_AVAILABLE}
)
GROUP_ROUTE_ERRORS = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
_FIRST_BACKOFF_S = 0.01
_MAX_BACKOFF_S = 0.5
_HOLDER_CHECK_S = 0.25
"""How often a request waiting on a coordinator looks whether that coordinator's lease moved."""


@dataclass(frozen=True, slots=True)
class Call:
    """One request as the client sent it: header fields the upstream request repeats."""

    api_key: int
    api_version: int
    client_id: str | None


def backoff_s(attempt: int) -> float:
    """How long to wait for a route change before attempt ``attempt + 1``."""
    return float(min(_FIRST_BACKOFF_S * 2**attempt, _MAX_BACKOFF_S))


class Forwarder:
    def __init__(self, routes: RoutingTable, settings: RoutingSettings, stats: UpstreamStats):
        self.routes = routes
        self.settings = settings
        self.stats = stats
        self.streaks = RefusalStreaks(
            settings.stale_route_grace_s, settings.stale_route_check_interval_s
        )

    def deadline(self, request_timeout_ms: int | None = None) -> float:
        budget = self.settings.retry_timeout_s
        if request_timeout_ms is not None and request_timeout_ms > 0:
            budget = min(budget, request_timeout_ms / 1000)
        return time.monotonic() + budget

    # --- sending --------------------------------------------------------------------------

    async def send(
        self,
        pool: UpstreamPool,
        parts: Sequence[tuple[int, bytes | memoryview]],
        expect_response: bool = True,
    ) -> list[asyncio.Future[bytes]]:
        """Write each (broker, request frame) part, in order, under the client's send lock;
        a part whose broker cannot be reached gets a failed future."""
        async with pool.send_lock:
            connections = await self._connect(pool, [broker for broker, _ in parts])
            futures = _write(parts, connections, expect_response)
        await _drain(connections)
        return futures

    async def _connect(
        self, pool: UpstreamPool, brokers: Sequence[int]
    ) -> list[Upstream | UpstreamError]:
        """A connection to each broker (or why there is none); call under the send lock."""
        connections: list[Upstream | UpstreamError] = []
        for broker_id in brokers:
            info = self.routes.broker(broker_id)
            try:
                if info is None:
                    raise UpstreamError(f"broker {broker_id} is not registered")
                connections.append(await pool.get(info))
            except UpstreamError as exc:
                connections.append(exc)
        return connections

    async def call_raw(
        self, pool: UpstreamPool, broker_id: int, frame: bytes | memoryview
    ) -> bytes:
        """One frame to one broker; its response body (raises UpstreamError)."""
        (future,) = await self.send(pool, [(broker_id, frame)])
        return await future

    # --- partitioned APIs -----------------------------------------------------------------

    async def partitioned(
        self,
        pool: UpstreamPool,
        call: Call,
        request: Any,
        api: split.PartitionedApi,
        deadline: float,
        expect_response: bool = True,
    ) -> dict[str, Any] | None:
        """Split by owner, forward concurrently, retry moved partitions; the merged body (None
        when no response is expected: acks=0). Produce parts keep the client's order per
        partition (``ordering``)."""
        order = split.requested_partitions(request, api)
        results: dict[split.TopicPartition, Any] = {}
        pending: set[split.TopicPartition] = set(order)
        throttle = 0
        attempt = 0
        line = pool.produce_order
        ticket = line.enter(order) if api is split.PRODUCE and expect_response else None
        try:
            while pending:
                sent = await self._send_parts(
                    pool, call, request, api, pending, ticket, expect_response
                )
                if not expect_response:
                    return None
                outcomes = await asyncio.gather(*sent.futures, return_exceptions=True)
                retry, throttle_ms, refused_by = self._read_outcomes(
                    call, api, pending, sent, outcomes, results, ticket
                )
                throttle = max(throttle, throttle_ms)
                if ticket is not None:
                    line.finish(ticket, pending - retry)
                    line.unsent(ticket, retry)
                pending = retry
                attempt += 1
                corrected = await self._recheck(
                    {RouteKey.of_partition(tp): b for tp, b in refused_by.items()}, deadline
                )
                if pending and not await self._may_retry(attempt, deadline, not corrected):
                    break
        finally:
            if ticket is not None:
                line.leave(ticket)
        return split.merge_response(api, order, results, throttle)

    async def _send_parts(
        self,
        pool: UpstreamPool,
        call: Call,
        request: Any,
        api: split.PartitionedApi,
        pending: set[split.TopicPartition],
        ticket: Ticket | None,
        expect_response: bool,
    ) -> _Sent:
        """Split ``pending`` by owner and write the parts, once (with a ticket) every part is
        in order behind the client's earlier requests for its partitions."""
        line = pool.produce_order
        while True:
            parts = split.split_request(request, api, self.routes.partition_owner, pending)
            unroutable = parts.pop(-1, None)
            encoded = [
                (
                    broker,
                    _frame(
                        codec.encode_request(
                            call.api_key, call.api_version, 0, part, call.client_id
                        )
                    ),
                )
                for broker, part in parts.items()
            ]
            async with pool.send_lock:
                connections = await self._connect(pool, [broker for broker, _ in encoded])
                targets = _targets(api, parts, connections)
                if ticket is None or line.may_send(ticket, targets):
                    futures = _write(encoded, connections, expect_response)
                    if ticket is not None:
                        line.sent(ticket, {tp: c for tp, c in targets.items() if c is not None})
                    break
                changed = line.next_change()
            await changed.wait()
        await _drain(connections)
        return _Sent(unroutable, futures, list(parts))

    def _read_outcomes(
        self,
        call: Call,
        api: split.PartitionedApi,
        pending: set[split.TopicPartition],
        sent: _Sent,
        outcomes: list[bytes | BaseException],
        results: dict[split.TopicPartition, Any],
        ticket: Ticket | None = None,
    ) -> tuple[set[split.TopicPartition], int, dict[split.TopicPartition, int]]:
        """Record each partition's answer in ``results``; the partitions to retry (moved,
        unroutable, unreachable, or left out of an answer: all retriable for the client too),
        the largest throttle, and the partitions answered NOT_LEADER_OR_FOLLOWER with the
        broker that answered so."""
        throttle = 0
        answered: set[split.TopicPartition] = set()
        refused: set[split.TopicPartition] = set()
        refused_by: dict[split.TopicPartition, int] = {}
        for broker, outcome in zip(sent.brokers, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, UpstreamError):
                    raise outcome
                self.stats.count_retry("connection")
                continue
            response = codec.decode_response(outcome, call.api_key, call.api_version)
            throttle = max(throttle, codec.millis(getattr(response, "throttle_time", 0)))
            for tp, answer in split.response_partitions(response, api):
                if tp not in pending:
                    continue
                results[tp] = answer
                code = int(answer.error_code)
                if code in PARTITION_ROUTE_ERRORS:
                    self.stats.count_retry("not_leader")
                    refused.add(tp)
                    if code == ErrorCode.NOT_LEADER_OR_FOLLOWER:
                        refused_by[tp] = broker
                elif ticket is not None and retry_out_of_order(code, tp in ticket.behind):
                    self.stats.count_retry("out_of_order")
                    refused.add(tp)
                else:
                    answered.add(tp)
        unroutable = (
            set()
            if sent.unroutable is None
            else set(split.requested_partitions(sent.unroutable, api))
        )
        retry = pending - answered
        for tp in retry - refused:
            code = (
                ErrorCode.LEADER_NOT_AVAILABLE
                if tp in unroutable
                else ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
            results[tp] = split.partition_error(api, tp[1], code)
        return retry, throttle, refused_by

    # --- one key (a group, or any broker) ----------------------------------------------------

    async def routed(
        self,
        pool: UpstreamPool,
        call: Call,
        frame: bytes | memoryview,
        route: Callable[[frozenset[int]], int],
        deadline: float,
        route_errors: frozenset[int] = GROUP_ROUTE_ERRORS,
        lease: RouteKey | None = None,
    ) -> tuple[bytes, Any]:
        """Forward ``frame`` to ``route(brokers that refused)``, retrying on a routing error in
        the answer or a broken connection; the last answer, raw and parsed. Raises
        UpstreamError if no broker could be reached in time. ``lease``: the coordinator lease
        ``route`` follows, re-read from etcd if its holder keeps answering NOT_COORDINATOR."""
        refused: set[int] = set()
        attempt = 0
        while True:
            broker_id = route(frozenset(refused))
            try:
                if broker_id < 0:
                    raise UpstreamError("no live broker")
                body = await self._call_holder(pool, broker_id, frame, lease)
            except UpstreamError:
                self.stats.count_retry("connection")
                refused.add(broker_id)
                attempt += 1
                if not await self._may_retry(attempt, deadline):
                    raise
                continue
            attempt += 1
            if body is None:  # the lease moved while its old holder said nothing
                self.stats.count_retry("moved")
                deadline = max(deadline, self.deadline())  # the silence was no retry
                if not await self._may_retry(attempt, deadline, wait=False):
                    raise UpstreamError(f"broker {broker_id} lost {lease} without answering")
                continue
            try:
                response = codec.decode_response(body, call.api_key, call.api_version)
            except Exception:
                # kio refuses a few values Kafka sends (DescribeTransactions' start time of -1
                # for a transaction that has not begun): pass such an answer on as it came.
                return body, None
            if not route_errors.intersection(split.error_codes(response)):
                return body, response
            self.stats.count_retry("not_coordinator")
            corrected = False
            if lease is not None and ErrorCode.NOT_COORDINATOR in split.error_codes(response):
                corrected = await self._recheck({lease: broker_id}, deadline)
            if not await self._may_retry(attempt, deadline, not corrected):
                return body, response

    async def _call_holder(
        self, pool: UpstreamPool, broker_id: int, frame: bytes | memoryview, lease: RouteKey | None
    ) -> bytes | None:
        """``call_raw`` to the holder of ``lease``; None if the lease moved to another broker
        before it answered. A coordinator frozen past its session's TTL (SIGSTOP, a stalled
        VM) answers nothing until it wakes, and then NOT_COORDINATOR: it lost the lease, and
        whatever it was asked is fenced by it (a broker never coordinates without the lease).
        So the request goes to the new holder once the watch shows it, instead of waiting on
        the frozen one until the client's own timeout (a synchronous commit, say)."""
        if lease is None:
            return await self.call_raw(pool, broker_id, frame)
        answer = asyncio.ensure_future(self.call_raw(pool, broker_id, frame))
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_HOLDER_CHECK_S):
                        return await asyncio.shield(answer)
                if self.routes.route_of(lease) != broker_id:
                    return None  # a late answer is dropped (``Upstream``)
        finally:
            await cancel_and_wait(answer)

    async def _recheck(self, refused_by: dict[RouteKey, int], deadline: float) -> bool:
        """Read from etcd the leases whose holder (as the table says) has kept refusing them
        past the grace (``staleness``), within the request's deadline; whether any route was
        corrected."""
        if not refused_by:
            return False
        routes = self.routes
        now = time.monotonic()
        due = [
            key
            for key, broker in refused_by.items()
            if routes.route_of(key) == broker and self.streaks.refused(key, broker, now)
        ]
        if not due:
            return False
        corrected: list[bool] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(deadline - now, 0.0)):
                corrected = await asyncio.gather(*(routes.recheck(key) for key in due))
        return any(corrected)

    async def _may_retry(self, attempt: int, deadline: float, wait: bool = True) -> bool:
        """Another attempt? After waiting for a route change or the back-off (not when the
        route was just corrected)."""
        remaining = deadline - time.monotonic()
        if attempt >= self.settings.max_attempts or remaining <= 0:
            return False
        if wait:
            await self.routes.wait_changed(min(backoff_s(attempt), remaining))
        return True


@dataclass(frozen=True, slots=True)
class _Sent:
    """One round of a partitioned request: the partitions no broker could take, and each
    written part's answer to come."""

    unroutable: Any | None
    futures: list[asyncio.Future[bytes]]
    brokers: list[int]  # the broker of each future


def _targets(
    api: split.PartitionedApi, parts: dict[int, Any], connections: list[Upstream | UpstreamError]
) -> dict[split.TopicPartition, Upstream | None]:
    """Each partition of the parts, with the connection its part is about to be written to."""
    targets: dict[split.TopicPartition, Upstream | None] = {}
    for part, connection in zip(parts.values(), connections, strict=True):
        for tp in split.requested_partitions(part, api):
            targets[tp] = connection if isinstance(connection, Upstream) else None
    return targets


def _write(
    parts: Sequence[tuple[int, bytes | memoryview]],
    connections: list[Upstream | UpstreamError],
    expect_response: bool,
) -> list[asyncio.Future[bytes]]:
    """Write each part on its connection, without awaiting (a part with no connection gets a
    failed future)."""
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[bytes]] = []
    for (_, frame), connection in zip(parts, connections, strict=True):
        if isinstance(connection, Upstream):
            futures.append(connection.send(frame, expect_response))
        else:
            failed: asyncio.Future[bytes] = loop.create_future()
            failed.set_exception(connection)
            futures.append(failed)
    return futures


async def _drain(connections: list[Upstream | UpstreamError]) -> None:
    for connection in connections:
        if isinstance(connection, Upstream):
            await connection.drain()


def _frame(encoded: bytes) -> memoryview:
    """A request frame without its length prefix (``Upstream.send`` writes its own)."""
    return memoryview(encoded)[4:]
