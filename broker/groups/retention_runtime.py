"""Offset retention (KIP-211) in a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. This mixin keeps the one
fact the pure decision (``expiry``) needs that the group state machines do not: since when,
in wall-clock time, the group has had no members. It is noted after every change of
membership, stamped on the records written while the group is Empty (so a coordinator that
loads the group later counts from it, not from its own load), and taken from the loaded
record, or else the load time (never earlier than the truth). With members, the group's
subscribed topics are read at each check (``expiry.subscribed_topics``): the offsets of the
others may expire. ``expire_offsets`` is one
retention check: the expired offsets leave etcd, fenced like every group write, and an Empty
group left without offsets is deleted as DeleteGroups deletes it (Kafka: it becomes Dead).
The runtime owns the attributes declared below.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kafscale.broker.groups import expiry, release
from kafscale.broker.groups.model import EmptyTimeStore, GroupRecord, Store
from kafscale.broker.groups.offsets import GroupOffsets
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.groups.store import CommittedOffset, LoadedGroup, TopicPartition
from kafscale.broker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """Commit timestamps are wall-clock ms (``group_offsets``): retention is judged on them."""
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Expired:
    """What one retention check removed from a group."""

    offsets: list[TopicPartition] = field(default_factory=list)
    group_deleted: bool = False


class RetentionRuntime(RuntimeState):
    """Offset retention methods of ``GroupRuntime`` (which sets every attribute named here)."""

    _offsets: GroupOffsets
    _wall_clock: Callable[[], int]
    _loaded_at_ms: int
    _empty_since_ms: int | None
    _stored_record: GroupRecord | None
    """The group's record as etcd holds it (loaded, or last written here)."""

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        def _memberless(self) -> bool: ...

        def _busy(self) -> bool: ...

        def vacant(self) -> bool: ...

        async def delete(self) -> ErrorCode: ...

    def _start_retention(self, loaded: LoadedGroup, wall_clock: Callable[[], int]) -> None:
        """At load: the stored empty time of a record without members, else the load time."""
        self._wall_clock = wall_clock
        self._loaded_at_ms = wall_clock()
        record = self._stored_record = loaded.record
        self._empty_since_ms = None
        if record is not None and not record.has_members() and record.empty_since_ms is not None:
            self._empty_since_ms = min(record.empty_since_ms, self._loaded_at_ms)
        self._note_members()

    def _note_members(self) -> None:
        """After any change of membership: remember when the group was last seen to have none."""
        if not self._memberless():
            self._empty_since_ms = None
        elif self._empty_since_ms is None:
            self._empty_since_ms = self._wall_clock()

    def _stamped(self, record: GroupRecord) -> GroupRecord:
        """``record`` as stored: one without members carries the group's empty time."""
        if record.has_members():
            return record
        since = self._empty_since_ms
        return dataclasses.replace(
            record, empty_since_ms=self._wall_clock() if since is None else since
        )

    def _managed(self) -> bool:
        """The group uses group management (a protocol type, or a consumer-protocol group)."""
        group = self.group
        return self.consumer is not None or (group is not None and bool(group.protocol_type))

    def _activity(self, topics: Collection[str]) -> expiry.GroupActivity:
        """The group as it is now; ``topics``: those it has offsets of (with members, the ones
        its members subscribe to keep their offsets)."""
        empty_since = self._empty_since_ms if self._memberless() else None
        subscribed = None
        if empty_since is None:
            subscribed = expiry.subscribed_topics(self.group, self.consumer, topics)
        return expiry.GroupActivity(self._managed(), empty_since, self._loaded_at_ms, subscribed)

    # --- letting an idle group go (``release``) -----------------------------------------------

    def release_use(self, unused_s: float) -> release.GroupUse:
        """What ``release.decide`` needs of this group; ``unused_s``: since it was asked for."""
        stored = self._stored_record
        offsets = self._offsets.cache.values()
        return release.GroupUse(
            unused_s=unused_s,
            busy=self._busy() or self._offsets.in_flight(),
            memberless=self._memberless(),
            share=self.share is not None,
            holds_offsets=bool(offsets),
            offsets_timed=all(
                c.commit_timestamp_ms >= 0 or c.expire_timestamp_ms >= 0 for c in offsets
            ),
            managed=self._managed(),
            record_stored=stored is not None,
            stored_members=stored is not None and stored.has_members(),
            stored_empty_since_ms=None if stored is None else stored.empty_since_ms,
            empty_since_ms=self._empty_since_ms,
        )

    def store_empty_time(self) -> None:
        """Queue etcd's record of this memberless group again, stamped with the Empty time held
        here (``_stamped``), behind any other write: a reload then counts retention from it."""
        record = self._stored_record
        if record is None or record.has_members() or self.closed:
            return
        self._stores.put_nowait(Store(EmptyTimeStore(), record))

    async def expire_offsets(self, now_ms: int) -> Expired:
        """One retention check at wall-clock ``now_ms``. Share groups keep no committed
        offsets here and are not expired. Raises ``MetadataUnavailable`` when etcd does not
        answer the expiry (nothing removed; the coordinator's check reports it)."""
        if self.closed or self.share is not None:
            return Expired()
        retention_ms = self._config.offsets_retention_ms

        def decide(
            offsets: Mapping[TopicPartition, CommittedOffset], pending: Collection[TopicPartition]
        ) -> list[TopicPartition]:
            self._note_members()  # under the offsets' lock: the group as it is now
            activity = self._activity({topic for topic, _ in offsets})
            return expiry.expired_offsets(activity, offsets, pending, retention_ms, now_ms)

        error, expired = await self._offsets.expire(decide)
        if expired:
            log.info(
                "group %s: %d committed offsets expired (offsets retention %d ms)",
                self.group_id, len(expired), retention_ms,
            )  # fmt: skip
        exists = self.group is not None or self.consumer is not None
        if error is not ErrorCode.NONE or self.closed or not exists or not self.vacant():
            return Expired(expired)
        deleted = await self.delete() is ErrorCode.NONE
        if deleted:
            log.info("group %s: deleted: Empty with no committed offsets left", self.group_id)
        return Expired(expired, deleted)
