"""One contract suite for every object-store adapter: moto S3, a local directory, Ceph radosgw.

The adapters are opened through ``open_object_store`` from real StorageSettings, the way a
broker opens them. The radosgw cases carry the ``radosgw`` marker (``-m "not radosgw"`` leaves
them out); without Ceph installed they fail and say how to install it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from harness.s3 import S3Endpoint, unique_bucket

from kafscale.broker.config import StorageKind, StorageSettings
from kafscale.broker.storage.factory import open_object_store
from kafscale.broker.storage.local_dir import LocalDirObjectStore
from kafscale.broker.storage.object_store import (
    ObjectAlreadyExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
)
from kafscale.broker.storage.s3 import S3ObjectStore

pytestmark = pytest.mark.integration


@dataclass
class Backend:
    """Opens stores on one fresh bucket (or directory) and closes them all afterwards."""

    name: str
    base: StorageSettings
    opened: list[ObjectStore] = field(default_factory=list)

    async def open(self, **overrides: Any) -> ObjectStore:
        store = open_object_store(self.base.model_copy(update=overrides))
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await store.close()


@pytest_asyncio.fixture(
    params=["moto", "local", pytest.param("radosgw", marks=pytest.mark.radosgw)]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "local":
        settings = StorageSettings(kind=StorageKind.LOCAL, local_dir=tmp_path / "objects")
    else:
        server_fixture = "s3_server" if request.param == "moto" else "radosgw_server"
        server: S3Endpoint = request.getfixturevalue(server_fixture)
        settings = server.settings(unique_bucket())
    backend = Backend(request.param, settings)
    try:
        first = await backend.open()
        if isinstance(first, S3ObjectStore):
            await first.create_bucket_if_missing()
        await first.check()
        yield backend
    finally:
        await backend.close()


@pytest_asyncio.fixture
async def store(backend: Backend) -> ObjectStore:
    return backend.opened[0]


KEY = "c1/topics/orders/abc/0/00000000000000000000-e1.kfs"


async def test_put_get_round_trip(store: ObjectStore) -> None:
    data = os.urandom(200_000)
    await store.put(KEY, data)
    assert await store.get(KEY) == data


async def test_put_of_a_view_stores_exactly_the_viewed_bytes(store: ObjectStore) -> None:
    """Segments are PUT as views into larger, reused buffers (``buffer_pool``)."""
    buffer = bytearray(os.urandom(3 * 1024 * 1024))
    view = memoryview(buffer)[: 2 * 1024 * 1024 + 17]
    await store.put(KEY, view)
    assert await store.get(KEY) == bytes(view)


async def test_get_missing_raises_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        await store.get("c1/no/such/key")
    with pytest.raises(ObjectNotFound):
        await store.get("c1/no/such/key", start=5, end=5)


async def test_ranged_get(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40  # 10240 bytes
    await store.put(KEY, data)
    assert await store.get(KEY, start=100, end=300) == data[100:300]
    assert await store.get(KEY, start=10_000) == data[10_000:]
    assert await store.get(KEY, end=32) == data[:32]
    assert await store.get(KEY, start=10_200, end=20_000) == data[10_200:]  # clipped at the end
    assert await store.get(KEY, start=len(data)) == b""
    assert await store.get(KEY, start=50_000) == b""
    assert await store.get(KEY, start=7, end=7) == b""
    assert await store.get(KEY, start=len(data) - 1, end=len(data)) == data[-1:]


async def test_if_absent_never_replaces(store: ObjectStore) -> None:
    await store.put(KEY, b"first")
    with pytest.raises(ObjectAlreadyExists):
        await store.put(KEY, b"second")
    with pytest.raises(ObjectAlreadyExists):
        await store.put(KEY, b"third", if_absent=True)
    assert await store.get(KEY) == b"first"
    await store.put(KEY, b"replaced", if_absent=False)
    assert await store.get(KEY) == b"replaced"


async def test_concurrent_if_absent_puts_have_one_winner(
    backend: Backend, store: ObjectStore
) -> None:
    if backend.name == "moto":
        pytest.skip("moto checks If-None-Match then puts, without a lock: racy by design")
    results = await asyncio.gather(
        *(store.put(KEY, f"writer {i}".encode()) for i in range(6)), return_exceptions=True
    )
    winners = [i for i, r in enumerate(results) if r is None]
    assert len(winners) == 1, results
    assert all(isinstance(r, ObjectAlreadyExists) for r in results if r is not None)
    assert await store.get(KEY) == f"writer {winners[0]}".encode()


async def test_list_filters_by_key_prefix_in_order(store: ObjectStore) -> None:
    keys = ["c1/t/1/b", "c1/t/1/a", "c1/t/10/a", "c1/t/2/a", "c1/u", "c2/t/1/a"]
    for i, key in enumerate(keys):
        await store.put(key, b"x" * (i + 1))
    listed = await store.list("c1/t/1")
    assert [(o.key, o.size) for o in listed] == [
        ("c1/t/1/a", 2),
        ("c1/t/1/b", 1),
        ("c1/t/10/a", 3),
    ]
    assert [o.key for o in await store.list("c1/t/1/")] == ["c1/t/1/a", "c1/t/1/b"]
    assert [o.key for o in await store.list("c1/")] == sorted(k for k in keys if k[:3] == "c1/")
    assert [o.key for o in await store.list("")] == sorted(keys)
    assert await store.list("nothing/") == []


async def test_list_from_a_key_and_at_most_a_number(backend: Backend, store: ObjectStore) -> None:
    """Listing pages from a key on (``StartAfter``) and bounded (``MaxKeys``), with and without
    the store's own key prefix."""
    keys = [f"c1/p/{i:02d}" for i in range(7)]
    prefixed = await backend.open(prefix="tenant-b")
    for s in (store, prefixed):
        for key in keys:
            await s.put(key, b"v")
        assert [o.key for o in await s.list("c1/p/", limit=3)] == keys[:3]
        assert [o.key for o in await s.list("c1/p/", start_after=keys[2], limit=3)] == keys[3:6]
        assert [o.key for o in await s.list("c1/p/", start_after=keys[5])] == keys[6:]
        assert [o.key for o in await s.list("c1/p/", start_after="c1/p/03x")] == keys[4:]
        assert await s.list("c1/p/", start_after=keys[6], limit=3) == []


