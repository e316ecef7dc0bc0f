"""A coordinated group's committed offsets: the cache OffsetFetch answers from, and their
fenced writes (OffsetCommit, TxnOffsetCommit's pending offsets, OffsetDelete, DeleteGroups).

Apart from the group's membership (``offsets_runtime``), which decides whether a request may touch
the offsets; this part only keeps them. Every write of a group's offsets runs under one lock,
as Kafka's group lock makes it: a commit, a deletion and a re-read of pending transactional
offsets never interleave, so the cache is always what etcd holds after the last of them. A
failed fence (the group lease is no longer ours) calls ``lose``: the coordinator then unloads
the group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from kafscale.broker.groups.offset_delete import OffsetDeletion
from kafscale.broker.groups.store import (
    CommittedOffset,
    Fence,
    GroupStore,
    LoadedGroup,
    TopicPartition,
)
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class GroupOffsets:
    def __init__(
        self,
        group_id: str,
        fence: Fence,
        store: GroupStore,
        loaded: LoadedGroup,
        is_closed: Callable[[], bool],
        lose: Callable[[str], None],
    ) -> None:
        """``is_closed``: whether the group's runtime stopped coordinating (then every write
        answers NOT_COORDINATOR); ``lose``: tell the coordinator the lease is gone."""
        self.group_id = group_id
        self._fence = fence
        self._store = store
        self._is_closed = is_closed
        self._lose = lose
        self.cache: dict[TopicPartition, CommittedOffset] = dict(loaded.offsets)
        # Partitions with an offset committed in an open transaction: its coordinator makes
        # it visible (or drops it) in etcd, so these are read again before being answered.
        self.pending_txn: set[TopicPartition] = set(loaded.pending)
        self._lock = asyncio.Lock()

    def holds_nothing(self) -> bool:
        """No offset committed or pending, and no write under way."""
        return not self.cache and not self.in_flight()

    def in_flight(self) -> bool:
        """An offset pending in an open transaction, or a write (commit, deletion, expiry)
        under way: what etcd may not hold yet, or what is read again before it is answered."""
        return bool(self.pending_txn) or self._lock.locked()

    async def save(self, offsets: Mapping[TopicPartition, CommittedOffset]) -> ErrorCode:
        """OffsetCommit's write, once the group accepted the committer."""
        async with self._lock:
            if self._is_closed():
                return ErrorCode.NOT_COORDINATOR
            write = self._store.save_offsets(self.group_id, offsets, self._fence)
            error = await self._fenced("offset commit", write, ErrorCode.REQUEST_TIMED_OUT)
            if error is ErrorCode.NONE:
                self.cache.update(offsets)
        return error

    async def delete(
        self, partitions: list[TopicPartition], decide: Callable[[], OffsetDeletion]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition answers). ``decide`` runs under the lock,
        so a commit in flight lands first and is deleted, and a member that joined while this
        waited keeps its topics. Offsets pending in open transactions for the deleted
        partitions go too, as in Kafka. The offsets leave the cache with the decision (what
        OffsetFetch answers from), then etcd; if etcd cannot be reached they come back and the
        request fails."""
        async with self._lock:
            if self._is_closed():
                return ErrorCode.NOT_COORDINATOR, {}
            deletion = decide()
            if deletion.error is not ErrorCode.NONE:
                return deletion.error, {}
            answers = deletion.answers(partitions)
            deleted = [tp for tp, code in answers.items() if code is ErrorCode.NONE]
            doomed = [tp for tp in deleted if tp in self.cache or tp in self.pending_txn]
            kept = {tp: self.cache.pop(tp) for tp in doomed if tp in self.cache}
            error = await self._delete_stored(doomed) if doomed else ErrorCode.NONE
            if error is not ErrorCode.NONE:
                self.cache.update(kept)
                return error, {}
            self.pending_txn.difference_update(doomed)
        return ErrorCode.NONE, answers

    async def expire(
        self,
        decide: Callable[
            [Mapping[TopicPartition, CommittedOffset], set[TopicPartition]], list[TopicPartition]
        ],
    ) -> tuple[ErrorCode, list[TopicPartition]]:
        """Offset retention (``expiry``): ``decide`` picks, from the cache and the partitions
        pending in open transactions, the offsets that expired; they leave etcd (fenced) and
        the cache. Under the lock, so a commit in flight lands first and is judged by its own
        commit time; if etcd cannot be reached nothing is removed and ``MetadataUnavailable``
        goes to the retention check, which reports a check's unanswered groups together."""
        async with self._lock:
            if self._is_closed():
                return ErrorCode.NOT_COORDINATOR, []
            doomed = decide(self.cache, self.pending_txn)
            if not doomed:
                return ErrorCode.NONE, []
            write = self._store.delete_offsets(self.group_id, doomed, self._fence)
            error = await self._fenced("offset expiry", write, unavailable=None)
            if error is not ErrorCode.NONE:
                return error, []
            for tp in doomed:
                self.cache.pop(tp, None)
        return ErrorCode.NONE, doomed

    async def _delete_stored(self, partitions: list[TopicPartition]) -> ErrorCode:
        """Committed offsets and those pending in open transactions leave etcd (Kafka's
        tombstone drops both: a transaction committing later must not bring one back)."""
        pending = [tp for tp in partitions if tp in self.pending_txn]
        write = self._store.delete_offsets(self.group_id, partitions, self._fence, pending)
        return await self._fenced("offset delete", write, ErrorCode.COORDINATOR_NOT_AVAILABLE)

    async def _fenced(
        self, what: str, write: Awaitable[bool], unavailable: ErrorCode | None
    ) -> ErrorCode:
        """The answer to a fenced etcd write (True: done, False: the lease was not ours):
        ``unavailable`` when etcd cannot be reached (None: the ``MetadataUnavailable`` itself,
        for a caller that reports it), NOT_COORDINATOR once the lease is gone (the coordinator
        is told, and unloads the group)."""
        try:
            done = await write
        except MetadataUnavailable as exc:
            if unavailable is None:
                raise
            log.warning("%s for group %s: %s", what, self.group_id, exc)
            return unavailable
        if not done:
            self._lose(f"{what} fenced: the group lease is no longer ours")
            return ErrorCode.NOT_COORDINATOR
        return ErrorCode.NONE

    async def add_pending(
        self,
        offsets: Mapping[TopicPartition, CommittedOffset],
        write: Callable[[], Awaitable[ErrorCode]],
    ) -> ErrorCode:
        """TxnOffsetCommit: ``write`` puts ``offsets`` in etcd as pending in their transaction;
        once it did, they are tracked as pending. Under the lock, so a re-read of the pending
        offsets (``settle_pending``) never runs across it."""
        async with self._lock:
            if self._is_closed():
                return ErrorCode.NOT_COORDINATOR
            error = await write()
            if error is ErrorCode.NONE:
                self.pending_txn.update(offsets)
            return error

    async def settle_pending(
        self, partitions: list[TopicPartition] | None
    ) -> tuple[set[TopicPartition], LoadedGroup | None]:
        """Re-read offsets that were pending in a transaction (its coordinator may have made
        them visible since): the requested partitions still pending, and what was read (None
        when nothing was). Every partition that was pending takes its stored offset, asked or
        not: the re-read stops tracking all of them (a transaction's offsets for p1, settled
        while p0 was asked, stayed stale for good).

        Under the lock: what was read is applied before any commit, deletion or
        TxnOffsetCommit of this group goes on. (Without it, a TxnOffsetCommit landing during
        the read was dropped from ``pending_txn``, its offset never read again once its
        transaction committed; and a commit landing during the read was overwritten here by
        the older offset read.)"""
        if not self._pending_asked(partitions):
            return set(), None  # the common case: nothing pending, no lock, no etcd read
        async with self._lock:
            asked = self._pending_asked(partitions)
            if not asked or self._is_closed():
                return asked, None
            loaded = await self._store.load(self.group_id)
            for tp in self.pending_txn:
                committed = loaded.offsets.get(tp)
                if committed is not None:
                    self.cache[tp] = committed
            self.pending_txn = set(loaded.pending)
            return asked & self.pending_txn, loaded

    def _pending_asked(self, partitions: list[TopicPartition] | None) -> set[TopicPartition]:
        return set(self.pending_txn) if partitions is None else self.pending_txn & set(partitions)

    def committed(
        self, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of ``partitions`` (None when nothing is committed), or all."""
        if partitions is None:
            return dict(sorted(self.cache.items()))
        return {tp: self.cache.get(tp) for tp in partitions}

    async def delete_group(self) -> ErrorCode:
        """DeleteGroups' write: metadata, offsets and lease leave etcd (under the lock, so no
        commit lands after it); the cache empties whatever the outcome."""
        error = ErrorCode.NONE
        async with self._lock:
            try:
                deleted = await self._store.delete_group(self.group_id, self._fence)
            except MetadataUnavailable as exc:
                log.warning("deleting group %s: %s", self.group_id, exc)
                deleted = False
                error = ErrorCode.COORDINATOR_NOT_AVAILABLE
            if not deleted and error is ErrorCode.NONE:
                error = ErrorCode.NOT_COORDINATOR
        self.cache.clear()
        return error
