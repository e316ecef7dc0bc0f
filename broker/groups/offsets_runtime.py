"""Committed offsets in a coordinated group's async shell (``runtime``): who may touch them.

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. The offsets themselves,
their cache, their lock and their fenced etcd writes are ``offsets.GroupOffsets``; this mixin
decides, on the group as it is (classic, consumer-protocol or share), whether a request may
commit, fetch or delete them (OffsetCommit, OffsetFetch v9+, TxnOffsetCommit, OffsetDelete),
and makes a group of an id that only committed offsets, as Kafka does. The runtime owns the
attributes declared below.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from kafscale.broker.groups import offset_delete
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.offsets import GroupOffsets
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.groups.store import CommittedOffset, TopicPartition
from kafscale.broker.protocol.errors import ErrorCode


class OffsetsRuntime(RuntimeState):
    """Offset methods of ``GroupRuntime`` (which sets every attribute named here)."""

    _offsets: GroupOffsets

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        def _groupless(self) -> bool: ...

    async def commit(
        self,
        member_id: str,
        group_instance_id: str | None,
        generation: int,
        offsets: Mapping[TopicPartition, CommittedOffset],
        version: int = 8,
    ) -> ErrorCode:
        if self.closed:
            return ErrorCode.NOT_COORDINATOR
        if self.share is not None:
            return ErrorCode.GROUP_ID_NOT_FOUND  # a share group has no committed offsets
        if self.consumer is not None:
            error = self.consumer.validate_commit(member_id, generation, version)
            if error is not ErrorCode.NONE or not offsets:
                return error
            return await self._offsets.save(offsets)
        group = self.group
        if group is None:
            if generation >= 0:
                return ErrorCode.ILLEGAL_GENERATION  # not a group we know: an old generation
            group = self.group = Group(self.group_id, self._config, self._clock())
        error = group.validate_commit(self._clock(), member_id, group_instance_id, generation)
        self._apply(group.take_effects())
        if error is not ErrorCode.NONE or not offsets:
            return error
        return await self._offsets.save(offsets)

    async def delete_offsets(
        self, partitions: list[TopicPartition]
    ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """OffsetDelete: (group error, per-partition answers), decided (``offset_delete``) on
        the group as it is once no commit is in flight (``GroupOffsets.delete``)."""
        return await self._offsets.delete(
            partitions,
            lambda: offset_delete.decide(self.group, self.consumer, {t for t, _ in partitions}),
        )

    def validate_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: a consumer-protocol member must name its current epoch. A share
        group has no committed offsets: GROUP_ID_NOT_FOUND (Kafka's
        ``ShareGroup.validateOffsetFetch``), not an empty answer, and not the settling of
        pending offsets below, which would make a classic group beside it."""
        if self.share is not None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.consumer is None:
            return ErrorCode.NONE
        return self.consumer.validate_fetch(member_id, member_epoch)

    def validate_txn_commit(
        self, member_id: str, group_instance_id: str | None, generation: int
    ) -> ErrorCode:
        """TxnOffsetCommit's member check (KIP-447): only when it names a generation (for a
        consumer-protocol group, the member's epoch; a stale one is ILLEGAL_GENERATION, the code
        TxnOffsetCommit clients know). A share group has no committed offsets:
        GROUP_ID_NOT_FOUND, as OffsetCommit answers (Kafka's ``ShareGroup.validateOffsetCommit``,
        transactional or not); taking them once made the offsets' settling turn the share group
        into a classic one, and its members' heartbeats GROUP_ID_NOT_FOUND."""
        if self.closed:
            return ErrorCode.NOT_COORDINATOR
        if self.share is not None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.consumer is not None:
            error = self.consumer.validate_fetch(member_id or None, generation)
            return ErrorCode.ILLEGAL_GENERATION if error is ErrorCode.STALE_MEMBER_EPOCH else error
        if self.group is None:
            # Kafka's ``validateTransactionalOffsetCommit``: a group nobody joined takes
            # offsets from a producer outside group management (generation -1) only; a
            # generation names a group that is not there.
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if generation < 0:
            return ErrorCode.NONE
        error = self.group.validate_commit(self._clock(), member_id, group_instance_id, generation)
        self._apply(self.group.take_effects())
        return error

    async def add_pending(
        self,
        offsets: Mapping[TopicPartition, CommittedOffset],
        write: Callable[[], Awaitable[ErrorCode]],
    ) -> ErrorCode:
        """TxnOffsetCommit's write (``GroupOffsets.add_pending``). A group nobody joined
        becomes an empty classic group once its pending offsets are written, as Kafka's
        ``validateTransactionalOffsetCommit`` creates one: OffsetDelete, DescribeGroups and
        ListGroups find it before the transaction ends."""
        error = await self._offsets.add_pending(offsets, write)
        if error is ErrorCode.NONE and offsets and self._groupless():
            self.group = Group(self.group_id, self._config, self._clock())
        return error

    async def settle_pending(self, partitions: list[TopicPartition] | None) -> set[TopicPartition]:
        """The requested partitions whose offsets are still pending in a transaction, after a
        re-read (``GroupOffsets.settle_pending``). Offsets found for a group nobody joined make
        it a group (one that only ever committed offsets)."""
        still_pending, loaded = await self._offsets.settle_pending(partitions)
        if loaded is not None and loaded.offsets and self._groupless():
            self.group = Group(self.group_id, self._config, self._clock())
        return still_pending

    def committed(
        self, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """Committed offsets of ``partitions`` (None when nothing is committed), or all."""
        self._check_open()
        return self._offsets.committed(partitions)
