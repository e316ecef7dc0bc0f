"""Requests from this broker to another one: a transaction coordinator's markers, a partition
owner's transaction checks.

One connection per broker, kept open and opened again when it breaks, over the proxy's
connections (:mod:`kafscale.broker.proxy.upstream`): they speak the security of the listener
they reach (``inter_broker.*``: TLS with the broker's certificate, a SASL login), so an internal
listener that needs mTLS or SASL is reached as any client reaches it.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.protocol import codec
from kafscale.broker.proxy.upstream import UpstreamLink, UpstreamPool, UpstreamStats

_LENGTH_BYTES = 4
_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
PLAINTEXT_LINK = UpstreamLink()  # bare TCP to the brokers' registered address


class InterBrokerClient:
    def __init__(self, timeout_s: float, link: UpstreamLink = PLAINTEXT_LINK) -> None:
        self.timeout_s = timeout_s
        self._correlation = itertools.count(1)
        self.stats = UpstreamStats()
        self._pool = UpstreamPool(timeout_s, _MAX_RESPONSE_BYTES, self.stats, lambda: link)
        self._connect_locks: dict[int, asyncio.Lock] = {}

    async def close(self) -> None:
        await self._pool.close()

    async def call(self, broker: BrokerInfo, api_key: int, api_version: int, body: Any) -> Any:
        """The decoded response of one request to ``broker``; any connection failure raises.
        Callers bound it with a timeout."""
        correlation_id = next(self._correlation) & 0x7FFFFFFF
        frame = codec.encode_request(api_key, api_version, correlation_id, body)
        # One connection per broker, also when opening it; a broker slow to connect to (a dead
        # pod's address) holds up only the requests for it.
        lock = self._connect_locks.setdefault(broker.node_id, asyncio.Lock())
        async with lock:
            upstream = await self._pool.get(broker)
            answer = upstream.send(memoryview(frame)[_LENGTH_BYTES:])
        await upstream.drain()
        try:
            return codec.decode_response(await answer, api_key, api_version)
        except asyncio.CancelledError:
            # Timed out: a broker that does not answer gets a fresh connection next time
            # rather than more requests queued behind the stuck one.
            await upstream.close()
            raise
