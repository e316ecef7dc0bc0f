"""The etcd adapter against a real etcd: key-value, transactions, leases, watches, outages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager

import pytest
from harness.etcd import SETTLE_BEFORE_SIGKILL_S
from harness.ports import closed_port
from harness.tcp_relay import TcpRelay

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.metadata.etcd import (
    Etcd,
    WatchEvent,
    WatchEventKind,
    read_ranges_until_answered,
)
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    create_revision_is,
    delete_op,
    delete_prefix_op,
    get_op,
    mod_revision_is,
    put_op,
    value_is,
)
from kafscale.broker.metadata.session_lease import SessionLease

pytestmark = pytest.mark.integration

TIMEOUT_S = 5.0


@asynccontextmanager
async def connected(url: str, timeout_s: float = TIMEOUT_S) -> AsyncIterator[Etcd]:
    client = await Etcd.connect([url], timeout_s=timeout_s)
    try:
        yield client
    finally:
        await client.close()


async def put_until_accepted(etcd: Etcd, key: str, value: bytes) -> int:
    """A write right after an etcd restart: retry while the channel reconnects."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return await etcd.put(key, value)
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.02)


def scratch(cluster: str, name: str) -> str:
    """A key for adapter tests, under the test's own cluster prefix."""
    return f"{keys.cluster_prefix(cluster)}adapter-test/{name}"


# --- key-value ----------------------------------------------------------------------------------


async def test_put_get_prefix_delete(etcd: Etcd, cluster_name: str) -> None:
    prefix = keys.topics_prefix(cluster_name)
    first = await etcd.put(keys.topic_key(cluster_name, "b"), b'{"p":1}')
    second = await etcd.put(keys.topic_key(cluster_name, "a"), b'{"p":2}')
    assert second > first

    kv = await etcd.get(keys.topic_key(cluster_name, "b"))
    assert kv is not None
    assert (kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        b'{"p":1}',
        first,
        first,
        1,
        0,
    )
    assert await etcd.get(keys.topic_key(cluster_name, "missing")) is None

    listed = await etcd.get_prefix(prefix)
    assert [item.key for item in listed] == [
        keys.topic_key(cluster_name, "a"),
        keys.topic_key(cluster_name, "b"),
    ]
    kvs, revision = await etcd.get_prefix_with_revision(prefix)
    assert kvs == listed and revision >= second

    assert await etcd.delete(keys.topic_key(cluster_name, "a")) is True
    assert await etcd.delete(keys.topic_key(cluster_name, "a")) is False
    await etcd.put(keys.topic_key(cluster_name, "c"), b"{}")
    assert await etcd.delete_prefix(prefix) == 2
    assert await etcd.get_prefix(prefix) == []


