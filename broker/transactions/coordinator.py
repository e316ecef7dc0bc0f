"""The transaction coordinator of one broker.

A transactional id is coordinated here only while this broker holds its lease
(``leases/transactions/<id>``, create-if-absent, bound to the broker's session), exactly as
groups are (``groups.leases``; FindCoordinator key type 1 names the holder, or the broker that
will take it). Every decision is ``state``'s; this class loads the transaction from etcd, asks,
and writes the answer back fenced by the lease. Requests for one transactional id run one at a
time (a lock per id).

Ending a transaction: EndTxn writes PREPARE_COMMIT / PREPARE_ABORT, then a completion task asks
each partition's owner to write the marker (``markers``), moves the transaction's offsets into
the groups' committed offsets (or drops them), and writes COMPLETE_*. EndTxn answers when the
transaction is complete, or after a bounded wait (PREPARE_* is durable: the outcome is decided).

Recovery and timeouts: a periodic check (``transactions.check_interval_ms``, and at once when a
transaction lease is released, e.g. its coordinator died and its session expired) reads every
transaction; one left PREPARE_* or timed out ONGOING whose coordinator is gone is taken over by
the broker FindCoordinator would name, which finishes it the same way. A timed-out ONGOING
transaction is aborted with its epoch bumped, which fences the producer that let it time out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kafscale.broker.config import TransactionSettings
from kafscale.broker.groups.coordinator import CoordinatorHost
from kafscale.broker.groups.leases import GroupLeases, name_coordinator
from kafscale.broker.groups.store import Fence
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError, MetadataUnavailable
from kafscale.broker.observability.log_limit import ClientEvent, client_log, named
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.protocol.errors import ErrorCode, NotCoordinator
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.task_stop import start_task
from kafscale.broker.transactions import state
from kafscale.broker.transactions.inter_broker_client import PLAINTEXT_LINK, InterBrokerClient
from kafscale.broker.transactions.markers import Marker, MarkerWriter, WriteHere
from kafscale.broker.transactions.state import (
    InitAction,
    Recovery,
    TopicPartition,
    TxnMetadata,
    TxnState,
)
from kafscale.broker.transactions.store import StoredTxn, TxnStore
from kafscale.broker.transactions.verification import PartitionVerifier

log = logging.getLogger(__name__)


def log_change(transactional_id: str, msg: str, *args: object) -> None:
    """An INFO line about one transactional id (a producer (re)initialised, a transaction
    aborted or timed out): a client can cause one per request, so they are limited per id
    (``log_limit``): the first ten per minute of each, then a count."""
    client_log(
        log, logging.INFO, ClientEvent.TRANSACTION_CHANGE,
        named("transactional id", transactional_id), msg, *args,
    )  # fmt: skip


END_TXN_WAIT_S = 10.0
"""How long EndTxn (and an InitProducerId that had to abort first) waits for the markers."""
_RETRY_S = 0.2
_SESSION_POLL_S = 0.1


def now_ms() -> int:
    return int(time.time() * 1000)


def coordinator_epoch(fence: Fence) -> int:
    """The epoch WriteTxnMarkers carries: the lease's create revision (etcd revisions only grow,
    so a later coordinator of the same id always has a larger one), kept within an i32."""
    return fence.create_revision % 2**31


class TxnHost(CoordinatorHost, Protocol):
    """What the coordinator needs from its broker: a group coordinator's host, and where each
    partition's owner is (for the markers)."""

    def leader_for(self, tp: TopicPartition) -> int: ...


