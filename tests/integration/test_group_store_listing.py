"""Going through every stored group (``GroupStore.group_id_pages``, ``list_persisted``) against
a real etcd: bounded reads (etcd range limits), one key of each group read, the rest of its
keys skipped, and ids that prefix one another or hold ``/`` each given once, in key order."""

from __future__ import annotations

import pytest

from kafscale.broker.groups import store as store_module
from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.store import (
    CommittedOffset,
    GroupStore,
    PersistedGroup,
    encode_group,
    encode_offset,
)
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import KeyValue

pytestmark = pytest.mark.integration

PAGE_KEYS = 3


async def _store(etcd: Etcd, cluster: str) -> None:
    """``g`` (metadata and five offsets), ``g-x`` (offsets only), ``g/x`` (metadata), ``h`` (only
    an offset pending in a transaction: no stored group), ``i`` (a share group's metadata)."""
    record = encode_group(GroupRecord("consumer", 2, "range", None))
    offset = encode_offset(CommittedOffset(5))
    await etcd.put(keys.group_metadata_key(cluster, "g"), record)
    for p in range(5):
        await etcd.put(keys.group_offset_key(cluster, "g", "t", p), offset)
    await etcd.put(keys.group_offset_key(cluster, "g-x", "t", 0), offset)
    await etcd.put(keys.group_metadata_key(cluster, "g/x"), record)
    await etcd.put(keys.group_txn_offset_key(cluster, "h", 7, "t", 0), offset)
    share = encode_group(GroupRecord("", 1, None, None, group_type="share", consumer={}))
    await etcd.put(keys.group_metadata_key(cluster, "i"), share)


async def test_stored_groups_are_read_a_bounded_page_at_a_time(
    etcd: Etcd, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "PAGE_KEYS", PAGE_KEYS)
    answers: list[list[KeyValue]] = []
    get_range = etcd.get_range

    async def counted(
        start: str, end: str, limit: int, keys_only: bool = False
    ) -> tuple[list[KeyValue], bool]:
        page = await get_range(start, end, limit, keys_only)
        answers.append(page[0])
        return page

    monkeypatch.setattr(etcd, "get_range", counted)
    await _store(etcd, cluster_name)
    store = GroupStore(etcd, cluster_name)

    pages = [page async for page in store.group_id_pages(None)]
    # Key order of the quoted ids: g%2Fx/ < g-x/ < g/ < i/.
    assert [group for ids, _ in pages for group in ids] == ["g/x", "g-x", "g", "i"]
    assert [last for _, last in pages] == [False] * (len(pages) - 1) + [True]
    assert all(len(answer) <= PAGE_KEYS for answer in answers)
    assert all(kv.value == b"" for answer in answers for kv in answer)  # keys only
    assert sum(len(answer) for answer in answers) < 10  # g's offsets are not all read

    after_g_x = [group async for ids, _ in store.group_id_pages("g-x") for group in ids]
    assert after_g_x == ["g", "i"]
    assert [group async for ids, _ in store.group_id_pages("i") for group in ids] == []

    answers.clear()
    assert await store.list_persisted() == [
        PersistedGroup("g", "consumer", False),
        PersistedGroup("g-x", "", False),
        PersistedGroup("g/x", "consumer", False),
        PersistedGroup("i", "", False, "share"),
    ]
    assert all(len(answer) <= PAGE_KEYS for answer in answers)
