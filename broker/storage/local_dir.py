"""The local-directory adapter of the object-store port (``storage.kind=local``).

The embedded default for ``kafscale local`` and single-machine use: each object is one file
under ``local_dir/<prefix>/<key>``. It keeps the same guarantees as the S3 adapter:

* writes are atomic: data goes to a temporary file (fsynced) that is then published under its
  key, so a reader never sees half an object;
* ``if_absent`` publishes with ``os.link``, which fails if the name exists, so an existing
  object is never replaced, even by a concurrent writer in another process;
* the directory entry is fsynced too, so an acknowledged write survives a crash;
* deleting the last object of a directory removes the directory (and empty parents), so a
  deleted topic leaves no folders; a write racing such a removal creates it again.

Temporary files live in ``.tmp/`` under the root, on the same file system (``link`` and
``replace`` need that), and are never listed. File I/O runs through ``asyncio.to_thread``,
bounded by a semaphore and a deadline like every other store call.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kafscale.broker.storage.object_store import (
    ObjectAlreadyExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
)
from kafscale.broker.store_settings import StorageSettings

T = TypeVar("T")

TMP_DIR = ".tmp"
_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
PUBLISH_ATTEMPTS = 3


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalDirObjectStore:
    """ObjectStore over a directory tree."""

    def __init__(self, root: Path, *, timeout_s: float = 30.0, max_concurrency: int = 16) -> None:
        self._root = root
        self._tmp = root / TMP_DIR
        self._tmp_prefix = os.path.join(self._tmp, f"{uuid.uuid4().hex[:12]}-")
        self._tmp_counter = itertools.count()
        self._timeout_s = timeout_s
        self._semaphore = asyncio.Semaphore(max_concurrency)

    @classmethod
    def from_settings(cls, settings: StorageSettings) -> LocalDirObjectStore:
        prefix = settings.prefix.strip("/")
        root = settings.local_dir / prefix if prefix else settings.local_dir
        return cls(root, timeout_s=settings.timeout_s, max_concurrency=settings.max_concurrency)

    @property
    def root(self) -> Path:
        return self._root

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            async with asyncio.timeout(self._timeout_s), self._semaphore:
                return await asyncio.to_thread(fn, *args)
        except TimeoutError as exc:
            raise ObjectStoreError(f"{self._root} did not answer in {self._timeout_s}s") from exc

    def _path(self, key: str) -> Path:
        """The file of ``key``; keys that would escape the root or hit the temp dir are bugs."""
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid object key {key!r}")
        if parts[0] == TMP_DIR:
            raise ValueError(f"object keys may not start with {TMP_DIR}/: {key!r}")
        return self._root.joinpath(*parts)

    # --- the port -----------------------------------------------------------------------------

    async def check(self) -> None:
        """Create the directory and prove it is writable (a probe file, then removed)."""
        await self._run(self._check_sync)

    def _check_sync(self) -> None:
        probe = self._tmp / f"probe-{uuid.uuid4().hex}"
        try:
            self._tmp.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise ObjectStoreError(
                f"object directory {self._root} is not writable: {exc.strerror or exc}"
            ) from exc

    async def put(
        self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = True
    ) -> None:
        await self._run(self._put_sync, self._path(key), key, data, if_absent)

    def _put_sync(
        self, path: Path, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> None:
        """In a worker thread. Every system call here releases the GIL and takes it back,
        waiting for the event loop when it holds it: a round's three PUTs made ~25 such
        hand-overs (futex calls of the loop's thread, strace), so the file is written with
        plain ``os`` calls (``open()`` adds fstat, ioctl and a flush) under a name that costs
        no ``getrandom``."""
        tmp = self._write_temp(data)
        try:
            for attempt in range(PUBLISH_ATTEMPTS + 1):
                try:
                    if if_absent:
                        os.link(tmp, path)  # fails if the name exists: never replaces
                    else:
                        os.replace(tmp, path)
                    break
                except FileNotFoundError:
                    # The directory is new, or a delete pruned it (then empty) meanwhile. Made
                    # only when missing: a mkdir per PUT was ~5 % of a small round's CPU.
                    if attempt == PUBLISH_ATTEMPTS:
                        raise
                    path.parent.mkdir(parents=True, exist_ok=True)
            _fsync_dir(path.parent)
        except FileExistsError as exc:
            raise ObjectAlreadyExists(f"{key!r} already exists in {self._root}") from exc
        except OSError as exc:
            raise ObjectStoreError(f"cannot write {key!r} in {self._root}: {exc}") from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _write_temp(self, data: bytes | bytearray | memoryview) -> str:
        """A new, fsynced file with ``data`` in the temp dir. Its name is unique across the
        processes sharing the directory: a per-store random prefix and a counter."""
        tmp = f"{self._tmp_prefix}{next(self._tmp_counter)}"
        try:
            try:
                fd = os.open(tmp, _CREATE_NEW, 0o666)
            except FileNotFoundError:  # the temp dir is made by check(); again if removed
                self._tmp.mkdir(parents=True, exist_ok=True)
                fd = os.open(tmp, _CREATE_NEW, 0o666)
            try:
                view = memoryview(data).cast("B")
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ObjectStoreError(f"cannot write to {self._tmp}: {exc}") from exc
        return tmp

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        if start < 0 or (end is not None and end < 0):
            raise ValueError("byte range bounds must not be negative")
        return await self._run(self._get_sync, self._path(key), key, start, end)

    def _get_sync(self, path: Path, key: str, start: int, end: int | None) -> bytes:
        try:
            with open(path, "rb") as file:
                file.seek(start)
                return file.read() if end is None else file.read(max(0, end - start))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"no object {key!r} in {self._root}") from exc
        except OSError as exc:
            raise ObjectStoreError(f"cannot read {key!r} in {self._root}: {exc}") from exc

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        found = await self._run(self._list_sync, prefix)
        if start_after is not None:
            found = [info for info in found if info.key > start_after]
        return found if limit is None else found[:limit]

    def _list_sync(self, prefix: str) -> builtins.list[ObjectInfo]:
        """Walk only the deepest directory that can hold keys starting with ``prefix``."""
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._root.joinpath(*folder.split("/")) if folder else self._root
        found: builtins.list[ObjectInfo] = []
        for directory, subdirs, files in os.walk(start):
            here = Path(directory)
            if here == self._root:
                subdirs[:] = [d for d in subdirs if d != TMP_DIR]
            base = here.relative_to(self._root).as_posix()
            for name in files:
                key = name if base == "." else f"{base}/{name}"
                size = self._size(here / name) if key.startswith(prefix) else None
                if size is not None:
                    found.append(ObjectInfo(key=key, size=size))
        found.sort(key=lambda info: info.key)
        return found

    @staticmethod
    def _size(path: Path) -> int | None:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return None  # deleted while listing

    async def delete_many(self, keys: builtins.list[str]) -> None:
        paths = [self._path(key) for key in keys]
        await self._run(self._delete_sync, paths)

    def _delete_sync(self, paths: builtins.list[Path]) -> None:
        touched: set[Path] = set()
        try:
            for path in paths:
                path.unlink(missing_ok=True)
                touched.add(path.parent)
            for directory in {self._prune(directory) for directory in touched}:
                if directory.exists():  # a later prune may have removed it after all
                    _fsync_dir(directory)
        except OSError as exc:
            raise ObjectStoreError(f"cannot delete in {self._root}: {exc}") from exc

    def _prune(self, directory: Path) -> Path:
        """Remove ``directory`` and its parents while they are empty (a deleted topic leaves no
        folders behind); the first one left standing, whose entry changed."""
        while directory != self._root:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass  # pruned by another delete meanwhile
            except OSError:
                return directory  # not empty
            directory = directory.parent
        return directory

    async def close(self) -> None:
        """Nothing to release: files are opened and closed per call."""
