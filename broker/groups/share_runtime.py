"""The share group (KIP-932) part of a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module: this mixin turns
ShareGroupHeartbeat and the share offset admin's "is the group empty?" into decisions of the
pure ``share.ShareGroup`` and queues its snapshot for etcd on the runtime's single writer
(the same version-numbered waiters as consumer-protocol groups). The runtime owns the
attributes declared below; the mixin only reads and updates them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from kafscale.broker.groups import group_configs
from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.consumer import HeartbeatResult
from kafscale.broker.groups.consumer_codec import Document
from kafscale.broker.groups.model import ConsumerStore, GroupRecord, Store
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.groups.share import ShareConfig, ShareGroup, ShareHeartbeat
from kafscale.broker.groups.share_codec import roll_back
from kafscale.broker.groups.share_codec import snapshot as snapshot_share
from kafscale.broker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class ShareRuntime(RuntimeState):
    """Share group methods of ``GroupRuntime`` (which sets every attribute named here)."""

    _own_configs: Callable[[], Mapping[str, str]]
    _share_doc: Document | None
    _share_stored: Document | None
    _consumer_version: int
    _consumer_waiters: dict[int, asyncio.Future[ErrorCode]]

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        async def _await_stored(self, stored: asyncio.Future[ErrorCode]) -> ErrorCode: ...

    def _share_config(self) -> ShareConfig:
        return group_configs.share_config(self._config.share, self._own_configs())

    async def share_heartbeat(
        self,
        request: ShareHeartbeat,
        topics: Mapping[str, int],
        topic_ids: Mapping[str, str] | None = None,
    ) -> HeartbeatResult:
        """ShareGroupHeartbeat. A group id that is a classic or consumer group (even one with
        only offsets) is GROUP_ID_NOT_FOUND, as Kafka answers; a share group is created by its
        first join. Answered once a change of the group is in etcd."""
        self._check_open()
        if self.consumer is not None or self.group is not None:
            message = f"group {self.group_id} is not a share group"
            return HeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, message)
        share = self.share
        if share is None:
            if request.member_epoch != 0:
                message = f"member {request.member_id} is not in group {self.group_id}"
                return HeartbeatResult(ErrorCode.UNKNOWN_MEMBER_ID, message)
            share = self.share = ShareGroup(self.group_id, self._share_config())
        share.config = self._share_config()
        result = share.heartbeat(self._clock(), request, topics, topic_ids)
        stored = self._queue_share(share)
        if stored is not None and (error := await self._await_stored(stored)):
            # Not in etcd: the group is back to what etcd has (``_share_store_done``), so the
            # member's next heartbeat, with the epoch it knows, makes the change again.
            return HeartbeatResult(error)
        if result.assignment is not None and self.share is share:
            share.assignment_sent(request.member_id, result.assignment)
        return result

    async def empty_share_group(self) -> ErrorCode:
        """Share group offset admin (Alter/DeleteShareGroupOffsets) needs an empty share
        group: created (empty, in etcd) if the id is free, NON_EMPTY_GROUP while it has
        members, GROUP_ID_NOT_FOUND if the id is another type's."""
        self._check_open()
        if self.consumer is not None or self.group is not None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self.share is None:
            self.share = ShareGroup(self.group_id, self._share_config())
            stored = self._queue_share(self.share)
            if stored is not None and (error := await self._await_stored(stored)):
                return error
        return ErrorCode.NONE if self.share.is_empty() else ErrorCode.NON_EMPTY_GROUP

    def _tick_share(self) -> None:
        """The timer task's share step: members whose session ran out leave the group."""
        share = self.share
        if share is None or self.closed:
            return
        expired = share.tick(self._clock())
        if expired:
            log_group_change(
                log, self.group_id, "share group %s: members expired: %s", self.group_id,
                ", ".join(expired),
            )  # fmt: skip
        self._queue_share(share)

    def _queue_share(self, share: ShareGroup) -> asyncio.Future[ErrorCode] | None:
        """Queue the share group's state for etcd if it changed: the future of that write."""
        self._wake.set()
        document = snapshot_share(share)
        if document == self._share_doc or self.closed:
            return None
        self._share_doc = document
        self._consumer_version += 1
        record = GroupRecord(
            "share", share.group_epoch, None, None, group_type="share", consumer=document
        )
        self._stores.put_nowait(Store(ConsumerStore(self._consumer_version), record))
        future = asyncio.get_running_loop().create_future()
        self._consumer_waiters[self._consumer_version] = future
        return future

    def _share_store_done(self, version: int, document: Document | None, error: ErrorCode) -> None:
        """The single writer's outcome for a share group's document. Stored: it is what etcd
        has. Failed, and no later write queued (a later one carries this change too and
        decides): the in-memory group goes back to what etcd has, as Kafka's coordinator
        reverts its in-memory state when a write fails. Otherwise a member whose answer was
        lost would be fenced at its next heartbeat by an epoch it never heard of, and the
        owners, who read membership from etcd, would disagree with the coordinator."""
        if error is ErrorCode.NONE:
            self._share_stored = document
            return
        share = self.share
        if version != self._consumer_version or share is None or self.closed:
            return
        if self._share_stored is None:
            self.share = None  # never stored: the group was never created
        else:
            roll_back(share, self._share_stored, self._clock())
        self._share_doc = self._share_stored
        log.warning("share group %s: membership not stored, changes undone", self.group_id)
