"""The etcd writer task of a coordinated group's async shell (``runtime``).

Kept apart so ``runtime.GroupRuntime`` stays one concern per module. Every group record the
group's parts queue (``Store``: a classic generation, a consumer or share group's snapshot, a
memberless record stamped with its Empty time) is written by this one task, in queue order,
fenced by the group's lease, and its outcome goes back to whoever waits on it: the classic
state machine (``Group.stored``), the consumer or share part's version-numbered futures. A
write the fence refuses means the lease is no longer ours: the group is let go (``_lose``)
and the task ends. The runtime owns the attributes declared below.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafscale.broker.groups.change_log import log_group_change
from kafscale.broker.groups.consumer_codec import Document
from kafscale.broker.groups.model import (
    AssignmentStore,
    ConsumerStore,
    EmptyStore,
    EmptyTimeStore,
    GroupRecord,
    Store,
)
from kafscale.broker.groups.runtime_state import RuntimeState
from kafscale.broker.groups.store import Fence, GroupStore
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.observability.log_limit import ClientEvent, client_log, named
from kafscale.broker.protocol.errors import ErrorCode

# The logger these lines had before ``runtime`` was split: a log line's ``logger`` field is
# output operators filter on (docs/monitoring.md), so the split leaves it as it was.
log = logging.getLogger("kafscale.broker.groups.runtime")


class WriterRuntime(RuntimeState):
    """The etcd writer task of ``GroupRuntime`` (which sets every attribute named here)."""

    fence: Fence
    _store: GroupStore
    _storing: bool
    _stored_record: GroupRecord | None

    if TYPE_CHECKING:  # defined by the other parts of ``GroupRuntime``; absent at run time,
        # so no stub here can stand before the real method in the runtime's MRO

        def _lose(self, reason: str) -> None: ...

        def _stamped(self, record: GroupRecord) -> GroupRecord: ...

        def _consumer_stored(self, version: int, error: ErrorCode) -> None: ...

        def _share_store_done(
            self, version: int, document: Document | None, error: ErrorCode
        ) -> None: ...

    async def _run_stores(self) -> None:
        while True:
            store = await self._stores.get()
            self._storing = True  # off the queue, not in etcd yet: ``vacant`` counts it
            try:
                error = await self._write(store)
            finally:
                self._storing = False
            if error is None:
                return  # fenced: the group is being let go, its waiters told NOT_COORDINATOR
            if isinstance(store.token, EmptyTimeStore):
                continue
            if isinstance(store.token, ConsumerStore):
                if store.record.group_type == "share":
                    document = dict(store.record.consumer or {})
                    self._share_store_done(store.token.version, document, error)
                self._consumer_stored(store.token.version, error)
                continue
            if self.group is not None and not self.closed:
                self.group.stored(self._clock(), store.token, error)
                self._apply(self.group.take_effects())
                self._log_stored(store, error)

    async def _write(self, store: Store) -> ErrorCode | None:
        """Write one group record to etcd: the outcome the waiting members are told (None: the
        lease is no longer ours, and the group is let go). Every failure is an answer and the
        writer goes on: one that ended it (etcd refusing a record over its request size limit
        with "request is too large") left the SyncGroup waiting on the write, and every later
        rebalance's, unanswered for good while the group stayed coordinated here. A refused
        record gets UNKNOWN_SERVER_ERROR, as Kafka answers a group record too large for its
        log; etcd out of reach, COORDINATOR_NOT_AVAILABLE (clients retry)."""
        try:
            record = self._stamped(store.record)
            stored = await self._store.save_group(self.group_id, record, self.fence)
        except MetadataUnavailable as exc:
            log.warning("storing group %s: %s", self.group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        except Exception as exc:  # etcd refused the write, or a bug: answered either way
            client_log(
                log, logging.ERROR, ClientEvent.INTERNAL_ERROR, named("group", self.group_id),
                "storing group %s failed: %s", self.group_id, exc,
                exc_info=not isinstance(exc, MetadataError),
            )  # fmt: skip
            return ErrorCode.UNKNOWN_SERVER_ERROR
        if not stored:
            self._lose("group metadata write fenced: the group lease is no longer ours")
            return None
        self._stored_record = record
        return ErrorCode.NONE

    def _log_stored(self, store: Store, error: ErrorCode) -> None:
        record = store.record
        if error is not ErrorCode.NONE:
            log.warning("group %s: generation %d not stored", self.group_id, record.generation)
        elif isinstance(store.token, AssignmentStore):
            log_group_change(
                log,
                self.group_id,
                "group %s: generation %d stable, %d members, protocol %s, leader %s",
                self.group_id,
                record.generation,
                len(record.members),
                record.protocol_name,
                record.leader,
            )
        elif isinstance(store.token, EmptyStore):
            log_group_change(
                log,
                self.group_id,
                "group %s: generation %d empty",
                self.group_id,
                record.generation,
            )
        else:
            log_group_change(
                log, self.group_id, "group %s: static member rejoined, no rebalance", self.group_id
            )
