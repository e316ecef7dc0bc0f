"""The partitions this broker owns: acquiring leases, handing over, giving up.

Acquisition is a create-if-absent transaction on the lease key (bound to the broker's session)
that also bumps the leader epoch and records where it starts. Flushing and the fenced commits
live in ``flusher``; this module decides who owns what and what happens when ownership ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace

from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.aborted_index import (
    dropped_refs,
    kept_aborts_from,
    without_cleaned_aborts,
)
from kafscale.broker.metadata.cluster import ClusterView, TopicPartition
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    KeyValue,
    create_revision_is,
    delete_op,
    get_op,
    mod_revision_is,
    put_op,
    value_is,
)
from kafscale.broker.metadata.leaders import owner_refusal
from kafscale.broker.metadata.lease_claims import LeaseClaim, claim_lease
from kafscale.broker.metadata.partition_state import (
    Cleaned,
    PartitionState,
    TxnIndexRef,
    advance_log_start,
    start_epoch,
)
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.observability.logs import about
from kafscale.broker.protocol.errors import (
    KafkaError,
    MetadataTimeout,
    NotLeader,
    OffsetOutOfRange,
    UnknownTopicOrPartition,
)
from kafscale.broker.storage import aborted_index
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.flush_schedule import round_policy
from kafscale.broker.storage.flusher import MAX_ROUNDS_IN_FLIGHT, Flusher
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import FlushWork, OwnedPartition
from kafscale.broker.task_stop import start_task

log = logging.getLogger(__name__)

PARTITIONS_PER_TXN = 40  # 3 compares each stays under etcd's default --max-txn-ops (128)


class LogManager:
    def __init__(
        self,
        settings: BrokerSettings,
        etcd: Etcd,
        view: ClusterView,
        store: ObjectStore,
        cache: SegmentCache,
        broker_id: int,
        session: SessionLease,
    ) -> None:
        self._settings = settings
        self._cluster = settings.cluster
        self._etcd = etcd
        self._view = view
        self._store = store
        self._cache = cache
        self.broker_id = broker_id
        self._session = session
        self.owned: dict[TopicPartition, OwnedPartition] = {}
        self._acquire_locks: dict[TopicPartition, asyncio.Lock] = {}
        self._flusher = Flusher(
            settings.log,
            settings.cluster,
            broker_id,
            etcd,
            view,
            store,
            cache,
            self.owned,
            self._abandon,
            round_policy(settings, MAX_ROUNDS_IN_FLIGHT),
        )
        self._flush_task: asyncio.Task[None] | None = None
        self.acquiring = True  # False while draining: hand partitions over, take none

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._flush_task = start_task(self._flusher.run(), name="flush-loop")

    async def close(self) -> None:
        """Stop writes, flush what is buffered, release every lease we hold."""
        await self.release_all()
        if self._flush_task is not None:
            self._flush_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush_task

    def replace_session(self, session: SessionLease) -> None:
        self._session = session

    # --- ownership ---------------------------------------------------------------------------

    async def owned_partition(self, tp: TopicPartition) -> OwnedPartition:
        """The partition if we own it; claimed on demand if nobody holds its lease."""
        owned = self.owned.get(tp)
        if owned is not None:
            # Being released: re-acquiring our own lease here would bump the epoch under the
            # release's flush (fencing it) and keep a partition the assignment moved away.
            return self._as_owner(owned)
        holder = self._view.owners.get(tp)
        if holder is not None and holder != self.broker_id and holder in self._view.brokers:
            raise NotLeader(f"{tp[0]}-{tp[1]} is owned by broker {holder}")
        wanted = self._view.assignment.owners.get(tp)
        if (
            holder is None
            and wanted is not None
            and wanted != self.broker_id
            and wanted in self._view.brokers
            and wanted not in self._view.draining
        ):
            # Claim on demand only what nobody live is assigned: a client with stale metadata
            # must not pull a partition here that the assignment then moves straight back.
            raise NotLeader(f"{tp[0]}-{tp[1]} is assigned to broker {wanted}")
        lock = self._acquire_locks.setdefault(tp, asyncio.Lock())
        async with lock:
            owned = self.owned.get(tp)
            if owned is not None:
                return self._as_owner(owned)
            return await self._acquire(tp)

    def _as_owner(self, owned: OwnedPartition) -> OwnedPartition:
        """``owned``, if this broker may act as its owner now (``leaders.owner_refusal``)."""
        refusal = owner_refusal(owned.tp, owned.accepting, self._session.still_valid())
        if refusal is not None:
            raise NotLeader(refusal)
        return owned

    async def _acquire(self, tp: TopicPartition) -> OwnedPartition:
        topic, partition = tp
        info = self._view.topics.get(topic)
        if info is None or not 0 <= partition < info.partitions:
            raise UnknownTopicOrPartition(f"{topic}-{partition}")
        if not self._session.still_valid():  # lost, or suspended (``session_lease``)
            raise NotLeader("this broker's etcd session expired or is not renewed yet")
        if not self.acquiring:
            raise NotLeader("this broker is draining")
        lease_key = keys.partition_lease_key(self._cluster, topic, partition)
        state_key = keys.partition_state_key(self._cluster, topic, partition)
        topic_key = keys.topic_key(self._cluster, topic)
        me = str(self.broker_id).encode()
        try:
            lease, state_kv, topic_kv = await asyncio.gather(
                self._etcd.get(lease_key), self._etcd.get(state_key), self._etcd.get(topic_key)
            )
            if topic_kv is None:
                raise UnknownTopicOrPartition(f"{topic}-{partition}")
            claim = claim_lease(lease, me, self._session.id)
            if claim is LeaseClaim.CLEAR_STALE and lease is not None:
                lease = await self._clear_stale_lease(lease_key, lease)
                claim = claim_lease(lease, me, self._session.id)
        except MetadataUnavailable as exc:
            raise MetadataTimeout(str(exc)) from exc
        if claim is LeaseClaim.REFUSE:
            holder = lease.value.decode() if lease is not None else "another broker"
            raise NotLeader(f"{topic}-{partition} is owned by broker {holder}")
        if claim is LeaseClaim.CLEAR_STALE:  # put back on an old session between two reads
            raise NotLeader(f"lost the race for {topic}-{partition}")
        state = PartitionState.from_json(state_kv.value) if state_kv else PartitionState()
        new_state = start_epoch(state)
        compares = [
            create_revision_is(topic_key, topic_kv.create_revision),
            mod_revision_is(state_key, state_kv.mod_revision)
            if state_kv
            else create_revision_is(state_key, 0),
        ]
        success = [put_op(state_key, new_state.to_json())]
        if lease is None:
            compares.append(create_revision_is(lease_key, 0))
            success.append(put_op(lease_key, me, lease=self._session.id))
        else:
            compares += [
                value_is(lease_key, me),
                create_revision_is(lease_key, lease.create_revision),
            ]
        try:
            result = await self._etcd.txn(compares, success)
        except MetadataUnavailable as exc:
            raise MetadataTimeout(str(exc)) from exc
        except LeaseLost as exc:  # the session ended before its keepalive told us: retriable
            raise NotLeader("this broker's etcd session expired") from exc
        if not result.succeeded:
            raise NotLeader(f"lost the race for {topic}-{partition}")
        lease_revision = result.revision if lease is None else lease.create_revision
        owned = OwnedPartition(
            topic=topic,
            partition=partition,
            topic_id=info.topic_id,
            state=new_state,
            state_revision=result.revision,
            lease_revision=lease_revision,
        )
        self.owned[tp] = owned
        self._view.owners[tp] = self.broker_id
        self._view.update_state(tp, new_state, result.revision)
        log.info(
            "acquired %s-%d at epoch %d, HW %d",
            topic,
            partition,
            new_state.leader_epoch,
            new_state.high_watermark,
            extra=about(tp),
        )
        return owned

    async def _clear_stale_lease(self, lease_key: str, stale: KeyValue) -> KeyValue | None:
        """Delete our lease key bound to a session we gave up (``lease_claims``), fenced on its
        value and create revision; what the key is now (None once deleted: create it anew)."""
        fence = [
            value_is(lease_key, stale.value),
            create_revision_is(lease_key, stale.create_revision),
        ]
        result = await self._etcd.txn(fence, [delete_op(lease_key)], [get_op(lease_key)])
        if result.succeeded:
            log.info("cleared %s, bound to an earlier etcd session of ours", lease_key)
            return None
        return result.kv(0)

    async def release(self, tp: TopicPartition) -> None:
        """Hand a partition over: stop appends, flush what is buffered, delete the lease."""
        owned = self.owned.get(tp)
        if owned is None:
            return
        owned.accepting = False
        while owned.busy:
            self._flusher.flush_soon()
            await self._flusher.wait_progress()
            if self.owned.get(tp) is not owned:
                return  # the flush failed and abandoned it
        await self._delete_lease(owned)  # still listed (not accepting) until the lease is gone
        if self.owned.get(tp) is owned:
            del self.owned[tp]

    async def release_all(self) -> None:
        for owned in list(self.owned.values()):
            owned.accepting = False
        await asyncio.gather(*(self.release(tp) for tp in list(self.owned)), return_exceptions=True)

    def abandon_all(self, error: KafkaError) -> None:
        """The session is gone: nothing we buffered can be committed any more."""
        for owned in list(self.owned.values()):
            self._abandon(owned, error, [])

    def abandon_topic(self, topic: str) -> None:
        for owned in [o for o in self.owned.values() if o.topic == topic]:
            self._abandon(owned, UnknownTopicOrPartition(f"topic {topic} was deleted"), [])

    async def _delete_lease(self, owned: OwnedPartition) -> None:
        lease_key = keys.partition_lease_key(self._cluster, owned.topic, owned.partition)
        compares = [
            value_is(lease_key, str(self.broker_id).encode()),
            create_revision_is(lease_key, owned.lease_revision),
        ]
        try:
            await self._etcd.txn(compares, [delete_op(lease_key)])
        except MetadataUnavailable:
            log.warning(
                "could not release %s-%d; it expires with the session", *owned.tp,
                extra=about(owned.tp),
            )  # fmt: skip
        if self._view.owners.get(owned.tp) == self.broker_id:
            self._view.owners.pop(owned.tp, None)

    def _abandon(
        self, owned: OwnedPartition, error: BaseException, flushing: list[FlushWork]
    ) -> None:
        for work in flushing:
            for batch in work.batches:
                if not batch.acked.done():
                    batch.acked.set_exception(error)
        owned.fail_everything(error)
        if self.owned.get(owned.tp) is owned:
            del self.owned[owned.tp]
        # A deleted topic is an operator's act, not a fault: it is logged, not warned about.
        level = logging.INFO if isinstance(error, UnknownTopicOrPartition) else logging.WARNING
        log.log(level, "gave up %s-%d: %s", *owned.tp, error, extra=about(owned.tp))

    async def delete_records(self, tp: TopicPartition, offset: int) -> int:
        """Advance the log start offset (DeleteRecords, retention); returns the new one.

        It commits under the flusher's commit lock, so it is ordered with flush commits: each
        one starts from the state the other left.
        """
        owned = await self.owned_partition(tp)
        async with self._flusher.commit_lock:
            if offset == -1:
                offset = owned.state.high_watermark
            if offset > owned.state.high_watermark or offset < 0:
                raise OffsetOutOfRange(f"offset {offset} is beyond the high watermark")
            if offset <= owned.state.log_start_offset:
                return owned.state.log_start_offset
            if self.owned.get(tp) is not owned:
                raise NotLeader(f"{tp[0]}-{tp[1]} was given up")
            state = advance_log_start(owned.state, offset)
            state_key, compares = self._owner_fence(owned)
            try:
                result = await self._etcd.txn(compares, [put_op(state_key, state.to_json())])
            except MetadataUnavailable as exc:
                raise MetadataTimeout(str(exc)) from exc
            if not result.succeeded:
                self._abandon(owned, NotLeader("lease lost"), [])
                raise NotLeader(f"{tp[0]}-{tp[1]}: lease lost")
            dropped = dropped_refs(owned.state, state)
            owned.state = state
            owned.state_revision = result.revision
            self._view.update_state(tp, state, result.revision)
        await self._delete_aborted_indexes(owned, dropped)
        return state.log_start_offset

    def _owner_fence(self, owned: OwnedPartition) -> tuple[str, list[Compare]]:
        """The partition's state key and the compares that fence a write of it to its owner:
        our lease (the same one we took) and the state revision we last wrote or read, as a
        flush commit is fenced."""
        lease_key = keys.partition_lease_key(self._cluster, owned.topic, owned.partition)
        state_key = keys.partition_state_key(self._cluster, owned.topic, owned.partition)
        return state_key, [
            value_is(lease_key, str(self.broker_id).encode()),
            create_revision_is(lease_key, owned.lease_revision),
            mod_revision_is(state_key, owned.state_revision),
        ]

    async def commit_cleaned(
        self,
        owned: OwnedPartition,
        cleaned: Cleaned,
        was: Cleaned | None,
        last_removed_abort: int = -1,
    ) -> bool:
        """Commit a compaction pass (``docs/compaction.md``): the state's ``cleaned`` becomes
        ``cleaned``, and the aborted transactions ending below its ``upto`` go with it
        (``aborted_index.without_cleaned_aborts``), fenced as a flush commit is (lease and state
        revision) and ordered with flush commits under their lock. False (nothing committed)
        when the partition was given up, re-acquired at another epoch or cleaned by someone
        else since the pass began (its objects, under its own epoch's prefix, are then orphans
        the next pass deletes), or when a flush's spill moved an abort marker the pass removed
        (``last_removed_abort``) into an index object that stays (the next pass keeps it)."""
        async with self._flusher.commit_lock:
            if (
                self.owned.get(owned.tp) is not owned
                or owned.failed
                or owned.epoch != cleaned.epoch
                or owned.state.cleaned != was
            ):
                return False
            if last_removed_abort >= kept_aborts_from(owned.state, cleaned.upto):
                log.info("compaction pass of %s-%d raced a spill; not committed", *owned.tp)
                return False
            state = without_cleaned_aborts(replace(owned.state, cleaned=cleaned), cleaned.upto)
            state_key, compares = self._owner_fence(owned)
            document = state.to_json()
            try:
                result = await self._etcd.txn(compares, [put_op(state_key, document)])
            except MetadataUnavailable as exc:
                log.warning("compaction commit of %s-%d: %s", *owned.tp, exc)
                return await self._cleaned_if_applied(owned, state, state_key, document)
            if not result.succeeded:
                self._abandon(owned, NotLeader("lease lost"), [])
                return False
            self._committed_cleaned(owned, state, result.revision)
            return True

    async def _cleaned_if_applied(
        self, owned: OwnedPartition, state: PartitionState, state_key: str, document: bytes
    ) -> bool:
        """An unanswered compaction commit may have been applied: read the state back once.
        Taken as not applied, an applied one left ``state_revision`` stale, so the partition's
        next flush commit failed its compare and the partition was given up (its produces
        failed with NOT_LEADER_OR_FOLLOWER), and its superseded segments were never deleted.
        Our document is ours alone (it holds our epoch); if etcd does not answer again, the
        outcome stays unknown and the next commit's compare decides."""
        try:
            stored = await self._etcd.get(state_key)
        except MetadataUnavailable:
            return False
        if stored is None or stored.value != document:
            return False
        self._committed_cleaned(owned, state, stored.mod_revision)
        return True

    def _committed_cleaned(
        self, owned: OwnedPartition, state: PartitionState, revision: int
    ) -> None:
        owned.state = state
        owned.state_revision = revision
        self._view.update_state(owned.tp, state, revision)

    async def _delete_aborted_indexes(
        self, owned: OwnedPartition, dropped: list[TxnIndexRef]
    ) -> None:
        """Delete the aborted-transaction index objects the log start passed (all their records
        are gone). A failure leaves them: garbage that a later owner's janitor deletes."""
        if not dropped:
            return
        where = (owned.topic, owned.topic_id, owned.partition)
        doomed = [aborted_index.object_key(self._cluster, *where, ref) for ref in dropped]
        try:
            await self._store.delete_many(doomed)
        except ObjectStoreError as exc:
            log.warning("could not delete %d aborted-transaction index(es): %s", len(doomed), exc)

    # --- flushing ----------------------------------------------------------------------------

    def appended(self, owned: OwnedPartition) -> None:
        """Batches were buffered in ``owned``: the flusher schedules their round."""
        self._flusher.data_appended(owned.pending_bytes >= self._flusher.segment_bytes(owned))

    async def flush_all(self) -> None:
        """Flush everything buffered now (handoff, shutdown, tests)."""
        while any(o.busy for o in self.owned.values()):
            self._flusher.flush_soon()
            await self._flusher.wait_progress()
