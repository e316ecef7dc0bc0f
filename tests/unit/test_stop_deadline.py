"""The stop bound: a stop that does not end is cut short, with a log of where each task waits.

``stop_within`` runs in a child Python (it ends its process); the child's stop never ends,
once waiting on the event loop (cut by the loop's own deadline, which logs the tasks) and once
blocking the loop's thread (cut by the watchdog thread, which dumps the threads).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator

from harness import children

from kafscale.broker.stop_deadline import EXIT_STOP_DEADLINE, await_chain

WAIT_S = 60.0  # for the child to exit: a bound on the wait, not a speed


def run_child(stop_body: str) -> subprocess.CompletedProcess[str]:
    program = textwrap.dedent(
        f"""
        import asyncio, logging, time
        from kafscale.broker.stop_deadline import stop_within

        async def stuck_in_a_library():
        {textwrap.indent(stop_body, "    ")}

        async def main():
            await stop_within(stuck_in_a_library, 0.5)

        logging.basicConfig(level=logging.INFO)
        asyncio.run(main())
        """
    )
    return children.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=WAIT_S
    )


def test_a_stop_waiting_forever_is_cut_short_with_each_tasks_stack() -> None:
    done = run_child("await asyncio.Event().wait()")
    assert done.returncode == EXIT_STOP_DEADLINE, done.stderr
    assert "stopping took over 0.5 s" in done.stderr
    assert "stuck_in_a_library" in done.stderr  # where it waited


def test_a_stop_blocking_the_event_loop_is_cut_short_by_the_thread() -> None:
    done = run_child("time.sleep(WAIT)".replace("WAIT", str(WAIT_S * 2)))
    assert done.returncode == EXIT_STOP_DEADLINE, done.stderr
    assert "still running" in done.stderr
    assert "stuck_in_a_library" in done.stderr  # faulthandler's dump of the threads


async def test_the_await_chain_goes_through_async_for_into_the_generator() -> None:
    async def events() -> AsyncIterator[int]:
        await asyncio.Event().wait()
        yield 1

    async def follow() -> None:
        async for _ in events():
            pass

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)  # the task runs to its first wait
    try:
        chain = await_chain(task.get_coro())
        assert [line.rsplit(" ", 1)[-1] for line in chain[:3]] == ["follow", "events", "wait"]
    finally:
        task.cancel()