async def test_delete_many(store: ObjectStore) -> None:
    keys = [f"c1/d/{i:03d}" for i in range(5)]
    for key in keys:
        await store.put(key, b"v")
    await store.delete_many([*keys[:3], "c1/d/never-existed"])
    assert [o.key for o in await store.list("c1/d/")] == keys[3:]
    with pytest.raises(ObjectNotFound):
        await store.get(keys[0])
    await store.delete_many([])
    await store.delete_many(keys)
    assert await store.list("c1/d/") == []


async def test_prefix_is_applied_and_hidden(backend: Backend, store: ObjectStore) -> None:
    prefixed = await backend.open(prefix="tenant-a/kafscale")
    await prefixed.check()
    await prefixed.put("c1/k", b"inside")
    assert await prefixed.get("c1/k") == b"inside"
    assert [o.key for o in await prefixed.list("c1/")] == ["c1/k"]
    assert [o.key for o in await store.list("")] == ["tenant-a/kafscale/c1/k"]
    assert await store.get("tenant-a/kafscale/c1/k") == b"inside"
    await prefixed.delete_many(["c1/k"])
    assert await store.list("") == []


async def test_pagination_beyond_one_thousand_keys(backend: Backend, store: ObjectStore) -> None:
    if backend.name != "moto":
        pytest.skip("1000+ keys are written to moto only, to keep the suite fast")
    keys = [f"c1/many/{i:05d}" for i in range(1010)]
    await asyncio.gather(*(store.put(key, b"") for key in keys))
    listed = await store.list("c1/many/")
    assert [o.key for o in listed] == keys
    await store.delete_many(keys)  # two DeleteObjects chunks: 1000 + 10
    assert await store.list("c1/many/") == []


