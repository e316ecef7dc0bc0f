"""The async shell around this broker's share-partitions (Kafka's ``SharePartitionManager``).

A share-partition lives on the broker that owns its topic partition (the lease holder). It is
loaded from etcd on first use (or started at the group's ``share.auto.offset.reset``: the
high watermark, or the log start), changed under its own lock by ShareFetch/ShareAcknowledge,
and written back in flush rounds: one etcd transaction for every share-partition changed since
the last round, fenced by the partition leases (``store``). Acknowledgements are answered once
the round that carries them committed; acquisitions and lock expiries ride the next round
(``FLUSH_INTERVAL_S``), so a new owner may deliver a record once more than its count says,
never lose an acknowledgement.

A share-partition whose partition lease changed (or whose round was fenced) is dropped and read
again from etcd: records acquired on the old owner come back as available there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kafscale.broker.groups.share import ShareConfig
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import Compare
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.protocol.errors import ErrorCode, KafkaError
from kafscale.broker.share.partition import Limits, SharePartition
from kafscale.broker.share.sessions import ShareSessions
from kafscale.broker.share.store import ShareStateStore, StateWrite, encode

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.25
SAVE_ATTEMPTS = 3
EXPIRY_CHECK_MAX_S = 1.0
EntryKey = tuple[str, str, int]
"""(group, topic, partition)."""


def limits_of(config: ShareConfig) -> Limits:
    return Limits(
        config.record_lock_duration_ms, config.delivery_count_limit, config.max_record_locks
    )


@dataclass(slots=True)
class Entry:
    key: EntryKey
    topic_id: str
    lease_revision: int
    state: SharePartition
    limits: Limits
    revision: int = 0
    """The etcd mod revision of the stored state this entry continues from (0: none)."""
    group_revision: int = 0
    """A fresh entry's group metadata create revision: its first write is fenced by it."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dirty: bool = False
    version: int = 0
    """Bumped by every change an answer waits on (``touch``): an acknowledgement."""
    stored: int = 0
    """The highest ``version`` a flush round wrote to etcd."""
    dropped: bool = False
    """Set once the manager let this entry go (lease lost, write fenced, admin change): what
    was not stored by then never will be."""

    def touch(self) -> int:
        """A change an answer must not be given before etcd holds: the version to wait for."""
        self.dirty = True
        self.version += 1
        return self.version


@dataclass(frozen=True, slots=True)
class OwnerView:
    """What the manager needs of the partition's owner: its lease revision and offsets."""

    topic_id: str
    lease_revision: int
    log_start_offset: int
    high_watermark: int


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[ErrorCode]
    targets: list[tuple[Entry, int]]


def _outcome(waiter: _Waiter, round_error: ErrorCode) -> ErrorCode | None:
    """What a waiter is answered after a round, or None to wait for the next one. An entry let
    go before its version was stored lost that change: never answered NONE."""
    if all(entry.stored >= version for entry, version in waiter.targets):
        return ErrorCode.NONE
    if any(entry.dropped and entry.stored < version for entry, version in waiter.targets):
        return ErrorCode.NOT_LEADER_OR_FOLLOWER
    if round_error is not ErrorCode.NONE:
        return round_error
    return None


Clock = Callable[[], int]
Owns = Callable[[str, int, int], bool]
"""Whether this broker still owns (topic, partition) under that lease revision."""


def loop_clock_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


def _continues(entry: Entry, owner: OwnerView) -> bool:
    """Whether ``entry`` is still this owner's: the same lease, the same topic (a topic deleted
    and created again under its name starts its share-partitions over)."""
    return entry.lease_revision == owner.lease_revision and entry.topic_id == owner.topic_id


