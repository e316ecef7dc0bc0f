"""Sending requests to the brokers that own them, retrying where ownership moved.

A part of a request goes to the broker the routing table names. When the answer says the
broker no longer owns it (NOT_LEADER_OR_FOLLOWER for a partition, NOT_COORDINATOR or
COORDINATOR_NOT_AVAILABLE for a group) or the connection is refused or drops, the proxy waits
for the route to change (a watch event, or a short back-off), and sends that part again to the
new owner: within ``routing.max_attempts`` and the request's own deadline. A planned drain thus
costs the client a little latency and no error. Errors are read from the parsed answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import split
from kafscale.broker.proxy.config import RoutingSettings
from kafscale.broker.proxy.routes import RoutingTable
from kafscale.broker.proxy.upstream import UpstreamError, UpstreamPool, UpstreamStats

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
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[bytes]] = []
        used = []
        async with pool.send_lock:
            for broker_id, frame in parts:
                info = self.routes.broker(broker_id)
                try:
                    if info is None:
                        raise UpstreamError(f"broker {broker_id} is not registered")
                    upstream = await pool.get(info)
                except UpstreamError as exc:
                    failed: asyncio.Future[bytes] = loop.create_future()
                    failed.set_exception(exc)
                    futures.append(failed)
                    continue
                futures.append(upstream.send(frame, expect_response))
                used.append(upstream)
        for upstream in used:
            await upstream.drain()
        return futures

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
        when no response is expected: acks=0)."""
        order = split.requested_partitions(request, api)
        results: dict[split.TopicPartition, Any] = {}
        pending: set[split.TopicPartition] = set(order)
        throttle = 0
        attempt = 0
        ordered = api is split.PRODUCE and expect_response
        mine: asyncio.Future[None] | None = None
        if ordered:
            await pool.retry_order.before_first_send(pending)
        try:
            while pending:
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
                futures = await self.send(pool, encoded, expect_response)
                if not expect_response:
                    return None
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                retry: set[split.TopicPartition] = set()
                if unroutable is not None:
                    for tp in split.requested_partitions(unroutable, api):
                        results[tp] = split.partition_error(
                            api, tp[1], ErrorCode.LEADER_NOT_AVAILABLE
                        )
                        retry.add(tp)
                for (_, part), outcome in zip(parts.items(), outcomes, strict=True):
                    if isinstance(outcome, BaseException):
                        if not isinstance(outcome, UpstreamError):
                            raise outcome
                        self.stats.count_retry("connection")
                        for tp in split.requested_partitions(part, api):
                            code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                            results[tp] = split.partition_error(api, tp[1], code)
                            retry.add(tp)
                        continue
                    response = codec.decode_response(outcome, call.api_key, call.api_version)
                    throttle = max(throttle, codec.millis(getattr(response, "throttle_time", 0)))
                    for tp, answer in split.response_partitions(response, api):
                        if tp not in pending:
                            continue
                        results[tp] = answer
                        if int(answer.error_code) in PARTITION_ROUTE_ERRORS:
                            self.stats.count_retry("not_leader")
                            retry.add(tp)
                pending = retry
                attempt += 1
                if not pending:
                    break
                if ordered and mine is None:
                    mine, earlier = pool.retry_order.begin_retry(pending)
                else:
                    earlier = set()
                if not await self._may_retry(attempt, deadline):
                    break
                if earlier:
                    await asyncio.wait(earlier)
        finally:
            if mine is not None:
                pool.retry_order.end(mine)
        for tp in order:  # a partition the broker left out of its answer
            results.setdefault(
                tp, split.partition_error(api, tp[1], ErrorCode.UNKNOWN_SERVER_ERROR)
            )
        return split.merge_response(api, order, results, throttle)

    # --- one key (a group, or any broker) ----------------------------------------------------

    async def routed(
        self,
        pool: UpstreamPool,
        call: Call,
        frame: bytes | memoryview,
        route: Callable[[frozenset[int]], int],
        deadline: float,
        route_errors: frozenset[int] = GROUP_ROUTE_ERRORS,
    ) -> tuple[bytes, Any]:
        """Forward ``frame`` to ``route(brokers that refused)``, retrying on a routing error in
        the answer or a broken connection; the last answer, raw and parsed. Raises
        UpstreamError if no broker could be reached in time."""
        refused: set[int] = set()
        attempt = 0
        while True:
            broker_id = route(frozenset(refused))
            try:
                if broker_id < 0:
                    raise UpstreamError("no live broker")
                body = await self.call_raw(pool, broker_id, frame)
            except UpstreamError:
                self.stats.count_retry("connection")
                refused.add(broker_id)
                attempt += 1
                if not await self._may_retry(attempt, deadline):
                    raise
                continue
            response = codec.decode_response(body, call.api_key, call.api_version)
            attempt += 1
            if not route_errors.intersection(split.error_codes(response)):
                return body, response
            self.stats.count_retry("not_coordinator")
            if not await self._may_retry(attempt, deadline):
                return body, response

    async def _may_retry(self, attempt: int, deadline: float) -> bool:
        remaining = deadline - time.monotonic()
        if attempt >= self.settings.max_attempts or remaining <= 0:
            return False
        await self.routes.wait_changed(min(backoff_s(attempt), remaining))
        return True


def _frame(encoded: bytes) -> memoryview:
    """A request frame without its length prefix (``Upstream.send`` writes its own)."""
    return memoryview(encoded)[4:]
