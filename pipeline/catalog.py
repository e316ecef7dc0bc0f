"""The driver's view of a cluster: topics and committed partition states from etcd, committed
segment objects from the store. A thin I/O shell over the broker's own adapters and key
builders; every decision on what it returns is in ``planning``.

A fenced writer's uploads are told from committed segments the way brokers tell them: by the
writer epoch in the object's name and the partition's epoch history
(``partition_state.is_committed_segment``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import refs_in_range
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import BadEndpoint
from kafscale.broker.metadata.etcd_connect import connect_etcd
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.partition_state import (
    PartitionState,
    is_committed_segment,
    time_scan_start,
)
from kafscale.broker.metadata.partition_txns import last_stable_offset
from kafscale.broker.metadata.topic_info import TopicInfo
from kafscale.broker.protocol.errors import StorageFailure
from kafscale.broker.storage.aborted_index import aborted_in_range
from kafscale.broker.storage.compaction_plan import is_compacted
from kafscale.broker.storage.factory import open_object_store
from kafscale.broker.storage.object_store import ObjectNotFound, ObjectStore, ObjectStoreError
from kafscale.broker.storage.segments import SegmentCorrupt, decode_segment
from kafscale.broker.store_settings import EtcdSettings
from kafscale.pipeline.options import Connection, Subscription, store_identity
from kafscale.pipeline.planning import PartitionView, SegmentObject

T = TypeVar("T")


class SourceUnavailable(RuntimeError):
    """etcd or the object store cannot be reached, or the subscription names unknown topics."""


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    view: PartitionView
    state: PartitionState


def view_of(
    topic: str, topic_id: str, partition: int, state: PartitionState, compacted: bool
) -> PartitionView:
    """What planning needs of a committed state. ``compacted``: the topic's configs say so; a
    partition that was cleaned before counts too (its cleanup policy may come from the
    brokers' defaults, which the driver does not see)."""
    return PartitionView(
        topic,
        topic_id,
        partition,
        state.log_start_offset,
        last_stable_offset(state),
        state.aborted_txns,
        state.cleaned.upto if state.cleaned is not None else 0,
        state.cleaned.generation if state.cleaned is not None else -1,
        compacted or state.cleaned is not None,
    )


class Catalog:
    """Open with ``async with Catalog(connection)``: one etcd client and one store.

    The store is kept for the thread's later catalogs on the same loop (``run`` keeps one loop
    per thread): building a boto3 client costs 0.1-0.2 s, paid otherwise by every query's
    planning in Spark's (reused) planner process."""

    def __init__(self, connection: Connection, store: ObjectStore | None = None) -> None:
        """``store``: one the caller opened and keeps (an executor's), used and left open."""
        self._connection = connection
        self._etcd: Etcd | None = None
        self._store: ObjectStore | None = store
        self._borrowed = store is not None

    async def __aenter__(self) -> Catalog:
        settings = self._connection.etcd
        endpoints = settings.endpoints
        try:  # twice: one slow handshake on a loaded driver host is not an outage
            self._etcd = await connect_etcd(settings, attempts=2)
        except (MetadataError, BadEndpoint) as exc:
            raise SourceUnavailable(
                f"etcd at {', '.join(endpoints)} cannot be reached: {exc}{_tls_hint(settings)}"
            ) from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None and not self._borrowed and not _is_kept(self._store):
            await self._store.close()
        if self._etcd is not None:
            await self._etcd.close()

    async def _store_opened(self) -> ObjectStore:
        if self._store is None:
            cache = _kept_stores()
            cache_key = store_identity(self._connection.storage)
            store = cache.get(cache_key) if cache is not None else None
            if store is None:
                store = open_object_store(self._connection.storage)
                try:
                    await store.check()
                except ObjectStoreError as exc:
                    await store.close()
                    raise SourceUnavailable(f"object store not usable: {exc}") from exc
                if cache is not None:
                    cache[cache_key] = store
            self._store = store
        return self._store

    async def topics(self) -> dict[str, TopicInfo]:
        assert self._etcd is not None
        prefix = keys.topics_prefix(self._connection.cluster)
        entries = await self._guard(lambda: self._etcd.get_prefix(prefix))  # type: ignore[union-attr]
        found = {}
        for entry in entries:
            name = entry.key[len(prefix) :]
            if "/" not in name:
                found[name] = TopicInfo.from_json(name, entry.value)
        return found

    async def partitions(
        self, subscription: Subscription, *, require_topics: bool
    ) -> list[PartitionEntry]:
        """The subscribed partitions with their committed states, sorted by topic and number.

        ``require_topics``: a topic named by ``subscribe`` or ``assign`` must exist."""
        topics = await self.topics()
        wanted = [info for name, info in sorted(topics.items()) if subscription.matches(name)]
        if require_topics:
            named = set(subscription.topics) | {t for t, _ in subscription.assign}
            missing = sorted(named - set(topics))
            if missing:
                raise SourceUnavailable(
                    f"unknown topic(s) {', '.join(missing)} in cluster {self._connection.cluster!r}"
                )
        entries = []
        for info in wanted:
            numbers = range(info.partitions)
            if subscription.assign:
                numbers = sorted(p for t, p in subscription.assign if t == info.name)  # type: ignore[assignment]
                bad = [p for p in numbers if not 0 <= p < info.partitions]
                if bad and require_topics:
                    raise SourceUnavailable(
                        f"assign: topic {info.name} has {info.partitions} partitions, "
                        f"not {', '.join(map(str, bad))}"
                    )
            states = await self._states(info.name)
            compacted = is_compacted(info.configs)
            for partition in numbers:
                state = states.get(partition, PartitionState(high_watermark=0))
                view = view_of(info.name, info.topic_id, partition, state, compacted)
                entries.append(PartitionEntry(view, state))
        return entries

    async def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        """One partition's committed state (one etcd read), None if there is none (the topic
        was deleted)."""
        assert self._etcd is not None
        key = keys.partition_state_key(self._connection.cluster, topic, partition)
        entry = await self._guard(lambda: self._etcd.get(key))  # type: ignore[union-attr]
        return None if entry is None else PartitionState.from_json(entry.value)

    async def topic_id(self, topic: str) -> str | None:
        """The id of the topic named ``topic`` now (one etcd read), None if there is none."""
        assert self._etcd is not None
        key = keys.topic_key(self._connection.cluster, topic)
        entry = await self._guard(lambda: self._etcd.get(key))  # type: ignore[union-attr]
        return None if entry is None else TopicInfo.from_json(topic, entry.value).topic_id

    async def _states(self, topic: str) -> dict[int, PartitionState]:
        prefix = keys.partition_states_prefix(self._connection.cluster, topic)
        entries = await self._guard(lambda: self._etcd.get_prefix(prefix))  # type: ignore[union-attr]
        states = {}
        for entry in entries:
            tail = entry.key[len(prefix) :]
            if tail.isdigit():
                states[int(tail)] = PartitionState.from_json(entry.value)
        return states

    async def segments(self, entry: PartitionEntry, from_offset: int) -> list[SegmentObject]:
        """The committed segments of a partition that may hold ``from_offset`` or later, by
        base. The listing starts at a base known to be committed at or below the offset (a time
        mark or a recent segment of the state), not at the partition's first object."""
        view, state = entry.view, entry.state
        if from_offset >= view.high_watermark:
            return []
        store = await self._store_opened()
        prefix = keys.partition_object_prefix(
            self._connection.cluster, view.topic, view.topic_id, view.partition
        )
        known = [mark for mark, _ in state.time_marks if mark <= from_offset]
        known += [ref.base for ref in state.segments if ref.base <= from_offset]
        after = keys.objects_from(prefix, max(known)) if known else None
        try:
            listed = await store.list(prefix, start_after=after)
        except ObjectStoreError as exc:
            raise SourceUnavailable(f"cannot list {prefix}: {exc}") from exc
        found = await self._cleaned_objects(entry, from_offset)
        for info in listed:
            parsed = keys.parse_object_name(info.key)
            if parsed is None or parsed[2] != "kfs":
                continue
            base, epoch, _ = parsed
            if is_committed_segment(state, base, epoch):
                found.append(SegmentObject(base, epoch, info.size))
        return sorted(found, key=lambda s: s.base)

    async def _cleaned_objects(
        self, entry: PartitionEntry, from_offset: int
    ) -> list[SegmentObject]:
        """The committed cleaned objects of a compacted partition, when ``from_offset`` lies in
        the cleaned range (one listing of the generation's prefix: about one object per
        ``segment.bytes`` of cleaned data). Plain segments below the range are superseded."""
        view, cleaned = entry.view, entry.state.cleaned
        if cleaned is None or from_offset >= cleaned.upto:
            return []
        prefix = keys.cleaned_pass_prefix(
            self._connection.cluster,
            view.topic,
            view.topic_id,
            view.partition,
            cleaned.generation,
            cleaned.epoch,
        )
        store = await self._store_opened()
        try:
            listed = await store.list(prefix)
        except ObjectStoreError as exc:
            raise SourceUnavailable(f"cannot list {prefix}: {exc}") from exc
        found = []
        for info in listed:
            name = info.key[len(prefix) :]
            if name.endswith(".kfs") and name[:-4].isdigit() and int(name[:-4]) < cleaned.upto:
                found.append(
                    SegmentObject(int(name[:-4]), cleaned.epoch, info.size, cleaned.generation)
                )
        return found

    async def offset_for_timestamp(self, entry: PartitionEntry, timestamp_ms: int) -> int:
        """``startingTimestamp``: the first offset whose record is at or after the time, else
        the high watermark (as Kafka's ListOffsets). Scans from the partition's time mark below
        the time, decoding segments on the driver."""
        import numpy as np  # here, with the decoder: only ``startingTimestamp`` needs them

        from kafscale.pipeline.decode import decode_records

        view = entry.view
        offset = time_scan_start(entry.state, timestamp_ms)
        store = await self._store_opened()
        for segment in await self.segments(entry, offset):
            key = segment.key(self._connection.cluster, view.topic, view.topic_id, view.partition)
            try:
                body = decode_segment(await store.get(key)).body
            except ObjectNotFound:
                continue  # deleted by retention meanwhile
            except (ObjectStoreError, SegmentCorrupt) as exc:
                raise SourceUnavailable(f"cannot read {key}: {exc}") from exc
            rows = decode_records(
                body,
                view.topic,
                view.partition,
                max(offset, view.log_start),
                view.high_watermark,
                False,
            )
            if rows is None:
                continue
            times = rows.column("timestamp").cast("int64").to_numpy() // 1000
            later = np.flatnonzero(times >= timestamp_ms)
            if later.size:
                return int(rows.column("offset")[int(later[0])].as_py())
        return view.high_watermark

    async def with_aborted(self, entry: PartitionEntry, start: int, end: int) -> PartitionEntry:
        """``entry`` whose view lists every aborted transaction with records in [start, end):
        the state's own and those spilled to index objects (GET once per driver process, then
        cached; no GET at all when the range lies above every spilled one)."""
        view, state = entry.view, entry.state
        if not refs_in_range(state, start, end):
            return entry
        store = await self._store_opened()
        where = (view.topic, view.topic_id, view.partition)
        try:
            aborted = await aborted_in_range(
                store, _INDEXES, self._connection.cluster, where, state, start, end
            )
        except StorageFailure as exc:
            raise SourceUnavailable(str(exc)) from exc
        return PartitionEntry(replace(view, aborted=tuple(aborted)), state)

    async def _guard(self, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except MetadataError as exc:
            raise SourceUnavailable(f"etcd did not answer: {exc}") from exc


class _IndexCache:
    """The aborted-transaction index objects read on this driver (immutable, so never stale),
    the most recently used up to ``MAX_CACHED_INDEX_BYTES``; planner threads share it."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, bytes | memoryview] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | memoryview | None:
        with self._lock:
            body = self._entries.get(key)
            if body is not None:
                self._entries.move_to_end(key)
            return body

    def put(self, key: str, body: bytes | memoryview) -> None:
        with self._lock:
            previous = self._entries.pop(key, None)
            self._bytes -= len(previous) if previous is not None else 0
            self._entries[key] = body
            self._bytes += len(body)
            while len(self._entries) > 1 and self._bytes > MAX_CACHED_INDEX_BYTES:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted)


MAX_CACHED_INDEX_BYTES = 64 * 1024 * 1024  # objects hold at most 1.5 MiB (64 Ki entries)
_INDEXES = _IndexCache()


def _tls_hint(settings: EtcdSettings) -> str:
    """What to check when an https:// etcd refused the connection: a handshake failure shows
    only as "unavailable" in gRPC's error, which does not say a certificate is missing."""
    if not any(endpoint.startswith("https://") for endpoint in settings.endpoints):
        return ""
    if settings.cert_file is None:
        return (
            " (https:// endpoint without etcd.cert_file/etcd.key_file: an etcd started with "
            "--client-cert-auth refuses clients without a certificate; check etcd.ca_file too)"
        )
    return (
        " (check that etcd.ca_file signed etcd's certificate and that etcd trusts etcd.cert_file)"
    )


class _ThreadLoop(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    stores: dict[str, ObjectStore]

    def __init__(self) -> None:
        self.stores = {}


_thread = _ThreadLoop()


def _kept_stores() -> dict[str, ObjectStore] | None:
    """The stores kept for the running loop, if it is this thread's ``run`` loop."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return _thread.stores if running is _thread.loop else None


def _is_kept(store: ObjectStore) -> bool:
    cache = _kept_stores()
    return cache is not None and any(kept is store for kept in cache.values())


def run(coroutine: Awaitable[T]) -> T:
    """Run driver-side I/O to completion (the driver's Python has no running loop) on the
    thread's own loop, kept open so its object stores serve the next plans too."""

    async def main() -> T:
        return await coroutine

    if _thread.loop is None or _thread.loop.is_closed():
        _thread.loop = asyncio.new_event_loop()
        _thread.stores = {}
    return _thread.loop.run_until_complete(main())