class _IdLock:
    """A transactional id's lock and how many requests hold or wait for it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class _Routing:
    def __init__(self, host: TxnHost) -> None:
        self._host = host

    def leader_for(self, tp: TopicPartition) -> int:
        return self._host.leader_for(tp)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._host.view.brokers.get(node_id)

    def topic_exists(self, topic: str) -> bool:
        return topic in self._host.view.topics


@dataclass(frozen=True, slots=True)
class EndResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class InitResult:
    error: ErrorCode
    producer_id: int = -1
    producer_epoch: int = -1


class TransactionCoordinator:
    def __init__(
        self,
        host: TxnHost,
        settings: TransactionSettings,
        link: UpstreamLink = PLAINTEXT_LINK,
        markers_here: WriteHere | None = None,
    ) -> None:
        """``link``: how markers reach partition owners (the inter-broker listener's security);
        ``markers_here``: how they are written to this broker's own partitions, in place."""
        self._host = host
        self.settings = settings
        self.store = TxnStore(host.etcd, host.cluster)
        self._leases = GroupLeases(
            host.etcd,
            host.cluster,
            self._on_lease_change,
            prefix=keys.transaction_leases_prefix(host.cluster),
            key_of=keys.transaction_lease_key,
            before_release=lambda holder, revision: host.view.know_draining_at(holder, revision),
        )
        self.client = InterBrokerClient(max(host.etcd.timeout_s, 5.0), link)
        self._markers = MarkerWriter(_Routing(host), self.client, host.node_id, markers_here)
        self.verifier = PartitionVerifier(self, self.client, host.node_id)
        self._fences: dict[str, Fence] = {}
        # What this coordinator last wrote per transactional id, and under which lease (writes
        # run under the id's lock and lease: while that lease is held nobody else writes), so
        # that verifications need not read etcd. Dropped with the lease, and on a write whose
        # outcome is unknown.
        self._saved: dict[str, tuple[Fence, TxnMetadata]] = {}
        self._locks: dict[str, _IdLock] = {}  # only while a request for the id runs
        self._completions: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._claiming = True  # False: serve the ids held here, take on no other

    async def start(self) -> None:
        await self._leases.start()
        self._tasks.append(start_task(self._check_loop(), name="txn-check"))
        self._tasks.append(start_task(self._follow_session(), name="txn-session"))

    def stop_claiming(self) -> None:
        """Take on no transactional id from now on (NOT_COORDINATOR, and no take-over of a
        gone coordinator's transactions), keep serving those held here until ``close``: the
        whole cluster is stopping (``groups.coordinator.GroupCoordinator.stop_claiming``)."""
        self._claiming = False

    async def close(self) -> None:
        """Stop coordinating; release the leases so that other brokers take over at once."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.hand_over()
        await self._leases.close()
        await self.client.close()

    async def hand_over(self) -> None:
        """Give every transactional id up (the broker drains or stops): the completions running
        here stop and each id's lease is released, so the next coordinator loads the id's
        state from etcd and goes on with it. An ONGOING transaction is ended there by the
        producer's EndTxn (a request here meanwhile gets NOT_COORDINATOR: its fenced write
        fails, or no lease is taken while draining); a PREPARE_* one is finished by that
        coordinator's check, woken by the released lease (``_on_lease_change``)."""
        completions = list(self._completions.values())
        for task in completions:
            task.cancel()
        await asyncio.gather(*completions, return_exceptions=True)
        fences, self._fences = list(self._fences.values()), {}
        self._saved.clear()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._host.etcd.timeout_s):
                await asyncio.gather(*(self._leases.release(f) for f in fences))

    # --- finding the coordinator ----------------------------------------------------------

    @property
    def handing_over(self) -> bool:
        """Whether this broker gives its transactional ids up: it drains or stops
        (``GroupCoordinator.handing_over``)."""
        return self._closed or self._host.draining

    def coordinator_for(self, transactional_id: str) -> BrokerInfo | None:
        """As the group coordinator's (``GroupCoordinator.coordinator_for``): never this broker
        while it hands its transactional ids over."""
        view = self._host.view
        chosen = name_coordinator(
            transactional_id,
            self._leases.holder(transactional_id),
            view.brokers.keys(),
            view.draining,
            (self._host.node_id,) if self.handing_over else (),
        )
        return None if chosen is None else view.brokers.get(chosen)

    @contextlib.asynccontextmanager
    async def _lock(self, transactional_id: str) -> AsyncIterator[None]:
        """Run one request for ``transactional_id`` at a time. The lock lives while someone
        holds or waits for it: one kept per id ever named grew without bound."""
        entry = self._locks.get(transactional_id)
        if entry is None:
            entry = self._locks[transactional_id] = _IdLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0 and self._locks.get(transactional_id) is entry:
                del self._locks[transactional_id]

    async def _let_go_if_unknown(self, transactional_id: str, stored: StoredTxn | None) -> None:
        """Give the lease of a transactional id with no record back (under its lock).

        AddPartitionsToTxn, EndTxn or DescribeTransactions naming an id nobody initialised is
        answered with an error (Kafka keeps nothing for it); the lease taken to answer it was
        kept for good, an etcd key and a watch entry on every broker per name asked."""
        if stored is not None or transactional_id in self._saved:
            return
        fence = self._fences.pop(transactional_id, None)
        if fence is not None:
            await self._give_back(fence)

    async def _give_back(self, fence: Fence) -> None:
        """Release a lease no request here will use (bounded: else it goes with the session)."""
        with contextlib.suppress(MetadataUnavailable, TimeoutError):
            async with asyncio.timeout(self._host.etcd.timeout_s):
                await self._leases.release(fence)

    def held(self) -> dict[str, int]:
        """How much this coordinator holds (for ``/status``)."""
        return {
            "transactional_ids": len(self._fences),
            "transaction_locks": len(self._locks),
            "transaction_leases": len(self._leases.owners),
        }

    async def _fence(self, transactional_id: str) -> Fence:
        """The lease of ``transactional_id``, taken if free; NotCoordinator if another broker
        holds it. MetadataUnavailable when etcd cannot answer."""
        host = self._host
        session = host.session
        if not session.still_valid():  # lost, or suspended: no fence is acted on (session_lease)
            raise NotCoordinator("this broker's etcd session expired or is not renewed yet")
        fence = self._fences.get(transactional_id)
        if fence is not None:
            return fence
        if self._closed:
            raise NotCoordinator("this broker is shutting down")
        if host.draining:
            raise NotCoordinator("this broker is draining")
        if not self._claiming:
            raise NotCoordinator("this broker is stopping with its cluster")
        try:
            fence = await self._leases.acquire(
                transactional_id,
                host.node_id,
                session.id,
                handing_over=host.view.draining,
                wait_s=host.etcd.timeout_s,
            )
        except LeaseLost as exc:  # the session ended before its keepalive told us
            raise NotCoordinator("this broker's etcd session expired") from exc
        if fence is None:
            holder = self._leases.holder(transactional_id)
            raise NotCoordinator(f"transactional id {transactional_id!r} is at broker {holder}")
        if self._closed or host.draining:  # began while taking it: given back, as at the drain
            await self._give_back(fence)
            raise NotCoordinator("this broker is draining or stopping")
        self._fences[transactional_id] = fence
        return fence

    async def _save(self, meta: TxnMetadata, fence: Fence) -> None:
        txn_id = meta.transactional_id
        try:
            saved = await self.store.save(meta, fence)
        except BaseException:
            self._saved.pop(txn_id, None)  # written or not: unknown
            raise
        if saved:
            self._saved[txn_id] = (fence, meta)
        else:
            self._drop(meta.transactional_id, "its lease is no longer ours")
            raise NotCoordinator(f"lost the lease of {meta.transactional_id!r}")

    async def _load(self, transactional_id: str) -> StoredTxn | None:
        return await self.store.load(transactional_id)

    # --- the APIs ---------------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> InitResult:
        if not state.valid_timeout(timeout_ms, self.settings.max_timeout_ms):
            return InitResult(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        for _ in range(2):
            result, waiting = await self._init_once(
                transactional_id, timeout_ms, producer_id, producer_epoch
            )
            if waiting is None:
                return result
            await self._wait(waiting)  # an abort of the old producer's transaction
        return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)

    async def _init_once(
        self, transactional_id: str, timeout_ms: int, producer_id: int, producer_epoch: int
    ) -> tuple[InitResult, asyncio.Task[None] | None]:
        async with self._lock(transactional_id):
            fence = await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            current = stored.metadata if stored is not None else None
            decision = state.decide_init(current, producer_id, producer_epoch)
            if decision.action is InitAction.REFUSE:
                return InitResult(decision.error), None
            if decision.action is InitAction.RETRY:
                assert current is not None
                return InitResult(decision.error), self._resume(current, fence)
            if decision.action is InitAction.ABORT_FIRST:
                assert current is not None
                aborting = state.fenced_abort(current, now_ms())
                await self._save(aborting, fence)
                task = self._start_completion(aborting, fence)
                return InitResult(ErrorCode.CONCURRENT_TRANSACTIONS), task
            fresh: int | None = None
            if decision.action is InitAction.NEW_PRODUCER_ID:
                fresh = await self._host.etcd.increment(
                    keys.producer_id_counter_key(self._host.cluster)
                )
            meta = state.initialised(current, transactional_id, timeout_ms, now_ms(), fresh)
            await self._save(meta, fence)
            log_change(
                transactional_id,
                "transactional id %s: producer id %d epoch %d",
                transactional_id,
                meta.producer_id,
                meta.producer_epoch,
            )
            return InitResult(ErrorCode.NONE, meta.producer_id, meta.producer_epoch), None

    async def add(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition] = (),
        groups: Iterable[str] = (),
    ) -> ErrorCode:
        """AddPartitionsToTxn and AddOffsetsToTxn."""
        async with self._lock(transactional_id):
            fence = await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            outcome = state.add_to_transaction(
                stored.metadata if stored is not None else None,
                producer_id,
                producer_epoch,
                now_ms(),
                frozenset(partitions),
                frozenset(groups),
            )
            if outcome.metadata is not None:
                await self._save(outcome.metadata, fence)
            elif outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS and stored is not None:
                self._resume(stored.metadata, fence)  # the client retries once it is complete
            else:
                await self._let_go_if_unknown(transactional_id, stored)
            return outcome.error

    async def end(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        bump: bool = False,
    ) -> EndResult:
        """EndTxn: decide, then wait (bounded) for the markers. ``bump``: EndTxn v5
        (transaction protocol v2), the epoch goes up with the decision."""
        async with self._lock(transactional_id):
            fence = await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            current = stored.metadata if stored is not None else None
            fresh = None
            if bump and state.needs_new_producer_id(current):
                fresh = await self._host.etcd.increment(
                    keys.producer_id_counter_key(self._host.cluster)
                )
            outcome = state.end_transaction(
                current, producer_id, producer_epoch, commit, now_ms(), bump, fresh
            )
            task = None
            if outcome.metadata is not None:
                await self._save(outcome.metadata, fence)
                task = self._start_completion(outcome.metadata, fence)
            elif outcome.error is ErrorCode.CONCURRENT_TRANSACTIONS and current is not None:
                task = self._resume(current, fence)
            else:
                await self._let_go_if_unknown(transactional_id, stored)
        answered = outcome.metadata or current
        error = outcome.error
        if task is not None:
            done = await self._wait(task)
            if error is ErrorCode.CONCURRENT_TRANSACTIONS and done:
                error = ErrorCode.NONE  # a retry of this very EndTxn, now complete
        if error is not ErrorCode.NONE or answered is None:
            return EndResult(error)
        return EndResult(error, *state.end_answer(answered))

    async def describe(self, transactional_id: str) -> TxnMetadata | None:
        """The transaction as etcd has it, if this broker coordinates it (NotCoordinator)."""
        async with self._lock(transactional_id):
            await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            await self._let_go_if_unknown(transactional_id, stored)
        return stored.metadata if stored is not None else None

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn ``verify_only``: whether each partition is in the producer's
        ongoing transaction (NotCoordinator, MetadataUnavailable as ``describe``)."""
        fence = await self._fence(transactional_id)
        saved_with, meta = self._saved.get(transactional_id, (None, None))
        if saved_with is not fence:  # written under a lease held before (or never): etcd's
            meta = await self.describe(transactional_id)
        return state.verification_codes(meta, producer_id, producer_epoch, partitions)

    async def list_coordinated(self) -> list[TxnMetadata]:
        """Transactions coordinated here, or that would be (no live holder, and this is the
        pick): every transactional id is listed by exactly one broker."""
        me = self._host.node_id
        listed = []
        for meta in await self.store.list_all():
            chosen = self.coordinator_for(meta.transactional_id)
            if chosen is not None and chosen.node_id == me:
                listed.append(meta)
        return sorted(listed, key=lambda m: m.transactional_id)

    async def current(self, transactional_id: str) -> StoredTxn | None:
        """For TxnOffsetCommit on a group coordinator: the transaction as etcd has it now."""
        return await self._load(transactional_id)

    # --- completing ---------------------------------------------------------------------------

    def _resume(self, meta: TxnMetadata, fence: Fence) -> asyncio.Task[None] | None:
        """The completion of a prepared transaction: the running one, or started now (found
        prepared by a coordinator that took the lease over before its periodic check)."""
        if not meta.state.preparing:
            return None
        return self._start_completion(meta, fence)

    def _start_completion(self, meta: TxnMetadata, fence: Fence) -> asyncio.Task[None]:
        txn_id = meta.transactional_id
        running = self._completions.get(txn_id)
        if running is not None and not running.done():
            return running
        task = asyncio.create_task(self._complete(meta, fence), name=f"txn-complete-{txn_id}")
        self._completions[txn_id] = task
        task.add_done_callback(lambda t: self._completion_done(txn_id, t))
        return task

    def _completion_done(self, transactional_id: str, task: asyncio.Task[None]) -> None:
        if self._completions.get(transactional_id) is task:
            del self._completions[transactional_id]
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "completing transaction %s failed", transactional_id, exc_info=task.exception()
            )
            self._wake.set()  # the periodic check picks it up again

    async def _wait(self, task: asyncio.Task[None]) -> bool:
        """Whether ``task`` finished (successfully) within END_TXN_WAIT_S."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(END_TXN_WAIT_S):
                await asyncio.shield(task)
        return task.done() and not task.cancelled() and task.exception() is None

    async def _complete(self, meta: TxnMetadata, fence: Fence) -> None:
        commit = meta.state is TxnState.PREPARE_COMMIT
        marker = Marker(meta.producer_id, meta.producer_epoch, commit, coordinator_epoch(fence))
        try:
            await self._markers.write(marker, meta.partitions)
            for group_id in sorted(meta.groups):
                await self._retrying(
                    functools.partial(self._finish_offsets, group_id, meta, commit, fence)
                )
            await self._retrying(functools.partial(self._write_complete, meta, fence))
        except NotCoordinator as exc:
            log.info("stopped completing %s: %s", meta.transactional_id, exc)
            return
        what = (
            "transaction %s (producer %d epoch %d) %s: %d partitions, %d groups",
            meta.transactional_id,
            meta.producer_id,
            meta.producer_epoch,
            "committed" if commit else "aborted",
            len(meta.partitions),
            len(meta.groups),
        )
        if commit:  # a producer's routine, up to hundreds a second: nothing for an operator
            log.debug(*what)
        else:
            log_change(meta.transactional_id, *what)

    async def _finish_offsets(
        self, group_id: str, meta: TxnMetadata, commit: bool, fence: Fence
    ) -> None:
        if not await self.store.finish_offsets(group_id, meta.producer_id, commit, fence):
            self._drop(meta.transactional_id, "fenced while writing offsets")
            raise NotCoordinator("lost the transaction lease")

    async def _write_complete(self, meta: TxnMetadata, fence: Fence) -> None:
        async with self._lock(meta.transactional_id):
            stored = await self._load(meta.transactional_id)
            if stored is None or stored.metadata != meta:
                return  # someone else finished it (or it moved on): nothing to write
            await self._save(state.completed(meta, now_ms()), fence)

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run an etcd step until etcd answers; NotCoordinator (and LeaseLost) ends the
        completion. etcd out of reach and etcd refusing (permission denied after a change of
        roles) are retried alike: a refused completion used to end with a traceback and be
        started again by the next check, a traceback a check. A run of failures is logged
        once, then summarised (``retry_log``)."""
        retries = RetryLog(log, "cannot complete a transaction in etcd")
        while True:
            try:
                await step()
            except LeaseLost:
                raise
            except MetadataError as exc:
                retries.failed(exc)
                await asyncio.sleep(_RETRY_S)
                continue
            retries.succeeded()
            return

    # --- timeouts and recovery ----------------------------------------------------------------

    async def _check_loop(self) -> None:
        """Checks every ``check_interval_ms``; a run of checks etcd cannot answer or refuses
        (permission denied) is logged once, then summarised (``retry_log``), not once a check
        with a traceback. Only an unexpected error (a bug) is logged with its traceback."""
        interval_s = self.settings.check_interval_ms / 1000
        retries = RetryLog(log, "cannot check transactions")
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.check_once()
            except MetadataError as exc:
                retries.failed(exc)
            except Exception:
                log.exception("checking transactions failed")
            else:
                retries.succeeded()

    async def check_once(self) -> None:
        """Abort timed-out transactions and finish prepared ones that this broker coordinates,
        or whose coordinator is gone and which it is the pick to take over."""
        if self._closed or not self._claiming or self._host.draining:
            return
        if not self._host.session.still_valid():  # lost, or suspended (``session_lease``)
            return
        me = self._host.node_id
        now = now_ms()
        expiration_ms = self.settings.id_expiration_ms
        for meta in await self.store.list_all():
            txn_id = meta.transactional_id
            expire = state.expired(meta, now, expiration_ms)
            if not expire and state.recovery_action(meta, now) is Recovery.NOTHING:
                continue
            if txn_id in self._completions:
                continue
            chosen = self.coordinator_for(txn_id)
            if chosen is None or chosen.node_id != me:
                continue
            with contextlib.suppress(NotCoordinator):
                await (self._expire(txn_id) if expire else self._recover(txn_id))

    async def _recover(self, transactional_id: str) -> None:
        async with self._lock(transactional_id):
            fence = await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            if stored is None:
                return
            meta = stored.metadata
            action = state.recovery_action(meta, now_ms())
            if action is Recovery.ABORT:
                log_change(transactional_id, "transaction %s timed out: aborting", transactional_id)
                meta = state.fenced_abort(meta, now_ms())
                await self._save(meta, fence)
            elif action is Recovery.NOTHING:
                return
            else:
                log.info("resuming transaction %s in %s", transactional_id, meta.state.value)
            self._start_completion(meta, fence)

    async def _expire(self, transactional_id: str) -> None:
        """Delete the record of a transactional id unused for ``id_expiration_ms`` (checked again
        under its lock and lease), then give its lease up: nobody reads it any more."""
        async with self._lock(transactional_id):
            fence = await self._fence(transactional_id)
            stored = await self._load(transactional_id)
            expiration_ms = self.settings.id_expiration_ms
            if stored is None or not state.expired(stored.metadata, now_ms(), expiration_ms):
                return
            self._saved.pop(transactional_id, None)
            if await self.store.delete(transactional_id, fence, stored.mod_revision):
                log.info("transactional id %s expired: its record is deleted", transactional_id)
            self._fences.pop(transactional_id, None)
            await self._leases.release(fence)

    # --- losing transactional ids -----------------------------------------------------------

    def _drop(self, transactional_id: str, reason: str) -> None:
        self._saved.pop(transactional_id, None)
        if self._fences.pop(transactional_id, None) is not None:
            log.info("no longer coordinating transactional id %s: %s", transactional_id, reason)
        task = self._completions.pop(transactional_id, None)
        if task is not None:
            task.cancel()

    def _on_lease_change(self, transactional_id: str, owner: int | None, revision: int) -> None:
        if owner is None:
            self._wake.set()  # maybe a coordinator died: see whether something is owed
        fence = self._fences.get(transactional_id)
        if fence is None or owner == self._host.node_id or revision < fence.create_revision:
            return
        self._drop(transactional_id, f"its lease is held by {owner}" if owner else "released")

    async def _follow_session(self) -> None:
        while True:
            session = self._host.session
            await session.lost.wait()
            for txn_id in list(self._fences):
                self._drop(txn_id, "this broker's etcd session was lost")
            while self._host.session is session:  # noqa: ASYNC110
                await asyncio.sleep(_SESSION_POLL_S)
