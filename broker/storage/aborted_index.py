"""Aborted-transaction index objects: their format, and reading a range's aborted transactions.

An object holds aborted transactions the partition state spilled (see
``metadata.aborted_index``), big-endian::

    magic "ATX\\0" (4) | version 1 (u16) | reserved 0 (u16) | count (i32)
    count x (producer id i64, first offset i64, abort marker offset i64), oldest marker first
    CRC32C of the entries (u32)

Objects are immutable (written once, conditionally, under a key naming the writer's epoch), so
readers cache them like segment indexes: a reader of old data GETs each object once.
"""

from __future__ import annotations

import struct
from typing import Protocol

import crc32c

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import AbortedSpill, overlapping, refs_in_range
from kafscale.broker.metadata.partition_state import AbortedTxn, PartitionState, TxnIndexRef
from kafscale.broker.protocol.errors import StorageFailure
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError

MAGIC = b"ATX\0"
VERSION = 1
_HEADER = struct.Struct(">4sHHi")
_ENTRY = struct.Struct(">qqq")
_CRC = struct.Struct(">I")


class AbortedIndexCorrupt(ValueError):
    """The bytes are not an aborted-transaction index object of a known version."""


class BytesCache(Protocol):
    """Where immutable objects are kept once read (``SegmentCache`` on a broker)."""

    def get(self, key: str) -> bytes | memoryview | None: ...

    def put(self, key: str, body: bytes | memoryview) -> None: ...


def encode_aborted_index(entries: tuple[AbortedTxn, ...] | list[AbortedTxn]) -> bytes:
    body = b"".join(_ENTRY.pack(*entry) for entry in entries)
    return _HEADER.pack(MAGIC, VERSION, 0, len(entries)) + body + _CRC.pack(crc32c.crc32c(body))


def decode_aborted_index(data: bytes | memoryview) -> list[AbortedTxn]:
    if len(data) < _HEADER.size + _CRC.size:
        raise AbortedIndexCorrupt(f"{len(data)} bytes is too short")
    magic, version, _, count = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise AbortedIndexCorrupt(f"magic {magic!r} version {version} is not known")
    end = _HEADER.size + count * _ENTRY.size
    if count < 0 or len(data) != end + _CRC.size:
        raise AbortedIndexCorrupt(f"{count} entries do not fit {len(data)} bytes")
    body = bytes(data[_HEADER.size : end])
    if crc32c.crc32c(body) != _CRC.unpack_from(data, end)[0]:
        raise AbortedIndexCorrupt("CRC32C mismatch")
    return [AbortedTxn(*entry) for entry in _ENTRY.iter_unpack(body)]


def object_key(cluster: str, topic: str, topic_id: str, partition: int, ref: TxnIndexRef) -> str:
    return keys.aborted_index_object_key(
        cluster, topic, topic_id, partition, ref.first_offset, ref.last_offset, ref.epoch
    )


async def aborted_in_range(
    store: ObjectStore,
    cache: BytesCache,
    cluster: str,
    where: tuple[str, str, int],
    state: PartitionState,
    start: int,
    end: int,
) -> list[AbortedTxn]:
    """Every aborted transaction of the partition ``where`` (topic, topic id, partition) with
    records in [start, end), oldest first: those of the index objects overlapping the range
    (from the cache, else one GET each) and the state's own. StorageFailure if an object
    cannot be read: answering without it would hand aborted records to the reader."""
    if end <= start:
        return []  # no records to drop (a long-poll at the LSO): nothing to look up
    found: list[AbortedTxn] = []
    for ref in refs_in_range(state, start, end):
        entries = await read_index(store, cache, object_key(cluster, *where, ref))
        found += overlapping(entries, start, end)
    return found + overlapping(state.aborted_txns, start, end)


async def read_index(store: ObjectStore, cache: BytesCache, key: str) -> list[AbortedTxn]:
    """The entries of the index object at ``key``: from the cache, else one GET (then cached).
    StorageFailure if it cannot be read."""
    data = cache.get(key)
    try:
        if data is None:
            data = await store.get(key)
        entries = decode_aborted_index(data)
    except (ObjectStoreError, AbortedIndexCorrupt) as exc:
        raise StorageFailure(f"aborted-transaction index {key}: {exc}") from exc
    cache.put(key, data)
    return entries


async def write_spill(
    store: ObjectStore,
    cache: BytesCache,
    cluster: str,
    where: tuple[str, str, int],
    spill: AbortedSpill,
) -> None:
    """PUT the object ``spill`` describes: the entries of the objects it absorbs (read, most
    likely from the cache: this owner wrote them), then its own. Cached once written."""
    entries: list[AbortedTxn] = []
    for ref in spill.absorbed:
        entries += await read_index(store, cache, object_key(cluster, *where, ref))
    data = encode_aborted_index([*entries, *spill.entries])
    key = object_key(cluster, *where, spill.ref)
    await store.put(key, data)
    cache.put(key, data)
