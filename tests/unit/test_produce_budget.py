"""The broker-wide produce budget (``limits.max_buffered_produce_bytes``): a produce takes its
bytes before appending and gives them back once every partition it appended to is durable or
has failed, whatever the order."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.api import produce
from kafscale.broker.protocol.errors import ErrorCode, StorageFailure
from kafscale.broker.server import ByteBudget
from kafscale.broker.storage.partition_log import NO_APPEND_TIME, Ack

pytestmark = pytest.mark.unit


def test_try_take_takes_only_what_take_would_not_wait_for() -> None:
    budget = ByteBudget(100)
    assert budget.try_take(60)
    assert not budget.try_take(50)  # would wait: nothing taken
    assert budget.used == 60
    assert budget.try_take(40)
    budget.give(100)
    assert budget.try_take(250)  # larger than the whole budget: runs alone
    assert budget.used == 250


def test_the_budget_comes_back_once_every_partition_is_durable_or_failed() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        budget = ByteBudget(100)
        ctx: Any = SimpleNamespace(broker=SimpleNamespace(produce_budget=budget))
        assert budget.try_take(60)
        durable: asyncio.Future[Ack] = loop.create_future()
        failed: asyncio.Future[Ack] = loop.create_future()
        outcomes: dict[tuple[str, int], produce.Outcome] = {
            ("t", 0): durable,
            ("t", 1): ErrorCode.CORRUPT_MESSAGE,  # refused, never appended
            ("t", 2): failed,
        }
        produce._give_back_when_durable(ctx, 60, outcomes)
        failed.set_exception(StorageFailure("segment upload failed"))
        await asyncio.sleep(0)
        assert budget.used == 60  # one partition still buffered
        durable.set_result(Ack(7, NO_APPEND_TIME))
        await asyncio.sleep(0)
        assert budget.used == 0

    asyncio.run(scenario())


def test_a_produce_refused_everywhere_gives_its_bytes_back_at_once() -> None:
    budget = ByteBudget(100)
    ctx: Any = SimpleNamespace(broker=SimpleNamespace(produce_budget=budget))
    assert budget.try_take(30)
    produce._give_back_when_durable(ctx, 30, {("t", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED})
    assert budget.used == 0
