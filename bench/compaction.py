"""Log compaction: what one pass costs, on the local-directory store and on moto's S3.

    .venv/bin/python bench/compaction.py [--segments 40] [--records 2500] [--keys 1000]

Writes ``--segments`` plain segments of ``--records`` zstd-compressed records each (100-byte
values over ``--keys`` keys, the pattern of a changelog or Connect's offsets topic), then runs
the broker's own cleaner (``storage.cleaner.Cleaner``) on them: a first pass (everything but the
newest segment) and a second one after as many new segments again (it re-reads the first
pass's cleaned objects). The etcd commit is left out (one transaction per pass; see
``bench/produce_rounds.py`` for etcd commit costs): the pass's commit is applied in memory.

Prints per pass: offsets/s cleaned (the offsets below the pass's end / pass seconds), GETs,
PUTs and LISTs, bytes of the inputs and of the cleaned objects. Quote it with the load average
(printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import zstandard

sys.path.insert(0, str(Path(__file__).parent))

from _cluster import MotoProcess, storage_settings

from kafscale.broker.config import LogSettings, StorageKind, StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.partition_state import (
    Cleaned,
    PartitionState,
    SegmentRef,
    commit_segment,
)
from kafscale.broker.protocol.batch_encoder import encode_batch, encode_record
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.cleaner import Cleaner, PassResult
from kafscale.broker.storage.factory import open_object_store
from kafscale.broker.storage.object_store import ObjectInfo, ObjectStore
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.segments import encode_segment

CLUSTER, TOPIC, TOPIC_ID = "bench", "changelog", "0" * 32
ZSTD = 4


class CountingStore:
    """The store, with its calls counted."""

    def __init__(self, store: ObjectStore) -> None:
        self._store = store
        self.calls = {"get": 0, "put": 0, "list": 0, "delete": 0}

    async def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes:
        self.calls["get"] += 1
        return await self._store.get(key, start=start, end=end)

    async def put(self, key: str, data: Any, *, if_absent: bool = True) -> None:
        self.calls["put"] += 1
        await self._store.put(key, data, if_absent=if_absent)

    async def list(
        self, prefix: str, *, start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectInfo]:
        self.calls["list"] += 1
        return await self._store.list(prefix, start_after=start_after, limit=limit)

    async def delete_many(self, doomed: list[str]) -> None:
        self.calls["delete"] += 1
        await self._store.delete_many(doomed)

    def reset(self) -> None:
        self.calls = dict.fromkeys(self.calls, 0)


class Manager:
    """What the cleaner needs of ``LogManager``: the owned partitions and a commit (applied in
    memory here)."""

    def __init__(self, owned: OwnedPartition) -> None:
        self.owned = {owned.tp: owned}

    async def commit_cleaned(
        self, owned: OwnedPartition, cleaned: Cleaned, was: Any, last_removed_abort: int = -1
    ) -> bool:
        owned.state = replace(owned.state, cleaned=cleaned)
        return True


class View:
    def __init__(self) -> None:
        config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
        self.topics = {TOPIC: TopicInfo(TOPIC, TOPIC_ID, 1, config)}


def segment(base: int, records: int, key_count: int, rng: random.Random) -> bytes:
    body = b"".join(
        encode_record(i, 0, b"key-%06d" % rng.randrange(key_count), rng.randbytes(100))
        for i in range(records)
    )
    batch = encode_batch(
        zstandard.compress(body),
        records,
        base_timestamp=1,
        max_timestamp=1,
        attributes=ZSTD,
        base_offset=base,
    )
    return bytes(encode_segment([batch], int(time.time() * 1000), 4096).segment)


async def write_segments(
    store: ObjectStore, owned: OwnedPartition, count: int, records: int, key_count: int
) -> int:
    rng = random.Random(owned.state.high_watermark)
    written = 0
    for _ in range(count):
        base = owned.state.high_watermark
        data = segment(base, records, key_count, rng)
        key = keys.segment_object_key(CLUSTER, TOPIC, TOPIC_ID, 0, base, 0)
        await store.put(key, data)
        written += len(data)
        ref = SegmentRef(base, base + records - 1, 0, len(data), 1)
        owned.state = commit_segment(owned.state, ref, {})
    return written


async def run_on(store: ObjectStore, label: str, args: argparse.Namespace) -> None:
    counting = CountingStore(store)
    state = PartitionState(leader_epoch=0, epochs=((0, 0),))
    owned = OwnedPartition(TOPIC, 0, TOPIC_ID, state, 1, 1)
    settings = LogSettings(cleaner_delete_delay_s=0)
    cleaner = Cleaner(
        settings,
        CLUSTER,
        Manager(owned),
        View(),
        counting,
        SegmentCache(0),
        {},  # type: ignore[arg-type]
    )
    try:
        for number in (1, 2):
            await write_segments(store, owned, args.segments, args.records, args.keys)
            counting.reset()
            started = time.perf_counter()
            result = await cleaner.clean_partition(owned, int(time.time() * 1000))
            seconds = time.perf_counter() - started
            report(label, number, result, seconds, counting.calls, owned, args)
    finally:
        await cleaner.close()


def report(
    label: str,
    number: int,
    result: PassResult | None,
    seconds: float,
    calls: dict[str, int],
    owned: OwnedPartition,
    args: argparse.Namespace,
) -> None:
    if result is None:
        print(f"{label} pass {number}: nothing to clean")
        return
    print(
        f"{label:5} pass {number}: {result.cleaned.upto / seconds:>10,.0f} offsets/s "
        f"({seconds:.2f} s, upto {result.cleaned.upto} of HW {owned.state.high_watermark}); "
        f"GET {calls['get']}, PUT {calls['put']}, LIST {calls['list']}; "
        f"bytes {result.bytes_read:,} -> {result.bytes_written:,}"
    )


async def main(args: argparse.Namespace) -> None:
    print(f"load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as directory:
        local = open_object_store(
            StorageSettings(kind=StorageKind.LOCAL, local_dir=Path(directory))
        )
        await run_on(local, "local", args)
        await local.close()
    moto = MotoProcess().start()
    try:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=moto.url,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="compaction-bench")
        s3 = open_object_store(storage_settings(moto.url, "compaction-bench"))
        await run_on(s3, "moto", args)
        await s3.close()
    finally:
        moto.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=40)
    parser.add_argument("--records", type=int, default=2500)
    parser.add_argument("--keys", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
