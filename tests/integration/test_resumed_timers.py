"""Every protocol's group gets its members' timers moved at a session resumption, whenever its
timers are due (``broker/groups/session_resume.py``): a group runtime on a real etcd, in this
process, on a clock the test moves, its session's validity and last resumption told by the
test as ``SessionLease`` tells them to the coordinator's runtimes.

The case: the suspension ends before the member's session would run out, so the group's timer
task sleeps through all of it (nothing wakes it: a suspended coordinator refuses requests before
they reach the group). The member was refused meanwhile all the same. The broker-level case,
a classic member over the wire: ``test_session_lapse.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from harness.coordinator_host import join_request
from harness.subscribed_groups import member_heartbeat

from kafscale.broker.groups.leases import GroupLeases
from kafscale.broker.groups.model import GroupConfig, SyncRequest
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.groups.share import ShareConfig, ShareHeartbeat
from kafscale.broker.groups.store import GroupStore, LoadedGroup
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.protocol.errors import ErrorCode

pytestmark = pytest.mark.integration

SESSION_MS = 10_000
CONFIG = GroupConfig(
    initial_rebalance_delay_ms=0,
    min_session_timeout_ms=1000,
    consumer_session_timeout_ms=SESSION_MS,
    share=ShareConfig(session_timeout_ms=SESSION_MS),
)
SUSPENDED_MS = (1000, 9000)
"""The suspension, on the test's clock: it ends before the member's deadline (10 000)."""
WAIT_S = 60.0


@dataclass
class Coordinated:
    """A group runtime on the test's clock and the session it is told of."""

    runtime: GroupRuntime
    now_ms: list[int] = field(default_factory=lambda: [0])
    valid: list[bool] = field(default_factory=lambda: [True])
    resumed_ms: list[int | None] = field(default_factory=lambda: [None])

    def suspend_and_resume(self) -> None:
        """The session suspended and resumed, without a request or a timer in between (the
        timer task sleeps towards the member's deadline all along)."""
        start_ms, end_ms = SUSPENDED_MS
        self.now_ms[0], self.valid[0] = start_ms, False
        self.now_ms[0], self.valid[0], self.resumed_ms[0] = end_ms, True, end_ms

    async def timers_at(self, now_ms: int) -> None:
        """The clock at ``now_ms`` and one step of the timer task done there (the task clears
        its wake-up event when it goes back to sleep)."""
        self.now_ms[0] = now_ms
        self.runtime._wake.set()
        deadline = time.monotonic() + WAIT_S
        while self.runtime._wake.is_set():
            assert time.monotonic() < deadline, "the timer task never stepped"
            await asyncio.sleep(0.01)


@pytest.fixture
async def coordinated(etcd: Etcd, cluster_name: str) -> AsyncIterator[Coordinated]:
    session = await SessionLease.start(etcd, 60)
    fence = await GroupLeases(etcd, cluster_name, lambda *_: None).acquire("g", 1, session.id)
    assert fence is not None
    clock: list[int] = [0]
    valid, resumed = [True], [None]
    runtime = GroupRuntime(
        "g",
        fence,
        GroupStore(etcd, cluster_name),
        CONFIG,
        LoadedGroup(None, {}),
        lambda *_: None,
        clock=lambda: clock[0],
        session_valid=lambda: valid[0],
        session_resumed_ms=lambda: resumed[0],
    )
    try:
        yield Coordinated(runtime, clock, valid, resumed)
    finally:
        for task in runtime.unload():
            await asyncio.gather(task, return_exceptions=True)
        await session.revoke()


async def classic_member(runtime: GroupRuntime) -> Callable[[], bool]:
    joined = await runtime.join(join_request(timeout_ms=SESSION_MS))
    assert joined.error is ErrorCode.NONE, joined
    sync = SyncRequest(joined.member_id, joined.generation_id, None, None, None, {})
    assert (await runtime.sync(sync)).error is ErrorCode.NONE
    return lambda: runtime.group is not None and joined.member_id in runtime.group.members


async def consumer_member(runtime: GroupRuntime) -> Callable[[], bool]:
    answer = await runtime.consumer_heartbeat(member_heartbeat("m", 0, ("t",), None), {"t": 1})
    assert answer.error is ErrorCode.NONE, answer
    return lambda: runtime.consumer is not None and "m" in runtime.consumer.members


async def share_member(runtime: GroupRuntime) -> Callable[[], bool]:
    request = ShareHeartbeat("s", 0, None, ("t",), "c", "/h")
    answer = await runtime.share_heartbeat(request, {"t": 1})
    assert answer.error is ErrorCode.NONE, answer
    return lambda: runtime.share is not None and "s" in runtime.share.members


@pytest.mark.parametrize("join", [classic_member, consumer_member, share_member])
async def test_a_member_refused_by_a_short_suspension_gets_a_whole_session_from_its_end(
    coordinated: Coordinated, join: Callable[[GroupRuntime], Awaitable[Callable[[], bool]]]
) -> None:
    """Joined at 0 with a 10-s session, refused from 1 s to 9 s: kept past 10 s, expired a
    whole session after the resumption (19 s), not later. Before: expired at 10 s (the timer
    task never saw the session suspended, so it moved nothing)."""
    member_in = await join(coordinated.runtime)
    coordinated.suspend_and_resume()
    await coordinated.timers_at(SESSION_MS + 500)  # past its old deadline
    assert member_in()
    await coordinated.timers_at(SUSPENDED_MS[1] + SESSION_MS - 1)
    assert member_in()
    await coordinated.timers_at(SUSPENDED_MS[1] + SESSION_MS)
    assert not member_in()
