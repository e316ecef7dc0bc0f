"""The drain race behind the proxy, made deterministic with two scripted brokers on loopback.

In a planned drain the old owner answers a client's produce n NOT_LEADER_OR_FOLLOWER only
after flushing what came before it, and deletes its lease right after; the proxy may see the
lease move before it reads that answer. Produce n+1, arriving then, must not reach the new
owner before n's retry does: an idempotent producer's n+1 ahead of n is a sequence gap, which
the new owner refuses with OUT_OF_ORDER_SEQUENCE_NUMBER, fatal for the producer. Real brokers
cannot be stopped at that instant, so these brokers follow a script: what reaches each one, in
what order, is what the test reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import split
from kafscale.broker.proxy.config import RoutingSettings
from kafscale.broker.proxy.forward import Call, Forwarder
from kafscale.broker.proxy.staleness import RouteKey
from kafscale.broker.proxy.upstream import UpstreamPool, UpstreamStats

pytestmark = pytest.mark.integration

PRODUCE = Call(0, 9, "ordering-test")
TP = ("t", 0)


class ScriptedBroker:
    """Answers Produce, one request at a time per connection (as a broker answers in order),
    noting each batch's bytes on arrival; ``hold`` keeps answers back, ``refuse`` makes them
    NOT_LEADER_OR_FOLLOWER, ``refusals`` does so for that many requests. With ``expected``, it
    checks sequences as an owner does: it stores only the next expected batch and answers any
    other OUT_OF_ORDER_SEQUENCE_NUMBER."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.arrived: list[bytes] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.refuse = False
        self.refusals = 0
        self.expected: list[bytes] | None = None
        self.stored: list[bytes] = []
        self.got_one = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> BrokerInfo:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return BrokerInfo(self.node_id, "127.0.0.1", port)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                (length,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(length)
                _, version, correlation_id = codec.peek_header(frame)
                request = codec.decode_request(frame, codec.request_schema(0, version)).body
                batch = bytes(request.topic_data[0].partition_data[0].records or b"")
                self.arrived.append(batch)
                self.got_one.set()
                await self.hold.wait()
                code = self._decide(batch)
                writer.write(codec.encode_response(0, version, correlation_id, _answer(code)))
                await writer.drain()
        writer.close()

    def _decide(self, batch: bytes) -> ErrorCode:
        if self.refuse or self.refusals > 0:
            self.refusals -= 1
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.expected is not None:
            if len(self.stored) >= len(self.expected):
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
            if batch != self.expected[len(self.stored)]:
                return ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
        self.stored.append(batch)
        return ErrorCode.NONE


def _answer(code: ErrorCode) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "responses": [
            {
                "name": TP[0],
                "partition_responses": [
                    {"index": TP[1], "error_code": code, "base_offset": -1, "log_start_offset": -1}
                ],
            }
        ],
    }


class Routes:
    """The routing table's face the forwarder uses; the test moves the lease by hand."""

    def __init__(self, brokers: dict[int, BrokerInfo], owner: int) -> None:
        self.brokers = brokers
        self.owner = owner

    def partition_owner(self, tp: tuple[str, int]) -> int:
        return self.owner

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self.brokers.get(node_id)

    async def wait_changed(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)

    def route_of(self, key: RouteKey) -> int:
        return self.owner

    async def recheck(self, key: RouteKey) -> bool:
        """etcd agrees with the table here: the moves are the test's own."""
        return False


def produce(batch: bytes) -> Any:
    body = {
        "acks": -1,
        "timeout": 10_000,
        "topic_data": [{"name": TP[0], "partition_data": [{"index": TP[1], "records": batch}]}],
    }
    return codec.build_entity(codec.request_schema(0, 9), body)


@pytest.fixture
async def brokers() -> AsyncIterator[tuple[ScriptedBroker, ScriptedBroker, Routes]]:
    old, new = ScriptedBroker(1), ScriptedBroker(2)
    infos = {1: await old.start(), 2: await new.start()}
    yield old, new, Routes(infos, owner=1)
    await old.close()
    await new.close()


