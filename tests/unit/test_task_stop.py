"""A background task is stopped for good, even one that swallows a cancellation, and the
caller's own cancellation is never swallowed on the way."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from kafscale.broker.task_stop import cancel_and_wait, start_task


async def _swallows_one_cancel(ended: list[str]) -> None:
    with contextlib.suppress(asyncio.CancelledError):  # as a library's ``except: pass`` does
        await asyncio.sleep(3600)
    try:
        await asyncio.sleep(3600)
    finally:
        ended.append("ended")


def test_a_task_that_swallows_a_cancellation_is_cancelled_again_until_it_ends() -> None:
    async def scenario() -> list[str]:
        ended: list[str] = []
        task = asyncio.create_task(_swallows_one_cancel(ended))
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_and_wait(task), timeout=10)
        assert task.done()
        return ended

    assert asyncio.run(scenario()) == ["ended"]


def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    async def scenario() -> bool:
        stubborn = asyncio.create_task(_swallows_one_cancel([]))
        await asyncio.sleep(0)
        closer = asyncio.create_task(cancel_and_wait(stubborn))
        await asyncio.sleep(0.05)
        closer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closer
        stubborn.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stubborn
        return closer.cancelled()

    assert asyncio.run(scenario())


def test_nothing_to_stop() -> None:
    asyncio.run(cancel_and_wait(None))


async def _fails() -> None:
    raise RuntimeError("watch refused")


async def test_a_background_task_that_fails_says_so_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = start_task(_fails(), "doomed")
    await asyncio.wait({task})
    await asyncio.sleep(0)  # done callbacks run in the next loop step
    lines = [r for r in caplog.records if "background task doomed ended" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is not None
    await cancel_and_wait(task)  # retrieving it again at shutdown logs nothing more
    assert len([r for r in caplog.records if "doomed" in r.getMessage()]) == 1


async def test_a_cancelled_background_task_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    task = start_task(asyncio.sleep(3600), "sleeper")
    await cancel_and_wait(task)
    await asyncio.sleep(0)
    assert not [r for r in caplog.records if "sleeper" in r.getMessage()]
