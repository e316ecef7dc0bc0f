"""``kafscale broker`` with timing probes, for ``produce_consume.py --timings``.

Runs the unchanged broker CLI after wrapping a few methods at run time (the broker code is not
modified): every flush round, every segment upload, every etcd commit transaction, every S3 call
(time queued for a worker thread, time inside boto3, time until the event loop resumed the
caller) and the event loop's lag (how late a 10 ms sleep wakes up). Each observation is one JSON
line appended to the file named by ``KAFSCALE_BENCH_TIMINGS``; times are ``time.monotonic()``
seconds, which on Linux is one clock for every process, so the bench can cut them into phases.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kafscale.broker import cli
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.storage.flush_commit import FlushCommitter
from kafscale.broker.storage.flush_upload import SegmentUploader
from kafscale.broker.storage.flusher import Flusher
from kafscale.broker.storage.log_manager import LogManager
from kafscale.broker.storage.s3 import S3ObjectStore

_lock = threading.Lock()
_out: list[Any] = []
now = time.monotonic


def emit(kind: str, **fields: Any) -> None:
    line = json.dumps({"kind": kind, **fields})
    with _lock:
        _out[0].write(line + "\n")


def expect(method: Callable[..., Any], parameters: list[str]) -> None:
    """Fail at start-up, not with a wrong figure, when the broker code changed shape."""
    found = list(inspect.signature(method).parameters)
    if found != parameters:
        raise RuntimeError(f"{method.__qualname__} takes {found}, the probe expects {parameters}")


def wrap_flush_round() -> None:
    original = Flusher._round
    expect(original, ["self", "works", "previous", "committed", "handed_off"])

    async def _round(self: Flusher, works: list[Any], *args: Any) -> Any:
        began = now()
        try:
            return await original(self, works, *args)
        finally:
            emit("round", start=began, end=now())

    Flusher._round = _round  # type: ignore[method-assign]


def wrap_upload() -> None:
    original = SegmentUploader.upload
    expect(original, ["self", "work", "reservations"])

    async def upload(self: SegmentUploader, work: Any, reservations: Any) -> Any:
        began = now()
        size = sum(len(b.data) for b in work.batches)
        try:
            return await original(self, work, reservations)
        finally:
            emit("upload", start=began, end=now(), bytes=size, batches=len(work.batches))

    SegmentUploader.upload = upload  # type: ignore[method-assign]


def wrap_commit() -> None:
    original = FlushCommitter._commit
    expect(original, ["self", "commits"])

    async def _commit(self: FlushCommitter, commits: list[Any]) -> Any:
        began = now()
        try:
            return await original(self, commits)
        finally:
            emit("commit", start=began, end=now(), partitions=len(commits))

    FlushCommitter._commit = _commit  # type: ignore[method-assign]


def wrap_txn() -> None:
    original = Etcd.txn

    async def txn(self: Etcd, *args: Any, **kwargs: Any) -> Any:
        began = now()
        try:
            return await original(self, *args, **kwargs)
        finally:
            emit("txn", start=began, end=now())

    Etcd.txn = txn  # type: ignore[method-assign]


def wrap_s3() -> None:
    original = S3ObjectStore._call
    expect(original, ["self", "fn", "args", "kwargs"])

    async def _call(self: S3ObjectStore, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        name = getattr(fn, "__name__", "call")
        body = kwargs.get("Body")
        size = len(body) if isinstance(body, bytes | bytearray) else 0
        box: dict[str, float] = {}

        def timed(*a: Any, **k: Any) -> Any:
            box["start"] = now()
            try:
                return fn(*a, **k)
            finally:
                box["end"] = now()

        queued = now()
        try:
            return await original(self, timed, *args, **kwargs)
        finally:
            emit(
                "s3",
                op=name,
                key=str(kwargs.get("Key", "")),
                bytes=size,
                queued=queued,
                start=box.get("start", queued),
                end=box.get("end", queued),
                resumed=now(),
            )

    S3ObjectStore._call = _call  # type: ignore[method-assign]


def wrap_start() -> None:
    """Start a loop-lag probe with the flush loop."""
    original = LogManager.start
    expect(original, ["self"])

    async def start(self: LogManager) -> None:
        await original(self)
        self._bench_lag_task = asyncio.create_task(_lag_probe())  # type: ignore[attr-defined]

    LogManager.start = start  # type: ignore[method-assign]


async def _lag_probe() -> None:
    while True:
        began = now()
        await asyncio.sleep(0.01)
        emit("lag", start=began, lag=now() - began - 0.01)


def watch_gc() -> None:
    """Log every garbage collection: a full one stops the event loop as long as it runs."""
    began: dict[str, float] = {}

    def callback(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began["t"] = now()
        elif "t" in began:
            start = began.pop("t")
            emit("gc", start=start, end=now(), generation=info["generation"])

    gc.callbacks.append(callback)


def install(path: str) -> None:
    _out.append(open(path, "a", buffering=1))  # noqa: SIM115 (open for the process's life)
    wrap_flush_round()
    wrap_upload()
    wrap_commit()
    wrap_txn()
    wrap_s3()
    wrap_start()
    watch_gc()


def main() -> int:
    install(os.environ["KAFSCALE_BENCH_TIMINGS"])
    return cli.main(sys.argv[1:] or ["broker"])


if __name__ == "__main__":
    sys.exit(main())