async def test_create_if_absent_race_has_exactly_one_winner(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    key = keys.partition_lease_key(cluster_name, "orders", 0)
    async with connected(etcd_server.client_url) as a, connected(etcd_server.client_url) as b:
        clients = [a, b]
        results = await asyncio.gather(
            *(clients[i % 2].create_if_absent(key, str(i).encode()) for i in range(10))
        )
        assert sum(results) == 1
        winner = results.index(True)
        stored = await a.get(key)
        assert stored is not None and stored.value == str(winner).encode()


async def test_txn_fences_on_value_and_create_revision(etcd: Etcd, cluster_name: str) -> None:
    """DESIGN §3.4: a commit compares the lease key's value and create revision."""
    lease_key = keys.partition_lease_key(cluster_name, "orders", 3)
    state_key = keys.partition_state_key(cluster_name, "orders", 3)
    taken = await etcd.txn([create_revision_is(lease_key, 0)], [put_op(lease_key, b"1")])
    assert taken.succeeded and taken.responses == [taken.revision]
    held_since = taken.revision

    fenced = [value_is(lease_key, b"1"), create_revision_is(lease_key, held_since)]
    commit = await etcd.txn(fenced, [put_op(state_key, b'{"hw":10}')], [get_op(lease_key)])
    assert commit.succeeded and commit.revision > held_since

    # The lease is lost and re-taken with the same owner value: the old fence must fail.
    await etcd.delete(lease_key)
    await etcd.put(lease_key, b"1")
    stale = await etcd.txn(fenced, [put_op(state_key, b'{"hw":99}')], [get_op(lease_key)])
    assert not stale.succeeded
    current = stale.kv(0)
    assert current is not None and current.create_revision > held_since
    state = await etcd.get(state_key)
    assert state is not None and state.value == b'{"hw":10}'


async def test_txn_results_follow_the_branch_that_ran(etcd: Etcd, cluster_name: str) -> None:
    key, other = scratch(cluster_name, "k"), scratch(cluster_name, "other")
    revision = await etcd.put(key, b"v1")
    result = await etcd.txn(
        [mod_revision_is(key, revision)],
        [put_op(other, b"x"), get_op(key), delete_op(key), get_op(key)],
    )
    assert result.succeeded
    written, _, deleted, after = result.responses
    before = result.kv(1)
    assert written == result.revision
    assert before is not None and before.value == b"v1"
    assert deleted == 1 and after is None
    failed = await etcd.txn([mod_revision_is(key, revision)], [put_op(key, b"no")], [get_op(other)])
    assert not failed.succeeded
    assert failed.kv(0) is not None and failed.revision == result.revision


async def test_a_txn_deletes_a_prefix_and_nothing_beside_it(etcd: Etcd, cluster_name: str) -> None:
    inside = [scratch(cluster_name, f"t/{p}") for p in (0, 1, 17)]
    beside = [
        scratch(cluster_name, "t"),
        scratch(cluster_name, "tt/0"),
        scratch(cluster_name, "s/0"),
    ]
    for key in inside + beside:
        await etcd.put(key, b"v")
    result = await etcd.txn([], [delete_prefix_op(scratch(cluster_name, "t/"))])
    assert result.succeeded and result.responses == [len(inside)]
    left = await etcd.get_prefix(scratch(cluster_name, ""))
    assert sorted(kv.key for kv in left) == sorted(beside)


async def test_increment_is_unique_under_concurrency(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    key = keys.broker_id_counter_key(cluster_name)
    async with connected(etcd_server.client_url) as a, connected(etcd_server.client_url) as b:
        clients = [a, b]
        values = await asyncio.gather(*(clients[i % 2].increment(key) for i in range(20)))
        assert sorted(values) == list(range(1, 21))
        assert await a.increment(key) == 21


# --- leases -------------------------------------------------------------------------------------


async def test_session_keepalive_keeps_keys_past_the_ttl(etcd: Etcd, cluster_name: str) -> None:
    session = await SessionLease.start(etcd, ttl_s=2)
    try:
        key = keys.broker_key(cluster_name, 1)
        await etcd.put(key, b'{"host":"127.0.0.1"}', lease=session.id)
        await asyncio.sleep(3.0)
        kv = await etcd.get(key)
        assert kv is not None and kv.lease == session.id
        assert not session.lost.is_set()
    finally:
        await session.revoke()


async def test_revoke_deletes_bound_keys_and_fires_delete_event(
    etcd: Etcd, cluster_name: str
) -> None:
    session = await SessionLease.start(etcd, ttl_s=10)
    key = keys.partition_lease_key(cluster_name, "orders", 0)
    assert await etcd.create_if_absent(key, b"1", lease=session.id)
    start = await etcd.revision() + 1
    async with aclosing(etcd.watch_prefix(keys.partition_leases_prefix(cluster_name), start)) as w:
        await session.revoke()
        event = await asyncio.wait_for(anext(w), TIMEOUT_S)
    assert (event.kind, event.key) == (WatchEventKind.DELETE, key)
    assert await etcd.get(key) is None
    assert not session.lost.is_set()
    with pytest.raises(LeaseLost):
        await etcd.put(key, b"1", lease=session.id)


async def test_lease_revoked_elsewhere_sets_lost(etcd: Etcd) -> None:
    session = await SessionLease.start(etcd, ttl_s=2)
    try:
        await etcd.revoke_lease(session.id)
        await asyncio.wait_for(session.lost.wait(), 2.0)
        with pytest.raises(LeaseLost):
            await etcd.refresh_lease(session.id)
    finally:
        await session.close()


async def test_etcd_outage_longer_than_two_ttls_sets_lost(
    etcd_server_private: EmbeddedEtcd,
) -> None:
    """Past one TTL without an answered keepalive the session is only suspended (etcd may still
    hold the lease: ``session_phase``); an etcd that answers nothing for a second TTL ends it."""
    async with connected(etcd_server_private.client_url, timeout_s=1.0) as etcd:
        session = await SessionLease.start(etcd, ttl_s=2)
        try:
            etcd_server_private.kill()
            killed_at = time.monotonic()
            with pytest.raises(MetadataUnavailable):
                await etcd.get("/kafscale/anything")
            await asyncio.wait_for(session.lost.wait(), 15.0)
            # Not before two TTLs from the last good keepalive (at most TTL/3 before the kill).
            assert time.monotonic() - killed_at >= 2 * 2.0 - 2.0 / 3 - 0.1
            assert not session.still_valid()
        finally:
            await session.close()


# --- watches ------------------------------------------------------------------------------------


async def test_a_watch_whose_call_is_cut_off_by_its_channel_closing_goes_on(
    etcd_server: EmbeddedEtcd, cluster_name: str
) -> None:
    """etcd restarted and forgot our auth token: the first call told so closes the member's
    channel to authenticate again (``Etcd._reauthenticate``) while other tasks' calls are in
    flight on it, and grpc.aio raises ``CancelledError`` in those tasks. A watch being
    re-created then ended as if cancelled, without a word, and a broker's cluster view never
    followed etcd again (``/readyz`` 503 until a restart; CI, under load). The cut-off call is
    an outage like any other: the watch goes on and delivers what is written next."""
    relay = TcpRelay("127.0.0.1", int(etcd_server.client_url.rsplit(":", 1)[1]))
    key = scratch(cluster_name, "cut-off/k")
    delivered: asyncio.Queue[WatchEvent] = asyncio.Queue()
    try:
        async with connected(relay.url) as etcd:
            start_revision = await etcd.revision() + 1

            async def follow() -> None:
                async with aclosing(etcd.watch_prefix(key, start_revision)) as events:
                    async for event in events:
                        await delivered.put(event)

            with relay.holding_replies():
                watch = asyncio.create_task(follow())
                channel = etcd._clients[0].channel  # the watch's first read waits on it now
                deadline = time.monotonic() + 30
                while not channel._active_calls:
                    assert time.monotonic() < deadline, "the watch's first read never started"
                    await asyncio.sleep(0.01)
                await etcd._clients[0].close()  # what re-authenticating does
            await put_until_accepted(etcd, key, b"after the cut")
            arrival = asyncio.create_task(delivered.get())
            await asyncio.wait({arrival, watch}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            assert not watch.done(), f"the watch ended: {watch!r}"
            assert arrival.done(), "nothing delivered within 30 s"
            event = arrival.result()
            assert (event.kind, event.key, event.value) == (
                WatchEventKind.PUT,
                key,
                b"after the cut",
            )
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    finally:
        relay.close()


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill"])
async def test_watch_resumes_after_restart_without_loss(
    etcd_server_private: EmbeddedEtcd, graceful: bool
) -> None:
    prefix = keys.brokers_prefix("restart")
    url = etcd_server_private.client_url
    async with connected(url) as watcher_client, connected(url) as writer:
        seen: list[WatchEvent] = []
        got_all = asyncio.Event()
        expected = [keys.broker_key("restart", i) for i in range(10)]

        async def consume(start: int) -> None:
            async with aclosing(watcher_client.watch_prefix(prefix, start)) as events:
                async for event in events:
                    seen.append(event)
                    if len(seen) == len(expected):
                        got_all.set()

        start = await writer.revision() + 1
        async with asyncio.TaskGroup() as group:
            consumer = group.create_task(consume(start))
            for i in range(5):
                await writer.put(expected[i], b"before")
            if not graceful:  # a crash after they are durable: what a 3.5.1 needs for that
                await asyncio.sleep(SETTLE_BEFORE_SIGKILL_S)
            await etcd_server_private.restart_async(graceful=graceful)
            # Written while the watcher is still reconnecting: it must replay them.
            for i in range(5, 10):
                await put_until_accepted(writer, expected[i], b"after")
            await asyncio.wait_for(got_all.wait(), TIMEOUT_S)
            consumer.cancel()

    assert [e.key for e in seen] == expected
    assert [e.value for e in seen] == [b"before"] * 5 + [b"after"] * 5
    revisions = [e.mod_revision for e in seen]
    assert revisions == sorted(set(revisions))


async def test_suspended_watch_replays_writes_made_during_restart(
    etcd_server_private: EmbeddedEtcd,
) -> None:
    """The consumer is not iterating while etcd restarts and the writes land, so the watch is
    necessarily re-created afterwards and must replay them from the last seen revision + 1."""
    prefix = keys.brokers_prefix("replay")
    url = etcd_server_private.client_url
    async with connected(url) as watcher_client, connected(url) as writer:
        start = await writer.revision() + 1
        async with aclosing(watcher_client.watch_prefix(prefix, start)) as events:
            await writer.put(keys.broker_key("replay", 1), b"before")
            first = await asyncio.wait_for(anext(events), TIMEOUT_S)
            await asyncio.sleep(SETTLE_BEFORE_SIGKILL_S)  # a crash once "before" is durable
            await etcd_server_private.restart_async(graceful=False)
            after = [
                await put_until_accepted(writer, keys.broker_key("replay", i), b"after")
                for i in (2, 3)
            ]
            replayed = [await asyncio.wait_for(anext(events), TIMEOUT_S) for _ in after]
    assert first.value == b"before"
    assert [(e.key, e.mod_revision) for e in replayed] == [
        (keys.broker_key("replay", 2), after[0]),
        (keys.broker_key("replay", 3), after[1]),
    ]


async def test_watch_from_compacted_revision_resyncs(etcd: Etcd, cluster_name: str) -> None:
    key = scratch(cluster_name, "compacted")
    first = await etcd.put(key, b"1")
    last = await etcd.put(key, b"2")
    await etcd.compact(last)
    async with aclosing(etcd.watch_prefix(scratch(cluster_name, ""), first)) as events:
        resync = await asyncio.wait_for(anext(events), TIMEOUT_S)
        assert resync.kind is WatchEventKind.RESYNC and resync.mod_revision >= last
        written = await etcd.put(key, b"3")
        event = await asyncio.wait_for(anext(events), TIMEOUT_S)
    assert (event.kind, event.value, event.mod_revision) == (WatchEventKind.PUT, b"3", written)


async def watches_through_a_freeze(
    server: EmbeddedEtcd, prefixes: list[str], freeze_s: float
) -> dict[str, list[str]]:
    """The keys each prefix's watch (all on one client, with a 0.3 s call timeout) received,
    the watches created while etcd was frozen for ``freeze_s``, then three writes under each."""
    async with connected(server.client_url, 0.3) as watcher, connected(server.client_url) as writer:
        start = await writer.revision() + 1
        seen: dict[str, list[str]] = {prefix: [] for prefix in prefixes}
        expected = {prefix: [f"{prefix}{i}" for i in range(3)] for prefix in prefixes}
        complete = asyncio.Event()

        async def follow(prefix: str) -> None:
            async with aclosing(watcher.watch_prefix(prefix, start)) as events:
                async for event in events:
                    seen[prefix].append(event.key)
                    if seen == expected:
                        complete.set()

        pid = server.pid
        assert pid is not None
        async with asyncio.TaskGroup() as group:
            os.kill(pid, signal.SIGSTOP)
            try:
                followers = [group.create_task(follow(prefix)) for prefix in prefixes]
                await asyncio.sleep(freeze_s)  # creations time out and are retried meanwhile
            finally:
                os.kill(pid, signal.SIGCONT)
            for i in range(3):
                for prefix in prefixes:
                    await put_until_accepted(writer, f"{prefix}{i}", b"x")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(complete.wait(), 2 * TIMEOUT_S)
            for follower in followers:
                follower.cancel()
        return seen


async def test_watches_created_while_etcd_is_frozen_each_get_their_own_prefix(
    etcd_server_private: EmbeddedEtcd,
) -> None:
    """Watch creations that time out (etcd frozen longer than the call timeout) and are retried
    while the others wait: when etcd answers the queued creations, each watch must still get
    its own prefix's events, all of them. (aetcd alone handed a timed-out creation's late
    answer to the next pending creation, at random moments: that watch then followed another
    prefix and missed its own, which left a proxy routing to moved owners. Three freezes of
    different lengths; tests/unit/test_etcd_watcher.py drives the exact crossing sequence.)"""
    for round_, freeze_s in enumerate((1.0, 1.5, 2.0)):
        prefixes = [f"/kafscale/frozen/{round_}/{name}/" for name in "abcd"]
        seen = await watches_through_a_freeze(etcd_server_private, prefixes, freeze_s)
        assert seen == {prefix: [f"{prefix}{i}" for i in range(3)] for prefix in prefixes}


ETCD_LOGGER = "kafscale.broker.metadata.etcd"
OUTAGE_S = 3.0
"""How long etcd stays down: the time is the point (a run of retries, several per watch at
the watch's backoff), not a wait for something to happen."""


async def test_an_etcd_outage_is_one_line_per_watch_and_one_when_it_is_back(
    etcd_server_private: EmbeddedEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """While etcd is down, each watch retries with backoff; each retry used to log "etcd watch
    on ... interrupted (...); resuming", without end (several lines a second per broker). Now
    a run of retries is one line per watch, then the line of its recovery, which says how long
    it took (``retry_log``); the watch still delivers what was written once etcd is back."""
    caplog.set_level(logging.INFO, logger=ETCD_LOGGER)
    prefixes = ["/kafscale/outage-log/a/", "/kafscale/outage-log/b/"]
    url = etcd_server_private.client_url
    async with connected(url, 1.0) as watcher, connected(url) as writer:
        start = await writer.revision() + 1
        seen: dict[str, list[str]] = {prefix: [] for prefix in prefixes}
        changed = asyncio.Event()

        async def follow(prefix: str) -> None:
            async with aclosing(watcher.watch_prefix(prefix, start)) as events:
                async for event in events:
                    seen[prefix].append(event.key)
                    changed.set()

        async def seen_all(count: int) -> None:
            while any(len(keys_) < count for keys_ in seen.values()):
                changed.clear()
                await asyncio.wait_for(changed.wait(), 2 * TIMEOUT_S)

        async with asyncio.TaskGroup() as group:
            followers = [group.create_task(follow(prefix)) for prefix in prefixes]
            for prefix in prefixes:
                await writer.put(f"{prefix}before", b"x")
            await seen_all(1)
            await etcd_server_private.stop_async()
            await asyncio.sleep(OUTAGE_S)
            await etcd_server_private.start_async()
            for prefix in prefixes:
                await put_until_accepted(writer, f"{prefix}after", b"x")
            await seen_all(2)
            for follower in followers:
                follower.cancel()

    assert seen == {prefix: [f"{prefix}before", f"{prefix}after"] for prefix in prefixes}
    for prefix in prefixes:
        said = [r.getMessage() for r in caplog.records if r.name == ETCD_LOGGER]
        said = [line for line in said if f"etcd watch on {prefix}" in line]
        down = [line for line in said if "recovered after" not in line]
        back = [line for line in said if "recovered after" in line]
        assert len(down) == 1 and len(back) == 1, said
        assert "failed attempts" in back[0] and back[0].endswith(" s"), back


async def test_watch_ends_when_the_client_closes(etcd_server: EmbeddedEtcd) -> None:
    etcd = await Etcd.connect([etcd_server.client_url], timeout_s=TIMEOUT_S)
    events = etcd.watch_prefix("/kafscale/closing/")

    async def drain() -> list[WatchEvent]:
        return [event async for event in events]

    async with asyncio.TaskGroup() as group:
        drained = group.create_task(drain())
        await asyncio.sleep(0.1)
        await etcd.close()
    assert drained.result() == []


# --- connecting and outages ---------------------------------------------------------------------


async def test_connect_to_a_closed_port_fails_fast() -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"  # on purpose: nothing listens there
    started = time.monotonic()
    with pytest.raises(MetadataUnavailable, match=endpoint):
        await Etcd.connect([endpoint], timeout_s=TIMEOUT_S)
    assert time.monotonic() - started < 2.0


async def test_connect_uses_the_first_endpoint_that_answers(etcd_server: EmbeddedEtcd) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"  # on purpose: nothing listens there
    async with asyncio.timeout(TIMEOUT_S):
        etcd = await Etcd.connect([dead, etcd_server.client_url], timeout_s=TIMEOUT_S)
    try:
        assert etcd.endpoint == etcd_server.client_url
        assert await etcd.revision() > 0
    finally:
        await etcd.close()


async def test_connect_waits_out_an_etcd_pause_shorter_than_its_timeout(
    etcd_server_private: EmbeddedEtcd,
) -> None:
    """etcd paused for 1 s while a client connects (its HTTP/2 handshake late, as on a loaded
    node): the connect waits within its timeout, as a CLI command or a start-up must. It
    failed in 0.1 s before ("connection attempt timed out before receiving SETTINGS frame"):
    gRPC gives one connection attempt what ``grpc.min_reconnect_backoff_ms`` says, then 50 ms.
    """
    pid = etcd_server_private.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    resume = asyncio.get_running_loop().call_later(1.0, os.kill, pid, signal.SIGCONT)
    try:
        etcd = await Etcd.connect([etcd_server_private.client_url], timeout_s=60.0)
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    try:
        assert await etcd.revision() > 0
    finally:
        await etcd.close()


async def test_calls_fail_with_metadata_unavailable_while_etcd_is_down(
    etcd_server_private: EmbeddedEtcd,
) -> None:
    async with connected(etcd_server_private.client_url, timeout_s=1.0) as etcd:
        await etcd.put("/kafscale/down/k", b"v")
        etcd_server_private.kill()
        for call in (etcd.get("/kafscale/down/k"), etcd.put("/kafscale/down/k", b"w")):
            with pytest.raises(MetadataUnavailable):
                await call
        await etcd_server_private.start_async()
        assert await put_until_accepted(etcd, "/kafscale/down/k", b"x") > 0


async def test_a_read_of_ranges_compacted_between_its_reads_starts_over(
    etcd: Etcd, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cluster view reads its ranges at the first read's revision (start, and the reload
    # after a RESYNC). History compacted past that revision before the last range is read (the
    # compactor compacts to the current revision under etcd's NOSPACE alarm; an external etcd
    # may auto-compact by revision) made etcd refuse the read: the reload failed with a
    # non-retriable error and the view's event task ended, so the view never changed again.
    first, second = scratch(cluster_name, "ranges/a"), scratch(cluster_name, "ranges/b")
    await etcd.put(first, b"a1")
    await etcd.put(second, b"b1")
    call = etcd._call
    reads = 0

    async def compacting(what: str, rpc_call: Callable[[], Awaitable[object]]) -> object:
        nonlocal reads
        result = await call(what, rpc_call)
        if what == "get_prefix":
            reads += 1
            if reads == 1:  # between the first range's read and the second's
                await etcd.put(second, b"b2")
                await etcd.compact(await etcd.put(first, b"a2"))
        return result

    monkeypatch.setattr(etcd, "_call", compacting)
    ranges = [(first, first + "\0"), (second, second + "\0")]
    entries, revision = await read_ranges_until_answered(etcd, ranges, "test")

    assert [(e.key, e.value) for e in entries] == [(first, b"a2"), (second, b"b2")]
    assert revision == max(e.mod_revision for e in entries)