class ShareManager:
    def __init__(
        self,
        store: ShareStateStore,
        owns: Owns = lambda _t, _p, _r: True,
        clock: Clock = loop_clock_ms,
    ) -> None:
        self._store = store
        self._owns = owns
        self._clock = clock
        self.sessions = ShareSessions()
        self._entries: dict[EntryKey, Entry] = {}
        self._loading = asyncio.Lock()
        self._waiters: list[_Waiter] = []
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()
        self._write_retries = RetryLog(log, "share state write")

    def now_ms(self) -> int:
        return self._clock()

    def changed(self) -> asyncio.Event:
        """Set once records may have become available (a release, an expiry, an
        acknowledgement): waiting fetches look again. Take it before looking."""
        return self._changed

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def entry(self, key: EntryKey, owner: OwnerView, config: ShareConfig) -> Entry:
        """The share-partition, loaded or started if this owner has not got it yet."""
        found = self._entries.get(key)
        if found is None or not _continues(found, owner):
            async with self._loading:
                found = self._entries.get(key)
                if found is None or not _continues(found, owner):
                    self._drop(key)
                    found = await self._load(key, owner, config)
                    self._entries[key] = found
        found.limits = limits_of(config)
        if owner.log_start_offset > found.state.start_offset:
            found.state.move_start(owner.log_start_offset)
            found.dirty = True
        return found

    async def _load(self, key: EntryKey, owner: OwnerView, config: ShareConfig) -> Entry:
        group, topic, partition = key
        state, revision = await self._store.load(group, topic, partition, owner.topic_id)
        fresh = state is None
        group_revision = 0
        if state is None:
            group_revision = await self._store.share_group_revision(group)
            if not group_revision:
                # Else any client could make this broker write state for group ids nobody
                # joined (etcd growing without bound), or bring a deleted group's state back.
                message = f"share group {group} does not exist (no member joined it)"
                raise KafkaError(message, ErrorCode.GROUP_ID_NOT_FOUND)
            start = owner.high_watermark if config.auto_offset_reset == "latest" else 0
            state = SharePartition(max(start, owner.log_start_offset))
        log.info(
            "share-partition %s %s-%d %s at start offset %d",
            group,
            topic,
            partition,
            "started" if fresh else "loaded",
            state.start_offset,
        )
        # A fresh one is written at the next round so that "latest" stays where it was taken.
        limits = limits_of(config)
        return Entry(
            key,
            owner.topic_id,
            owner.lease_revision,
            state,
            limits,
            revision,
            group_revision=group_revision,
            dirty=fresh,
        )

    def _drop(self, key: EntryKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.dropped = True

    async def revalidate(self, key: EntryKey) -> None:
        """Drop the share-partition if its stored state changed under us (an admin altered or
        deleted its start offset): its next use reads it again. Run when a member opens a
        share session, the first thing a member does after such a change (offsets are altered
        only while the group is empty)."""
        entry = self._entries.get(key)
        if entry is None:
            return
        changed = await self._store.revision(*key) != entry.revision
        if changed and self._entries.get(key) is entry:
            self._drop(key)

    async def replace_states(
        self,
        fence: Sequence[Compare],
        group: str,
        starts: dict[tuple[str, int], tuple[str, int]],
        deleted_topics: Sequence[str],
    ) -> bool:
        """AlterShareGroupOffsets / DeleteShareGroupOffsets (``store.replace``); this broker's
        own copies go at once, other owners find out at the next session or flush round."""
        done = await self._store.replace(fence, starts, deleted_topics, group)
        for key in [k for k in self._entries if k[0] == group]:
            if key[1:] in starts or key[1] in deleted_topics:
                self._drop(key)
        return done

    def forget_group(self, group: str) -> None:
        """The group was deleted (its coordinator deleted its share-partition states in the
        fenced transaction that deleted the group): this broker's copies and sessions go."""
        for key in [k for k in self._entries if k[0] == group]:
            self._drop(key)
        for session_key in [k for k in self.sessions.sessions if k[0] == group]:
            self.sessions.close(session_key)
        self.notify()

    def on_share_members(self, group: str, members: frozenset[str] | None) -> None:
        """The cluster watch saw ``group``'s membership change (``None``: the group is gone).
        A member that left or expired has its share sessions here closed and every record it
        holds released now, as Kafka's share-partition leader does when it learns of the
        departure, rather than at its lock's end."""
        if members is None:
            self.forget_group(group)
            return
        for key in [k for k in self.sessions.sessions if k[0] == group and k[1] not in members]:
            self.sessions.close(key)
        released = 0
        for entry in self.entries_of(group):
            count = entry.state.release_departed(members, entry.limits)
            if count:
                entry.dirty = True
                released += count
        if released:
            log.info("share group %s: %d records of departed members released", group, released)
            self.notify()
            self._wake.set()

    async def start_offsets(self, group: str) -> dict[tuple[str, int], tuple[str, SharePartition]]:
        """The group's share-partitions as etcd has them, with this broker's own (fresher:
        not yet flushed) over them."""
        found = await self._store.load_group(group)
        for entry in self.entries_of(group):
            found[(entry.key[1], entry.key[2])] = (entry.topic_id, entry.state)
        return found

    async def member_stored(self, group: str, member_id: str) -> bool:
        """Whether etcd has ``member_id`` in ``group`` (its coordinator wrote the join before
        answering the member's heartbeat), for when the cluster watch lags behind."""
        return await self._store.has_member(group, member_id)

    def entries_of(self, group: str) -> list[Entry]:
        return [e for k, e in self._entries.items() if k[0] == group]

    def release(self, group: str, member_id: str) -> None:
        """A member's session ended: every record it holds here goes back."""
        for entry in self.entries_of(group):
            if entry.state.release_member(member_id, entry.limits):
                entry.dirty = True
                self.notify()
        self._wake.set()

    def release_connection(self, connection: object) -> None:
        """A connection closed: its share sessions end (Kafka releases their records too)."""
        for group, member_id in self.sessions.of_connection(connection):
            self.sessions.close((group, member_id))
            self.release(group, member_id)

    # --- flush rounds -------------------------------------------------------------------------

    async def durable(self, targets: Sequence[tuple[Entry, int]]) -> ErrorCode:
        """Wait until etcd holds each (entry, version ``touch`` gave): NONE, or why not (the
        entry was let go first: NOT_LEADER_OR_FOLLOWER; etcd unreachable: REQUEST_TIMED_OUT).
        A change is never answered NONE unless a round that carried it committed."""
        waiter = _Waiter(asyncio.get_running_loop().create_future(), list(targets))
        if (done := _outcome(waiter, ErrorCode.NONE)) is not None:
            return done
        self._waiters.append(waiter)
        self._wake.set()
        return await asyncio.shield(waiter.future)

    async def run(self) -> None:
        """Flush rounds and lock expiry, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sleep_s()):
                    await self._wake.wait()
            self._wake.clear()
            self._expire()
            try:
                await self._flush_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("share state flush failed")
                await asyncio.sleep(FLUSH_INTERVAL_S)

    def _sleep_s(self) -> float:
        deadlines = [d for e in self._entries.values() if (d := e.state.next_deadline_ms())]
        dirty = any(e.dirty for e in self._entries.values())
        wait = EXPIRY_CHECK_MAX_S
        if deadlines:
            wait = min(wait, max(min(deadlines) - self._clock(), 0) / 1000)
        if dirty:
            wait = min(wait, FLUSH_INTERVAL_S)
        return wait

    def _expire(self) -> None:
        now = self._clock()
        for entry in self._entries.values():
            if entry.state.expire(now, entry.limits):
                entry.dirty = True
                self.notify()

    async def _flush_round(self) -> None:
        waiters, self._waiters = self._waiters, []
        # Share-partitions of partitions this broker lost go (their new owner reads etcd);
        # writing them would only fail the round for every other share-partition.
        for key, entry in list(self._entries.items()):
            if not self._owns(key[1], key[2], entry.lease_revision):
                self._drop(key)
        dirty = [e for e in self._entries.values() if e.dirty]
        versions = [e.version for e in dirty]
        writes = []
        for entry in dirty:
            group, topic, partition = entry.key
            value = encode(entry.topic_id, entry.state)
            writes.append(
                StateWrite(
                    group,
                    topic,
                    partition,
                    entry.lease_revision,
                    entry.revision,
                    value,
                    entry.group_revision,
                )
            )
            entry.dirty = False
        error = await self._write(dirty, versions, writes) if writes else ErrorCode.NONE
        self._answer(waiters, error)

    async def _write(
        self, dirty: list[Entry], versions: list[int], writes: list[StateWrite]
    ) -> ErrorCode:
        """The round's answer to its waiters. What was not written stays dirty for the next
        round; the waiters are answered anyway (a lost future hangs its request)."""
        try:
            await self._save(dirty, versions, writes)
        except Exception as exc:
            for entry in dirty:
                entry.dirty = entry.dirty or not entry.dropped
            return self._write_failed(exc)
        self._write_retries.succeeded()
        return ErrorCode.NONE

    def _write_failed(self, error: Exception) -> ErrorCode:
        """A failed round's code. A run of rounds etcd cannot answer (REQUEST_TIMED_OUT) or
        refuses (permission denied after a change of roles) is logged once, then summarised
        (``retry_log``): a refusal logged a traceback every round (``FLUSH_INTERVAL_S``). Only an
        unexpected error (a bug) is logged with its traceback."""
        if isinstance(error, MetadataError):
            self._write_retries.failed(error)
            if isinstance(error, MetadataUnavailable):
                return ErrorCode.REQUEST_TIMED_OUT
            return ErrorCode.UNKNOWN_SERVER_ERROR
        log.error("share state write failed", exc_info=error)
        return ErrorCode.UNKNOWN_SERVER_ERROR

    async def _save(
        self, dirty: list[Entry], versions: list[int], writes: list[StateWrite]
    ) -> None:
        """One round's transaction. If etcd refuses it, only the share-partitions whose own
        checks fail (their partition lease moved, or an admin changed their state) are let go;
        the others are written again at once, so one moved key costs the rest of the broker's
        share-partitions nothing. What is still refused after ``SAVE_ATTEMPTS`` (keys moving
        under every attempt) waits for the next round, dirty: never answered before stored."""
        for _ in range(SAVE_ATTEMPTS):
            revision = await self._store.save(writes)
            if revision is not None:
                for entry, version in zip(dirty, versions, strict=True):
                    entry.revision = revision
                    entry.stored = max(entry.stored, version)
                return
            refused = await self._store.refused(writes)
            if refused:
                self._let_go([dirty[i] for i in sorted(refused)])
            # An entry let go meanwhile (an admin change seen, a lease lost) is not written.
            keep = [i for i in range(len(writes)) if i not in refused and not dirty[i].dropped]
            dirty = [dirty[i] for i in keep]
            versions = [versions[i] for i in keep]
            writes = [writes[i] for i in keep]
            if not writes:
                return
        for entry in dirty:
            entry.dirty = True

    def _let_go(self, refused: list[Entry]) -> None:
        for entry in refused:
            entry.dropped = True
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
        log.warning(
            "share state write refused for %s (a partition lease moved, or an admin changed "
            "the state): read again on next use",
            ", ".join(f"{g} {t}-{p}" for g, t, p in (e.key for e in refused)),
        )

    def _answer(self, waiters: list[_Waiter], round_error: ErrorCode) -> None:
        for waiter in waiters:
            if waiter.future.done():
                continue
            outcome = _outcome(waiter, round_error)
            if outcome is None:  # its change rides the next round
                self._waiters.append(waiter)
                self._wake.set()
            else:
                waiter.future.set_result(outcome)
