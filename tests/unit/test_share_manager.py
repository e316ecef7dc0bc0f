"""The share manager's promise: an acknowledgement is answered NONE only once etcd holds it.

A store stand-in (a dict) lets a round be held, fenced or failed at will; the real etcd path
is in tests/integration/test_share_groups.py. These cases are the races between a flush round
and a lease lost or a write fenced, which an end-to-end test cannot time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.share.manager import Entry, OwnerView, ShareManager
from kafscale.broker.share.partition import AckType, SharePartition
from kafscale.broker.share.store import StateWrite

KEY = ("g", "t", 0)
OWNER = OwnerView("00" * 16, lease_revision=7, log_start_offset=0, high_watermark=10)


class FakeStore:
    """Saves succeed unless ``fenced`` (every write refused) or one of the writes names a key
    in ``refused_keys``, as etcd refuses a whole transaction when one compare fails; ``gate``
    (when set) holds a save until opened."""

    def __init__(self, share_group: bool = True) -> None:
        self.share_group = share_group
        self.saved: list[Sequence[StateWrite]] = []
        self.fenced = False
        self.refused_keys: set[tuple[str, str, int]] = set()
        self.boom = False
        self.etcd_error: MetadataError | None = None
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def load(self, *_: object) -> tuple[SharePartition | None, int]:
        return None, 0

    async def share_group_revision(self, _group: str) -> int:
        return 5 if self.share_group else 0

    async def save(self, writes: Sequence[StateWrite]) -> int | None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.boom:
            raise RuntimeError("etcd client broke")
        if self.etcd_error is not None:
            raise self.etcd_error
        if self.fenced or await self.refused(writes):
            return None
        self.saved.append(writes)
        return len(self.saved) + 100

    async def refused(self, writes: Sequence[StateWrite]) -> set[int]:
        return {
            i
            for i, w in enumerate(writes)
            if self.fenced or (w.group, w.topic, w.partition) in self.refused_keys
        }


async def _acked_entry(manager: ShareManager) -> tuple[Entry, int]:
    """An entry whose record 0 member m acquired and then acknowledged: the version to wait."""
    entry = await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
    entry.state.acquire("m", 0, 0, 1, 0, entry.limits)
    assert entry.state.acknowledge("m", 0, 0, [AckType.ACCEPT], 0, entry.limits) == ErrorCode.NONE
    return entry, entry.touch()


async def _with_runner(manager: ShareManager) -> asyncio.Task[None]:
    return asyncio.create_task(manager.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_an_acknowledgement_is_answered_once_stored() -> None:
    store = FakeStore()
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    runner = await _with_runner(manager)
    try:
        entry, version = await _acked_entry(manager)
        assert await asyncio.wait_for(manager.durable([(entry, version)]), 30) == ErrorCode.NONE
        assert entry.stored >= version and store.saved
    finally:
        await _stop(runner)


async def test_a_partition_lost_before_the_round_fails_the_acknowledgement() -> None:
    owned = {"yes": True}
    manager = ShareManager(
        FakeStore(),  # type: ignore[arg-type]
        owns=lambda _t, _p, _r: owned["yes"],
        clock=lambda: 0,
    )
    entry, version = await _acked_entry(manager)
    owned["yes"] = False  # the lease moved before any round wrote the acknowledgement
    runner = await _with_runner(manager)
    try:
        answer = await asyncio.wait_for(manager.durable([(entry, version)]), 30)
        assert answer == ErrorCode.NOT_LEADER_OR_FOLLOWER
    finally:
        await _stop(runner)


async def test_an_acknowledgement_made_during_a_fenced_round_is_not_answered_none() -> None:
    """The round in flight carries the entry's older state and is fenced: the entry is let go,
    and the acknowledgement made meanwhile (waiting on the next round) must fail, not pass."""
    store = FakeStore()
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    entry = await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
    entry.state.acquire("m", 0, 0, 1, 0, entry.limits)
    entry.dirty = True
    store.gate = asyncio.Event()
    store.fenced = True
    runner = await _with_runner(manager)
    try:
        await asyncio.wait_for(store.entered.wait(), 30)  # the round holds the old state
        assert entry.state.acknowledge("m", 0, 0, [AckType.ACCEPT], 0, entry.limits) == 0
        waiting = asyncio.create_task(manager.durable([(entry, entry.touch())]))
        await asyncio.sleep(0)
        store.gate.set()
        answer = await asyncio.wait_for(waiting, 30)
        assert answer == ErrorCode.NOT_LEADER_OR_FOLLOWER
    finally:
        await _stop(runner)


async def test_a_broken_store_answers_the_waiters_instead_of_hanging_them() -> None:
    store = FakeStore()
    store.boom = True
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    entry, version = await _acked_entry(manager)
    runner = await _with_runner(manager)
    try:
        answer = await asyncio.wait_for(manager.durable([(entry, version)]), 30)
        assert answer == ErrorCode.UNKNOWN_SERVER_ERROR
        store.boom = False  # the change is kept and written by a later round
        assert await asyncio.wait_for(manager.durable([(entry, version)]), 30) == ErrorCode.NONE
    finally:
        await _stop(runner)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MetadataError("etcd txn failed: permission denied"), ErrorCode.UNKNOWN_SERVER_ERROR),
        (MetadataUnavailable("etcd txn failed: no answer"), ErrorCode.REQUEST_TIMED_OUT),
    ],
    ids=["refused", "unreachable"],
)
async def test_rounds_etcd_refuses_are_logged_once_without_a_traceback(
    error: MetadataError, code: ErrorCode, caplog: pytest.LogCaptureFixture
) -> None:
    """etcd refusing the rounds (permission denied after a change of roles) or out of reach:
    every waiter gets its answer, and the run is one WARNING, then the recovery (INFO). A
    refusal was an ERROR with a traceback each round, an outage a WARNING each round."""
    caplog.set_level(logging.INFO, logger="kafscale.broker.share.manager")
    store = FakeStore()
    store.etcd_error = error
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    entry, version = await _acked_entry(manager)
    runner = await _with_runner(manager)
    try:
        for _ in range(3):
            assert await asyncio.wait_for(manager.durable([(entry, version)]), 30) == code
        store.etcd_error = None
        assert await asyncio.wait_for(manager.durable([(entry, version)]), 30) == ErrorCode.NONE
    finally:
        await _stop(runner)
    lines = [
        (r.levelname, r.getMessage(), r.exc_info)
        for r in caplog.records
        if r.levelno >= logging.WARNING or "share state write" in r.getMessage()
    ]
    assert [(level, exc_info) for level, _, exc_info in lines] == [
        ("WARNING", None),
        ("INFO", None),
    ], lines
    assert str(error) in lines[0][1]
    assert "recovered after 3 failed attempts" in lines[1][1]


async def test_no_share_partition_starts_for_a_group_nobody_joined() -> None:
    """A ShareFetch naming any group id must not make the owner write state for it."""
    store = FakeStore(share_group=False)
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    with pytest.raises(KafkaError) as refused:
        await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
    assert refused.value.code == ErrorCode.GROUP_ID_NOT_FOUND
    runner = await _with_runner(manager)
    try:
        assert await asyncio.wait_for(manager.durable([]), 30) == ErrorCode.NONE
        assert store.saved == []
    finally:
        await _stop(runner)


async def test_a_refused_key_fails_only_its_own_share_partition() -> None:
    """etcd refuses the whole round's transaction for one moved key: only that
    share-partition is let go (its acknowledgement NOT_LEADER_OR_FOLLOWER); the other one's
    acknowledgement is written again in the same round and answered NONE."""
    store = FakeStore()
    store.refused_keys.add(KEY)
    manager = ShareManager(store, clock=lambda: 0)  # type: ignore[arg-type]
    moved, version_moved = await _acked_entry(manager)
    other_key = ("g", "t", 1)
    other = await manager.entry(other_key, OWNER, ShareConfig(auto_offset_reset="earliest"))
    other.state.acquire("m", 0, 0, 1, 0, other.limits)
    assert other.state.acknowledge("m", 0, 0, [AckType.ACCEPT], 0, other.limits) == 0
    version_other = other.touch()
    runner = await _with_runner(manager)
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(
                manager.durable([(moved, version_moved)]),
                manager.durable([(other, version_other)]),
            ),
            30,
        )
        assert answers == [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NONE]
        assert moved.dropped and not other.dropped
        assert [(w.group, w.topic, w.partition) for w in store.saved[-1]] == [other_key]
        # The refused one is read again from the store on its next use.
        again = await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
        assert again is not moved
    finally:
        await _stop(runner)


async def test_a_departed_member_has_its_records_released_and_its_session_closed() -> None:
    manager = ShareManager(FakeStore(), clock=lambda: 0)  # type: ignore[arg-type]
    entry = await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
    entry.state.acquire("gone", 0, 4, 5, 0, entry.limits)
    entry.state.acquire("stays", 5, 9, 5, 0, entry.limits)
    for member in ("gone", "stays"):
        manager.sessions.open_or_advance(("g", member), 0, [("00" * 16, 0)], [])
    changed = manager.changed()
    manager.on_share_members("g", frozenset({"stays"}))
    assert changed.is_set()  # waiting fetches look again at once
    assert entry.dirty
    assert set(manager.sessions.sessions) == {("g", "stays")}
    assert entry.state.first_available(10, entry.limits) == 0
    # What "stays" holds is still its own: it can acknowledge it.
    assert entry.state.acknowledge("stays", 5, 9, [AckType.ACCEPT], 0, entry.limits) == 0
    assert entry.state.acknowledge("gone", 0, 0, [AckType.ACCEPT], 0, entry.limits) != 0


async def test_a_deleted_share_group_is_forgotten_here() -> None:
    manager = ShareManager(FakeStore(), clock=lambda: 0)  # type: ignore[arg-type]
    entry = await manager.entry(KEY, OWNER, ShareConfig(auto_offset_reset="earliest"))
    manager.sessions.open_or_advance(("g", "m"), 0, [], [])
    manager.on_share_members("g", None)
    assert entry.dropped and manager.entries_of("g") == []
    assert manager.sessions.sessions == {}
