"""Blocking calls queued in one turn of the event loop run as one job, still in parallel, each
answer (or error) reaching its own caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from kafscale.broker.storage.thread_batches import ThreadBatches

pytestmark = pytest.mark.unit


def test_calls_of_one_turn_run_in_parallel_and_each_gets_its_own_answer() -> None:
    """Three calls that each wait for the other two at a barrier: they only finish if they run
    at the same time (a round's fsyncs must not queue up behind each other)."""
    barrier = threading.Barrier(3, timeout=5)

    def write(name: str) -> str:
        barrier.wait()
        if name == "bad":
            raise OSError("disk full")
        return name.upper()

    async def scenario() -> list[object]:
        batches = ThreadBatches(4, "test")
        try:
            futures = [batches.run(write, name) for name in ("a", "bad", "c")]
            return await asyncio.gather(*futures, return_exceptions=True)
        finally:
            batches.close()

    a, bad, c = asyncio.run(scenario())
    assert (a, c) == ("A", "C")
    assert isinstance(bad, OSError) and "disk full" in str(bad)


def test_a_caller_that_gave_up_leaves_the_others_their_answers() -> None:
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "slow"

    async def scenario() -> str:
        batches = ThreadBatches(2, "test")
        try:
            abandoned = batches.run(slow)
            kept = batches.run(slow)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await abandoned
            release.set()
            return str(await kept)
        finally:
            batches.close()

    assert asyncio.run(scenario()) == "slow"


def test_after_close_a_call_fails_instead_of_waiting_forever() -> None:
    async def scenario() -> None:
        batches = ThreadBatches(2, "test")
        batches.close()
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(batches.run(lambda: None), 5)

    asyncio.run(scenario())
