"""The committed offsets a broker reports lag from for groups nobody coordinates
(``groups.stored_lag``), read from a real etcd: every group with offsets whose pick this broker
is, whole across etcd's bounded pages; at most ``max_groups`` groups per refresh, the rest in
the next (counted); groups deleted from etcd leave at the end of the pass; a coordinator's
hand-over is not overwritten by a read that began before it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from kafscale.broker.groups import store as store_module
from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.store import CommittedOffset, GroupStore, encode_group, encode_offset
from kafscale.broker.groups.stored_lag import StoredLag
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import KeyValue

pytestmark = pytest.mark.integration

PAGE_KEYS = 4


async def _commit(etcd: Etcd, cluster: str, group: str, offsets: dict[int, int]) -> None:
    for partition, offset in offsets.items():
        key = keys.group_offset_key(cluster, group, "t", partition)
        await etcd.put(key, encode_offset(CommittedOffset(offset)))


def _offsets(lag: StoredLag) -> dict[str, dict[int, int]]:
    return {g: {tp[1]: c.offset for tp, c in offsets.items()} for g, offsets in lag.offsets.items()}


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "PAGE_KEYS", PAGE_KEYS)


async def test_a_pass_holds_the_picked_groups_offsets_whole_across_pages(
    etcd: Etcd, cluster_name: str
) -> None:
    # "a": 6 offsets (split over pages); "b": metadata only; "c/x": an id with "/" (quoted);
    # "d": an offset pending in a transaction only; "e", "f": one offset each, "f" not ours.
    await _commit(etcd, cluster_name, "a", {p: 10 + p for p in range(6)})
    record = encode_group(GroupRecord("consumer", 1, "range", None))
    await etcd.put(keys.group_metadata_key(cluster_name, "b"), record)
    await _commit(etcd, cluster_name, "c/x", {0: 3})
    txn_key = keys.group_txn_offset_key(cluster_name, "d", 7, "t", 0)
    await etcd.put(txn_key, encode_offset(CommittedOffset(1)))
    await _commit(etcd, cluster_name, "e", {0: 5})
    await _commit(etcd, cluster_name, "f", {0: 6})
    lag = StoredLag(GroupStore(etcd, cluster_name), lambda g: g != "f", 3600, max_groups=100)

    await lag.refresh()

    assert _offsets(lag) == {"a": {p: 10 + p for p in range(6)}, "c/x": {0: 3}, "e": {0: 5}}
    assert lag.passes == 1 and lag.capped == 0
    assert lag.reads == 3  # 11 keys, 4 a read: no key read twice


async def test_a_refresh_reads_at_most_max_groups_and_goes_on_where_it_stopped(
    etcd: Etcd, cluster_name: str
) -> None:
    for index in range(7):
        await _commit(etcd, cluster_name, f"g{index}", {0: index, 1: index})
    lag = StoredLag(GroupStore(etcd, cluster_name), lambda _: True, 3600, max_groups=3)

    await lag.refresh()
    first = set(lag.offsets)
    assert 3 <= len(first) < 7 and lag.capped == 1 and lag.passes == 0
    refreshes = 1
    while lag.passes < 1:
        await lag.refresh()
        refreshes += 1
    assert set(lag.offsets) == {f"g{i}" for i in range(7)}
    assert refreshes > 1 and lag.capped == refreshes - 1

    # A group deleted from etcd leaves at the end of the next pass; a new one comes.
    await etcd.delete_prefix(keys.group_prefix(cluster_name, "g1"))
    await _commit(etcd, cluster_name, "g9", {0: 9})
    while lag.passes < 2:
        await lag.refresh()
    assert set(lag.offsets) == {f"g{i}" for i in (0, 2, 3, 4, 5, 6, 9)}


async def test_a_hand_over_wins_over_a_read_that_began_before_it(
    etcd: Etcd, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _commit(etcd, cluster_name, "a", {0: 1})
    lag = StoredLag(GroupStore(etcd, cluster_name), lambda _: True, 3600, 100)
    await lag.refresh()
    assert _offsets(lag) == {"a": {0: 1}}

    # While a refresh's read is on its way, the coordinator commits 8 and lets the group go.
    get_range = etcd.get_range
    raced = False

    async def racing(
        start: str, end: str, limit: int, keys_only: bool = False
    ) -> tuple[list[KeyValue], bool]:
        nonlocal raced
        page = await get_range(start, end, limit, keys_only)
        if not raced:
            raced = True
            await _commit(etcd, cluster_name, "a", {0: 8})
            lag.hand_over("a", {("t", 0): CommittedOffset(8)})
        return page

    monkeypatch.setattr(etcd, "get_range", racing)
    await lag.refresh()
    assert raced and _offsets(lag) == {"a": {0: 8}}

    lag.hand_over("a", {})  # deleted by its coordinator (here: it was not)
    assert _offsets(lag) == {}
    await lag.refresh()
    assert _offsets(lag) == {"a": {0: 8}}


async def test_a_corrupt_committed_offset_leaves_the_other_groups_lag_read(
    etcd: Etcd, cluster_name: str
) -> None:
    # "b" (picked here) has one committed offset that does not decode, beside a good one; the
    # refresh skips that value (its coordinator reports it when loading) and reads on: "c"
    # after it, and the pass ends (a raise here stopped every refresh at b's page for good).
    await _commit(etcd, cluster_name, "a", {0: 1})
    await _commit(etcd, cluster_name, "b", {0: 2})
    await etcd.put(keys.group_offset_key(cluster_name, "b", "t", 1), b"\xffnot json")
    await _commit(etcd, cluster_name, "c", {0: 3})
    lag = StoredLag(GroupStore(etcd, cluster_name), lambda _: True, 3600, max_groups=100)

    await lag.refresh()

    assert _offsets(lag) == {"a": {0: 1}, "b": {0: 2}, "c": {0: 3}}
    assert lag.passes == 1


async def test_a_page_is_decoded_in_chunks_with_the_event_loop_let_in_between(
    etcd: Etcd, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A whole page of 500 offsets took 5-13 ms of the loop at once at 10,000 groups
    # (bench/lag_refresh.py): every request and scrape on the broker waited that long. Here
    # pages of 4 keys, decoded 2 at a time: another task must get turns while a page decodes
    # (between etcd's answer and the page), none of which it got when a page was decoded whole.
    monkeypatch.setattr(store_module, "DECODE_CHUNK_KEYS", 2)
    for group in ("a", "b", "c", "d"):
        await _commit(etcd, cluster_name, group, {0: 1, 1: 2})
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    answered: list[int] = []
    read = etcd.get_range

    async def noting(*args: Any, **kwargs: Any) -> tuple[list[KeyValue], bool]:
        page = await read(*args, **kwargs)
        answered.append(turns)
        return page

    monkeypatch.setattr(etcd, "get_range", noting)
    store = GroupStore(etcd, cluster_name)
    other = asyncio.create_task(other_task())
    decoding: list[int] = []
    try:
        async for _page, _last in store.committed_offset_pages(None):
            decoding.append(turns - answered[-1])
    finally:
        other.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await other
    assert len(decoding) == 2 and all(t >= 1 for t in decoding), decoding  # 8 keys: 4 + 4
