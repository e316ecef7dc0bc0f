"""The log cleaner: compaction passes over the compacted partitions this broker owns.

Every ``log.cleaner_interval_s`` the owner looks at its partitions of topics whose
``cleanup.policy`` includes ``compact``, one at a time, and runs a pass where one is due
(``compaction_plan``). A pass reads the previous generation's cleaned objects and the dirty plain
segments through the store, builds the offset map and filters each input with the record-level
core (``compaction``) in a worker thread, so the event loop keeps serving; uploads the next
generation under its own prefix (``<partition>.cleaned/g<generation>-e<epoch>/``, conditional
PUTs); then commits ``cleaned`` in the partition state, fenced and ordered with flush commits
(``LogManager.commit_cleaned``). Inputs are read twice (once to index, once to filter), one at a
time, so a pass holds one input and one output in memory, not the partition.

Offsets never change, so cleaned objects tile [log start, upto) with no hole: each covers the
offsets of the inputs merged into it, even where every record was cleaned away (then it holds no
batch). After the commit the superseded plain segments and every other generation's objects
(the previous one, and orphans of fenced or crashed passes) are deleted after
``log.cleaner_delete_delay_s``, so readers that located them before the commit finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from kafscale.broker.config import LogSettings
from kafscale.broker.metadata import keys, topics
from kafscale.broker.metadata.aborted_index import kept_aborts_from
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.partition_state import AbortedTxn, Cleaned, PartitionState
from kafscale.broker.metadata.topics import effective_configs
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.errors import KafkaError
from kafscale.broker.protocol.record_batch import InvalidBatch
from kafscale.broker.storage import aborted_index, compaction
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.compaction_plan import (
    NO_LAG_LIMIT_MS,
    CleanerConfig,
    PlainSegment,
    cleaner_config,
    is_compacted,
    plan_dirty_end,
)
from kafscale.broker.storage.log_manager import LogManager
from kafscale.broker.storage.object_store import ObjectInfo, ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.reader import committed_objects
from kafscale.broker.storage.segments import (
    SEGMENT_HEADER_SIZE,
    SegmentCorrupt,
    decode_segment,
    decode_segment_header,
    encode_range_segment,
)
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Input:
    """An object a pass reads: offsets [base, end) of the partition."""

    key: str
    base: int
    end: int
    size: int


@dataclass(frozen=True, slots=True)
class PassResult:
    cleaned: Cleaned
    bytes_read: int
    bytes_written: int
    objects_read: int
    objects_written: int


class CleanerError(Exception):
    """A pass could not run (corrupt input, an offset map too small); nothing was committed."""


def cleaned_inputs(
    state: PartitionState, listed: Sequence[ObjectInfo], pass_prefix: str
) -> list[Input]:
    """The committed generation's cleaned objects, oldest first, each up to the next (the last
    up to ``upto``)."""
    bases = []
    for info in listed:
        name = info.key[len(pass_prefix) :]
        if name.endswith(".kfs") and name[:-4].isdigit():
            bases.append((int(name[:-4]), info))
    bases.sort(key=lambda item: item[0])
    if not bases:  # the committed generation's objects are gone (never expected): no input
        return []
    upto = state.cleaned.upto if state.cleaned is not None else 0
    ends = [b for b, _ in bases[1:]] + [upto]
    return [
        Input(info.key, base, end, info.size)
        for (base, info), end in zip(bases, ends, strict=True)
        if base < upto
    ]


def plain_inputs(state: PartitionState, listed: Sequence[ObjectInfo]) -> list[Input]:
    """The committed plain segments (above the cleaned range), oldest first, with their ends."""
    found = committed_objects(state, list(listed))
    if not found:  # retention of compact,delete deleted every segment: nothing to clean
        return []
    ends = [base for base, _, _ in found[1:]] + [state.high_watermark]
    return [
        Input(info.key, base, end, info.size)
        for (base, _, info), end in zip(found, ends, strict=True)
    ]


def superseded_keys(listed: Sequence[ObjectInfo], upto: int) -> list[str]:
    """Plain objects (segments, index objects, fenced writers' orphans) starting below
    ``upto``: only the cleaned objects serve those offsets now. A plain segment never straddles
    ``upto`` (it is a segment's end)."""
    found = []
    for info in listed:
        parsed = keys.parse_object_name(info.key)
        if parsed is not None and parsed[0] < upto:
            found.append(info.key)
    return found


def stale_cleaned_keys(listed: Sequence[ObjectInfo], root: str, kept: Cleaned) -> list[str]:
    """Cleaned objects no reader needs once ``kept`` committed: older generations, and any
    generation written at an older epoch than ``kept``'s (a fenced or crashed owner's pass).
    Newer generations of this epoch or objects of newer epochs are never touched: a delete
    scheduled by an earlier pass runs after later passes committed."""
    doomed = []
    for info in listed:
        parsed = keys.parse_cleaned_key(root, info.key)
        if parsed is None:
            continue
        generation, epoch = parsed[0], parsed[1]
        if (generation, epoch) == (kept.generation, kept.epoch):
            continue
        if (generation < kept.generation and epoch <= kept.epoch) or epoch < kept.epoch:
            doomed.append(info.key)
    return doomed


def leftover_keys(
    committed: Cleaned | None,
    owner_epoch: int,
    plain: Sequence[ObjectInfo],
    cleaned: Sequence[ObjectInfo],
    root: str,
) -> list[str]:
    """What earlier owners left behind that no committed state will ever serve again: plain
    objects below the committed ``upto`` (``superseded_keys``), and cleaned objects of every
    generation but the committed one that were written at an older epoch than ``owner_epoch``
    (a crashed or fenced owner's, which can never commit now) or are older generations of the
    committed one's epoch (``stale_cleaned_keys``). An owner that died within
    ``log.cleaner_delete_delay_s`` of its commit never deleted them. Objects of the owner's own
    epoch newer than the committed generation are left to its next commit."""
    doomed = superseded_keys(plain, committed.upto) if committed is not None else []
    for info in cleaned:
        parsed = keys.parse_cleaned_key(root, info.key)
        if parsed is None:
            continue
        generation, epoch = parsed[0], parsed[1]
        if committed is not None and (generation, epoch) == (committed.generation, committed.epoch):
            continue
        older = (
            committed is not None and generation < committed.generation and epoch <= committed.epoch
        )
        if older or epoch < owner_epoch:
            doomed.append(info.key)
    return doomed


class Cleaner:
    def __init__(
        self,
        settings: LogSettings,
        cluster: str,
        manager: LogManager,
        view: ClusterView,
        store: ObjectStore,
        cache: SegmentCache,
        broker_defaults: dict[str, str],
    ) -> None:
        self._settings = settings
        self._cluster = cluster
        self._manager = manager
        self._view = view
        self._store = store
        self._cache = cache
        self._broker_defaults = broker_defaults
        # Per partition, its plain segments' flush times (read only for a lag setting).
        self._created_at: dict[tuple[str, int], dict[str, int]] = {}
        # Per partition, the state revision, epoch and settings of its last check that found
        # no pass due: while they stay, a pass stays not due (``_idle``), with no listing.
        self._idle: dict[tuple[str, int], tuple[int, int, CleanerConfig]] = {}
        # Per partition, the epoch whose leftovers (``leftover_keys``) were looked for.
        self._scanned: dict[tuple[str, int], int] = {}
        # Per partition, its committed generation's objects as listed (or written): a committed
        # generation never changes, so a check while the same one stays committed lists no more.
        self._generation: dict[tuple[str, int], tuple[Cleaned, list[ObjectInfo]]] = {}
        self._deletes: set[asyncio.Task[None]] = set()

    async def run(self, interval_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(interval_s)
                await self.sweep(int(time.time() * 1000))
        finally:
            await self.close()

    async def close(self) -> None:
        for task in list(self._deletes):
            task.cancel()
        await asyncio.gather(*self._deletes, return_exceptions=True)

    async def sweep(self, now_ms: int) -> list[PassResult]:
        """One pass over every owned compacted partition where one is due, one at a time."""
        results = []
        for owned in list(self._manager.owned.values()):
            try:
                result = await self.clean_partition(owned, now_ms)
            except (KafkaError, ObjectStoreError, CleanerError, InvalidBatch) as exc:
                log.warning("compaction of %s-%d skipped: %s", owned.topic, owned.partition, exc)
                continue
            except Exception:  # a bug must not stop the cleaner for every partition
                log.exception("compaction of %s-%d failed", owned.topic, owned.partition)
                continue
            if result is not None:
                results.append(result)
        owned_now = self._manager.owned
        for cache in (self._created_at, self._idle, self._scanned, self._generation):
            for tp in [tp for tp in cache if tp not in owned_now]:
                del cache[tp]
        return results

    def _idle_since(self, owned: OwnedPartition, config: CleanerConfig) -> bool:
        """Whether the last check of ``owned`` found nothing due and nothing it depends on
        changed since: no state write (a flush, DeleteRecords, retention or a pass moves the
        state's revision), the same epoch and settings, and no lag setting (with one, time
        alone can make a pass due). Saves the two LISTs per partition and check that an idle
        compacted partition would otherwise cost."""
        if config.min_lag_ms > 0 or config.max_lag_ms < NO_LAG_LIMIT_MS:
            return False
        return self._idle.get(owned.tp) == (owned.state_revision, owned.epoch, config)

    def _config(self, topic: str) -> CleanerConfig | None:
        info = self._view.topics.get(topic)
        if info is None:
            return None
        configs = effective_configs(info, self._broker_defaults)
        return cleaner_config(configs) if is_compacted(configs) else None

    async def clean_partition(self, owned: OwnedPartition, now_ms: int) -> PassResult | None:
        """Run a pass on ``owned`` if one is due; the committed result, or None."""
        config = self._config(owned.topic)
        if config is None or owned.failed:
            return None
        where = (owned.topic, owned.topic_id, owned.partition)
        if self._scanned.get(owned.tp) != owned.epoch:
            await self._collect_leftovers(owned, where)
        if self._idle_since(owned, config):
            return None
        started = time.monotonic()
        state, checked = owned.state, (owned.state_revision, owned.epoch, config)
        cleaned = await self._cleaned_inputs(owned.tp, state, where)
        listed = await self._list(keys.partition_object_prefix(self._cluster, *where))
        plain = plain_inputs(state, listed)
        segments = await self._segments(owned.tp, plain, config)
        # Inputs wholly below the log start (retention of compact,delete, which deletes their
        # objects) are left out: the new generation starts at the first object still holding
        # readable offsets.
        live = [i for i in cleaned if i.end > state.log_start_offset]
        dirty_end = plan_dirty_end(segments, state, sum(i.size for i in live), now_ms, config)
        if dirty_end is None:
            self._idle[owned.tp] = checked
            return None
        dirty = [i for i in plain if state.log_start_offset < i.end <= dirty_end]
        if not dirty:
            self._idle[owned.tp] = checked
            return None
        inputs = [*live, *dirty]
        aborted = await aborted_index.aborted_in_range(
            self._store, self._cache, self._cluster, where, state, inputs[0].base, dirty_end
        )
        offset_map, inputs = await self._index(inputs, len(live), aborted)
        generation = await self._free_generation(
            where, state.cleaned.generation + 1 if state.cleaned is not None else 0, owned.epoch
        )
        upto = inputs[-1].end
        result_cleaned = Cleaned(upto, generation, owned.epoch)
        prefix = keys.cleaned_pass_prefix(self._cluster, *where, generation, owned.epoch)
        markers = compaction.TxnMarkers(kept_aborts_from(state, upto))
        written, uploaded = await self._write(
            owned,
            inputs,
            offset_map,
            aborted,
            markers,
            prefix,
            compaction.DeleteClock(now_ms, config.delete_retention_ms),
        )
        if not await self._manager.commit_cleaned(
            owned, result_cleaned, state.cleaned, markers.last_removed_abort
        ):
            log.info("compaction pass of %s-%d not committed (fenced)", *owned.tp)
            return None
        self._generation[owned.tp] = (result_cleaned, uploaded)
        read = sum(i.size for i in inputs)
        METRICS.cleaned(time.monotonic() - started, read, written)
        log.info(
            "compacted %s-%d up to %d (generation %d): %d bytes -> %d",
            owned.topic, owned.partition, upto, generation, read, written,
        )  # fmt: skip
        superseded = superseded_keys(listed, upto) + [
            aborted_index.object_key(self._cluster, *where, ref)
            for ref in state.aborted_txn_index
            if ref.last_offset < upto  # the commit dropped it: no aborted record is left there
        ]
        self._delete_later(where, result_cleaned, superseded)
        gets = len(inputs) + len(inputs) - len(live)  # dirty inputs are read twice
        return PassResult(result_cleaned, read, written, gets, len(uploaded))

    async def _cleaned_inputs(
        self, tp: tuple[str, int], state: PartitionState, where: tuple[str, str, int]
    ) -> list[Input]:
        """The committed generation's objects: listed once per generation (``_generation``),
        not on every check of a busy partition."""
        if state.cleaned is None:
            return []
        prefix = keys.cleaned_pass_prefix(
            self._cluster, *where, state.cleaned.generation, state.cleaned.epoch
        )
        known = self._generation.get(tp)
        if known is None or known[0] != state.cleaned:
            known = (state.cleaned, await self._list(prefix))
            self._generation[tp] = known
        return cleaned_inputs(state, known[1], prefix)

    async def _collect_leftovers(self, owned: OwnedPartition, where: tuple[str, str, int]) -> None:
        """Once per ownership epoch (and again after a delete failed): list the partition's
        plain and cleaned objects and delete what ``leftover_keys`` finds, after
        ``log.cleaner_delete_delay_s`` counted from now (a reader that located an object
        before it was superseded may still be reading it)."""
        state = owned.state
        root = keys.cleaned_root_prefix(self._cluster, *where)
        plain = await self._list(keys.partition_object_prefix(self._cluster, *where))
        cleaned = await self._list(root)
        doomed = leftover_keys(state.cleaned, owned.epoch, plain, cleaned, root)
        self._scanned[owned.tp] = owned.epoch
        if doomed:
            log.info(
                "%s-%d: %d object(s) left by an earlier owner or pass will be deleted",
                owned.topic, owned.partition, len(doomed),
            )  # fmt: skip
            self._delete_later(where, state.cleaned, doomed)

    async def _free_generation(
        self, where: tuple[str, str, int], generation: int, epoch: int
    ) -> int:
        """The first generation from ``generation`` whose prefix at ``epoch`` holds nothing.

        A pass that failed after an upload (an input gone or a GET that failed, a PUT or its
        etcd commit unanswered) leaves objects under its prefix while the epoch stays: the
        next pass at the same generation would meet them (its conditional PUTs refused, the
        partition never cleaned again) or mix with them (readers list the prefix). Those
        objects are never committed state (a commit that was applied after all moved
        ``state_revision``, so the new pass's commit is fenced), and the delayed delete of
        the next committed pass takes them as older generations of its epoch."""
        while await self._store.list(
            keys.cleaned_pass_prefix(self._cluster, *where, generation, epoch), limit=1
        ):
            generation += 1
        return generation

    async def _list(self, prefix: str) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        while True:
            page = await self._store.list(
                prefix, start_after=found[-1].key if found else None, limit=1000
            )
            found += page
            if len(page) < 1000:
                return found

    async def _segments(
        self, tp: tuple[str, int], plain: list[Input], config: CleanerConfig
    ) -> list[PlainSegment]:
        """The plain inputs with their flush times; the times cached are those of the
        segments still listed (the cache does not grow with every segment ever cleaned)."""
        known = self._created_at.get(tp, {})
        times = {i.key: await self._created_at_ms(i.key, config, known) for i in plain}
        self._created_at[tp] = times
        return [PlainSegment(i.base, i.end, i.size, times[i.key]) for i in plain]

    async def _created_at_ms(self, key: str, config: CleanerConfig, known: dict[str, int]) -> int:
        """A segment's flush time, read (a ranged GET of its header) only when a lag setting
        needs it; 0 otherwise (old enough for any decision that ignores it)."""
        if config.min_lag_ms <= 0 and config.max_lag_ms >= NO_LAG_LIMIT_MS:
            return 0
        cached = known.get(key)
        if cached is None:
            header = await self._store.get(key, start=0, end=SEGMENT_HEADER_SIZE)
            cached = decode_segment_header(header).created_at_ms
        return cached

    async def _read(self, item: Input) -> tuple[memoryview, int]:
        data = await self._store.get(item.key)
        try:
            segment = decode_segment(data)
        except SegmentCorrupt as exc:
            raise CleanerError(f"{item.key} is corrupt: {exc}") from exc
        return segment.body, segment.created_at_ms

    async def _index(
        self, inputs: list[Input], cleaned_count: int, aborted: list[AbortedTxn]
    ) -> tuple[compaction.OffsetMap, list[Input]]:
        """The offset map of the dirty inputs (the cleaned ones hold each key once already) and
        the inputs the pass keeps: when the map fills, the pass ends before the dirty segment
        whose keys did not fit (``index_batches`` adds a segment's keys all or none)."""
        offset_map = compaction.OffsetMap(self._settings.cleaner_max_keys)
        for index in range(cleaned_count, len(inputs)):
            body, _ = await self._read(inputs[index])
            fits = await asyncio.to_thread(compaction.index_batches, body, offset_map, aborted)
            if fits:
                continue
            if index == cleaned_count:
                raise CleanerError(
                    f"log.cleaner_max_keys ({self._settings.cleaner_max_keys}) is too small "
                    "for one segment's keys"
                )
            return offset_map, inputs[:index]
        return offset_map, inputs

    def _still_owned(self, owned: OwnedPartition) -> bool:
        """Whether ``owned`` is still ours and its topic still the same one: a topic deleted
        during a pass is purged once (its tombstone then goes), so an upload after the purge
        would stay in the bucket for good."""
        info = self._view.topics.get(owned.topic)
        return (
            self._manager.owned.get(owned.tp) is owned
            and not owned.failed
            and info is not None
            and info.topic_id == owned.topic_id
        )

    async def _write(
        self,
        owned: OwnedPartition,
        inputs: list[Input],
        offset_map: compaction.OffsetMap,
        aborted: list[AbortedTxn],
        markers: compaction.TxnMarkers,
        prefix: str,
        clock: compaction.DeleteClock,
    ) -> tuple[int, list[ObjectInfo]]:
        """Filter the inputs in order into cleaned objects of about the topic's
        ``segment.bytes`` each (as Kafka sizes cleaned segments; the broker's
        ``log.segment_bytes`` if the topic sets none); returns (bytes written, the objects).
        Tombstones and transaction markers get or pass their delete horizons by ``clock`` (the
        pass's time). Each upload
        first checks that the partition is still ours and its topic not deleted (a pass over a
        large partition takes a while)."""
        written = 0
        objects: list[ObjectInfo] = []
        segment_bytes = topics.segment_bytes(
            self._view.topics.get(owned.topic), self._settings.segment_bytes
        )
        body = bytearray()
        group_base, created = inputs[0].base, 0
        for position, item in enumerate(inputs):
            data, created_at = await self._read(item)
            kept = await asyncio.to_thread(
                compaction.clean_batches,
                data,
                offset_map,
                aborted,
                clock=clock,
                markers=markers,
            )
            body += kept
            created = max(created, created_at)
            last = position == len(inputs) - 1
            if last or len(body) >= segment_bytes:
                encoded = encode_range_segment(
                    body, group_base, item.end - 1, created, self._settings.index_interval_bytes
                )
                if not self._still_owned(owned):
                    raise CleanerError("the partition was given up or its topic deleted")
                key = keys.cleaned_object_key(prefix, group_base)
                await self._store.put(key, encoded.segment)
                written += len(encoded.segment)
                objects.append(ObjectInfo(key, len(encoded.segment)))
                body, group_base, created = bytearray(), item.end, 0
        return written, objects

    def _delete_later(
        self, where: tuple[str, str, int], kept: Cleaned | None, superseded: list[str]
    ) -> None:
        task = start_task(
            self._delete_after_delay(where, kept, superseded),
            f"cleaner-delete {where[0]}-{where[2]}",
        )
        self._deletes.add(task)
        task.add_done_callback(self._deletes.discard)

    async def _delete_after_delay(
        self, where: tuple[str, str, int], kept: Cleaned | None, superseded: list[str]
    ) -> None:
        """Delete the superseded plain segments (and their index objects) and the cleaned
        objects ``stale_cleaned_keys`` names (older generations, fenced passes' orphans). If
        the delete fails, the partition's leftovers are looked for again at its next check."""
        await asyncio.sleep(self._settings.cleaner_delete_delay_s)
        doomed = list(superseded)
        if kept is not None:
            with contextlib.suppress(ObjectStoreError):
                root = keys.cleaned_root_prefix(self._cluster, *where)
                doomed += stale_cleaned_keys(await self._list(root), root, kept)
        try:
            await self._store.delete_many(doomed)
        except ObjectStoreError as exc:
            log.warning("could not delete %d superseded object(s): %s", len(doomed), exc)
            self._scanned.pop((where[0], where[2]), None)
