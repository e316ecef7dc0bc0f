"""A ``KafkaServer`` on a free loopback port around a test's own dispatch function."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from kafscale.broker.config import LimitSettings
from kafscale.broker.server import Dispatch, KafkaServer


@contextlib.asynccontextmanager
async def serving(dispatch: Dispatch, limits: LimitSettings) -> AsyncIterator[KafkaServer]:
    server = KafkaServer(dispatch, limits, "127.0.0.1", 0)
    await server.start()
    try:
        yield server
    finally:
        await server.close(grace_s=1.0)
