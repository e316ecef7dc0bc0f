"""Helpers of the operator tests: the operator running in-process, in a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from kafscale.operator.main import operate
from kafscale.operator.settings import OperatorSettings


async def eventually(
    probe: Callable[[], Any], *, timeout_s: float = 10.0, what: str = "condition"
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with the last value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        result = probe()
        last = await result if asyncio.iscoroutine(result) else result
        if last:
            return last
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.05)


STOP_WAIT_S = 150.0
"""How long a stopping operator may take (kopf's event posting retries, above)."""


@contextlib.asynccontextmanager
async def operator_thread(settings: OperatorSettings) -> AsyncIterator[OperatorSettings]:
    """The operator in a thread with its own event loop, stopped (and joined) afterwards.

    Its own loop because kopf, when it stops, cancels every task of its loop that it did not
    start before it, pytest-asyncio's fixture finalizers included.
    """
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(operate(settings, stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # reported by the fixture
            failure.append(exc)

    thread = threading.Thread(target=run, name="kafscale-operator", daemon=True)
    thread.start()
    try:
        started = await asyncio.to_thread(ready.wait, 60)
        assert started and not failure, f"the operator did not start: {failure}"
        yield settings
    finally:
        stop.set()
        # kopf finishes posting its events first: to a namespace being deleted, each is tried
        # 9 times over 54 s of backoff, events one after another (seen in CI: 20 s were not enough).
        await asyncio.to_thread(thread.join, STOP_WAIT_S)
        assert not thread.is_alive(), f"the operator did not stop within {STOP_WAIT_S:g} s"