async def test_check_fails_clearly_for_a_missing_bucket(backend: Backend) -> None:
    if backend.name == "local":
        pytest.skip("a local directory is created on check(); see the unwritable test")
    missing = await backend.open(bucket=unique_bucket("missing"))
    with pytest.raises(ObjectStoreError, match="does not exist") as caught:
        await missing.check()
    assert backend.base.endpoint is not None
    assert backend.base.endpoint in str(caught.value)
    assert "kafscale-missing-" in str(caught.value)


async def test_check_fails_clearly_for_an_unreachable_endpoint(backend: Backend) -> None:
    if backend.name == "local":
        pytest.skip("no endpoint")
    unreachable = await backend.open(endpoint="http://127.0.0.1:9", timeout_s=5.0)
    with pytest.raises(ObjectStoreError, match=r"127\.0\.0\.1:9"):
        await unreachable.check()


async def test_local_check_fails_clearly_when_not_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    store = LocalDirObjectStore.from_settings(
        StorageSettings(kind=StorageKind.LOCAL, local_dir=blocker / "objects")
    )
    with pytest.raises(ObjectStoreError, match="not writable") as caught:
        await store.check()
    assert str(blocker) in str(caught.value)


async def test_local_check_creates_the_directory(tmp_path: Path) -> None:
    root = tmp_path / "deep" / "objects"
    store = LocalDirObjectStore.from_settings(
        StorageSettings(kind=StorageKind.LOCAL, local_dir=root, prefix="p")
    )
    await store.check()
    assert (root / "p").is_dir()
    await store.put("k", b"v")
    assert (root / "p" / "k").read_bytes() == b"v"
    assert await store.list("") == [ObjectInfo(key="k", size=1)]


async def test_local_rejects_keys_escaping_the_root(tmp_path: Path) -> None:
    store = LocalDirObjectStore(tmp_path)
    for key in ["../x", "/abs", "a//b", "a/./b", ".tmp/x", ""]:
        with pytest.raises(ValueError):
            await store.put(key, b"v")


def entries(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


async def test_local_deleting_the_last_objects_removes_their_folders(tmp_path: Path) -> None:
    """A deleted topic leaves no empty folders in ``kafscale local``'s data directory."""
    store = LocalDirObjectStore(tmp_path)
    gone = ["c/topics/t/id1/0/a.kfs", "c/topics/t/id1/1/b.kfs"]
    kept = "c/topics/u/id2/0/c.kfs"
    for key in [*gone, kept]:
        await store.put(key, b"v")
    await store.delete_many(gone)
    assert not (tmp_path / "c" / "topics" / "t").exists()
    assert (tmp_path / kept).read_bytes() == b"v"
    await store.delete_many([kept])
    assert entries(tmp_path) == [".tmp"]


async def test_local_write_recreates_a_folder_pruned_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention deletes a partition's last segments while its flush writes the next one: a
    delete may remove the (then empty) folder between the write's mkdir and its link. Played
    here by removing the folder right before the first link; the write still lands."""
    store = LocalDirObjectStore(tmp_path)
    real_link = os.link
    pruned: list[str] = []

    def link_after_a_prune(source: Any, target: Any) -> None:
        if not pruned:
            pruned.append(os.path.dirname(target))
            os.rmdir(pruned[0])
        real_link(source, target)

    monkeypatch.setattr(os, "link", link_after_a_prune)
    await store.put("c/p/0001", b"v")
    assert pruned and await store.get("c/p/0001") == b"v"


async def test_local_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    """Every PUT goes through a temporary file: none is left behind, whether the object was
    written, refused as existing, or the write failed, and two stores on one directory (two
    brokers of ``kafscale local``) never pick the same temporary name."""
    first, second = LocalDirObjectStore(tmp_path), LocalDirObjectStore(tmp_path)
    await first.check()
    await asyncio.gather(
        *(
            store.put(f"t/{i}-{n}", b"x" * 70_000)
            for i, store in enumerate((first, second))
            for n in range(20)
        )
    )
    with pytest.raises(ObjectAlreadyExists):
        await second.put("t/0-3", b"y")
    assert await first.get("t/0-3") == b"x" * 70_000
    assert sorted(os.listdir(tmp_path / ".tmp")) == []
    assert len(await first.list("t/")) == 40