async def test_a_request_does_not_overtake_one_refused_by_the_old_owner(
    brokers: tuple[ScriptedBroker, ScriptedBroker, Routes],
) -> None:
    old, new, routes = brokers
    forwarder = Forwarder(routes, RoutingSettings(), UpstreamStats())  # type: ignore[arg-type]
    pool = UpstreamPool(2.0, 1 << 20, forwarder.stats)
    deadline = forwarder.deadline(10_000)

    def send(batch: bytes) -> asyncio.Task[Any]:
        return asyncio.create_task(
            forwarder.partitioned(pool, PRODUCE, produce(batch), split.PRODUCE, deadline)
        )

    old.hold.clear()  # draining: the old owner flushes before it answers
    old.refuse = True
    first = send(b"seq-48")
    await asyncio.wait_for(old.got_one.wait(), 5)
    routes.owner = 2  # the lease moved; the refusal of seq-48 is not read yet
    second = send(b"seq-49")
    await asyncio.sleep(0.2)  # room for seq-49 to overtake, if the proxy let it
    old.hold.set()
    answers = await asyncio.wait_for(asyncio.gather(first, second), 10)
    await pool.close()

    assert new.arrived == [b"seq-48", b"seq-49"]  # the client's order, at the new owner
    for answer in answers:
        codes = [p.error_code for t in answer["responses"] for p in t["partition_responses"]]
        assert codes == [ErrorCode.NONE]


async def test_a_request_refused_for_a_gap_behind_a_refused_one_is_retried_in_line(
    brokers: tuple[ScriptedBroker, ScriptedBroker, Routes],
) -> None:
    """The new owner refuses n (its view of the lease lags), then takes the partition and
    refuses n+1 for the gap. The client must see both succeed, not n succeed (retried) and
    n+1 fail: librdkafka makes that a fatal error."""
    _, new, routes = brokers
    routes.owner = 2
    new.refusals = 1
    new.expected = [b"seq-48", b"seq-49"]
    new.hold.clear()  # both requests written before the broker answers either
    forwarder = Forwarder(routes, RoutingSettings(), UpstreamStats())  # type: ignore[arg-type]
    pool = UpstreamPool(2.0, 1 << 20, forwarder.stats)
    deadline = forwarder.deadline(10_000)
    tasks = [
        asyncio.create_task(
            forwarder.partitioned(pool, PRODUCE, produce(batch), split.PRODUCE, deadline)
        )
        for batch in (b"seq-48", b"seq-49")
    ]
    await asyncio.wait_for(new.got_one.wait(), 5)
    await asyncio.sleep(0.1)
    new.hold.set()
    answers = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await pool.close()

    assert new.stored == [b"seq-48", b"seq-49"]
    for answer in answers:
        codes = [p.error_code for t in answer["responses"] for p in t["partition_responses"]]
        assert codes == [ErrorCode.NONE]


async def test_a_genuine_sequence_gap_reaches_the_client(
    brokers: tuple[ScriptedBroker, ScriptedBroker, Routes],
) -> None:
    _, new, routes = brokers
    routes.owner = 2
    new.expected = [b"seq-48"]
    forwarder = Forwarder(routes, RoutingSettings(), UpstreamStats())  # type: ignore[arg-type]
    pool = UpstreamPool(2.0, 1 << 20, forwarder.stats)
    answer = await forwarder.partitioned(
        pool, PRODUCE, produce(b"seq-49"), split.PRODUCE, forwarder.deadline(10_000)
    )
    await pool.close()
    assert answer is not None
    codes = [p.error_code for t in answer["responses"] for p in t["partition_responses"]]
    assert codes == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
    assert new.arrived == [b"seq-49"]  # asked once: nothing earlier was in line


async def test_requests_pipeline_to_an_unchanged_owner(
    brokers: tuple[ScriptedBroker, ScriptedBroker, Routes],
) -> None:
    old, _, routes = brokers
    forwarder = Forwarder(routes, RoutingSettings(), UpstreamStats())  # type: ignore[arg-type]
    pool = UpstreamPool(2.0, 1 << 20, forwarder.stats)
    deadline = forwarder.deadline(10_000)
    old.hold.clear()
    tasks = [
        asyncio.create_task(
            forwarder.partitioned(pool, PRODUCE, produce(b"%d" % n), split.PRODUCE, deadline)
        )
        for n in range(3)
    ]
    await asyncio.wait_for(old.got_one.wait(), 5)
    await asyncio.sleep(0.1)
    # One request is held at the broker; the others are already written behind it.
    sent = forwarder.stats.requests
    old.hold.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await pool.close()
    assert sent == 3
    assert old.arrived == [b"0", b"1", b"2"]
