"""One broker process: wiring of the parts, start-up checks and the shutdown order.

Start-up fails closed: an object store or etcd that cannot be reached is a clear error and a
non-zero exit, never an in-memory fallback. Shutdown follows the handoff order: stop accepting
connections, report not-ready, stop writes, flush, release leases, deregister (revoke the
session), finish in-flight requests under a deadline, close clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from kafscale.broker.admin_http import AdminGuard, AdminRoutes, AdminServer
from kafscale.broker.api.dispatch import Dispatcher
from kafscale.broker.api.envelope import handle_envelope
from kafscale.broker.api.fetch_sessions import FetchSessionCache
from kafscale.broker.api.table import API_TABLE
from kafscale.broker.api.txn_partitions import write_markers_here
from kafscale.broker.buffer_pool import BufferPool
from kafscale.broker.config import BrokerSettings
from kafscale.broker.groups.coordinator import GroupCoordinator, group_config
from kafscale.broker.metadata import keys
from kafscale.broker.metadata import listed_brokers as listing
from kafscale.broker.metadata.cluster import BrokerInfo, ClusterView, TopicInfo, TopicPartition
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import BadEndpoint
from kafscale.broker.metadata.etcd_connect import connect_etcd, warn_of_durability_bugs
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable
from kafscale.broker.metadata.leaders import leader_for, live_leaders
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.metadata.registration_loss import registration_lost
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.metadata.session_renewal import renew_session
from kafscale.broker.metadata.topics import create_topic
from kafscale.broker.observability.broker_metrics import BrokerCollector
from kafscale.broker.observability.exposition import metrics_renderer
from kafscale.broker.observability.hot_path_collector import HotPathCollector
from kafscale.broker.observability.logs import set_node_id
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.ownership import follow_once, plan_ownership
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, NotLeader
from kafscale.broker.quotas.enforcement import QuotaEnforcer
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.endpoints import listener_endpoints
from kafscale.broker.security.inter_broker import (
    inter_broker_context,
    inter_broker_link,
    inter_broker_reloader,
    missing_login_warning,
)
from kafscale.broker.security.listeners import advertised_address, internal_listener
from kafscale.broker.security.tls import CertificateReloader, TlsConfigError
from kafscale.broker.security.token_store import TokenStore
from kafscale.broker.server import ByteBudget, Connection, KafkaServer, ServerEndpoint
from kafscale.broker.share.manager import ShareManager
from kafscale.broker.share.store import ShareStateStore
from kafscale.broker.startup_error import StartupError as StartupError  # its former home
from kafscale.broker.stop_budget import left_s, stop_deadlines
from kafscale.broker.storage.cache import SegmentCache
from kafscale.broker.storage.cleaner import Cleaner
from kafscale.broker.storage.factory import open_object_store
from kafscale.broker.storage.instrumented import InstrumentedStore
from kafscale.broker.storage.log_manager import LogManager
from kafscale.broker.storage.log_sizes import LogSizes, log_dir_name
from kafscale.broker.storage.object_store import ObjectStore, ObjectStoreError
from kafscale.broker.storage.partition_log import OwnedPartition
from kafscale.broker.storage.reader import LogReader
from kafscale.broker.storage.topic_purge import TopicPurger
from kafscale.broker.task_stop import cancel_and_wait, start_task
from kafscale.broker.transactions.coordinator import TransactionCoordinator
from kafscale.broker.upkeep import start_upkeep

log = logging.getLogger(__name__)

_RECONCILE_RETRY_S = 1.0


@dataclass
class Broker:
    settings: BrokerSettings
    etcd: Etcd
    store: ObjectStore
    session: SessionLease
    view: ClusterView
    cache: SegmentCache
    reader: LogReader
    fetch_sessions: FetchSessionCache
    produce_budget: ByteBudget
    info: BrokerInfo | None = None
    manager: LogManager | None = None
    server: KafkaServer | None = None
    admin: AdminServer | None = None
    groups: GroupCoordinator | None = None
    transactions: TransactionCoordinator | None = None
    log_sizes: LogSizes | None = None  # owned partitions' sizes, for DescribeLogDirs
    share: ShareManager | None = None  # share-partitions of owned partitions (KIP-932)
    cleaner: Cleaner | None = None  # the log cleaner (log.cleaner_enable)
    ready: bool = False
    draining: bool = False
    cluster_stopping: bool = False
    """The whole cluster stops with this broker (``stop_acquiring``): no hand-off to anyone."""
    pod_name: str | None = None
    cluster_size: int | None = None
    """How many brokers the cluster has, when its launcher knows it (``kafscale local``)."""
    _inter_broker: ssl.SSLContext | None = None  # TLS toward other brokers (inter_broker.*)
    _own_deleted_at: int = 0
    """The etcd revision of the last deletion of our registration the view reported (0: none
    since the last registration; not kept longer, as etcd's revisions can go back)."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    quota_enforcer: QuotaEnforcer = field(init=False)

    def __post_init__(self) -> None:
        # Client quotas come from the watched view: enforcing costs no etcd call.
        self.quota_enforcer = QuotaEnforcer(lambda: self.view.quotas.quotas)

    @property
    def node_id(self) -> int:
        assert self.info is not None
        return self.info.node_id

    @property
    def cluster(self) -> str:
        return self.settings.cluster

    @property
    def purger(self) -> TopicPurger:
        return TopicPurger(self.cluster, self.etcd, self.store, self.cache)

    @property
    def credentials(self) -> CredentialStore:
        """The users' SCRAM credentials (SASL logins, Alter/DescribeUserScramCredentials)."""
        return CredentialStore(self.etcd, self.cluster)

    @property
    def tokens(self) -> TokenStore:
        """The delegation tokens (their APIs and token logins)."""
        return TokenStore(self.etcd, self.cluster)

    @property
    def log_manager(self) -> LogManager:
        assert self.manager is not None
        return self.manager

    # --- start-up ----------------------------------------------------------------------------

    @classmethod
    async def start(
        cls,
        settings: BrokerSettings,
        pod_name: str | None = None,
        cluster_size: int | None = None,
        etcd_warning_level: int = logging.WARNING,
    ) -> Broker:
        """``etcd_warning_level``: how loudly to name a known etcd durability bug; ``kafscale
        local`` says it at INFO, since its user cannot pick the bundled etcd's version."""
        store: ObjectStore = InstrumentedStore(open_object_store(settings.storage))
        try:
            await store.check()
        except ObjectStoreError as exc:
            await store.close()
            raise StartupError(f"object storage is not usable: {exc}") from exc
        try:
            etcd = await connect_etcd(settings.etcd)
        except BadEndpoint as exc:
            await store.close()
            raise StartupError(f"etcd is not usable: {exc}") from exc
        except MetadataUnavailable as exc:
            await store.close()
            raise StartupError(f"etcd is not reachable: {exc}") from exc
        await warn_of_durability_bugs(etcd, etcd_warning_level)
        session = await SessionLease.start(etcd, settings.etcd.session_ttl_s)
        view = ClusterView(etcd, settings.cluster, settings.metadata.departed_broker_grace_s)
        await view.start()
        cache = SegmentCache(settings.log.cache_bytes)
        broker = cls(
            settings=settings,
            etcd=etcd,
            store=store,
            session=session,
            view=view,
            cache=cache,
            reader=LogReader(settings.cluster, store, cache),
            fetch_sessions=FetchSessionCache(settings.limits.fetch_sessions),
            produce_budget=ByteBudget(settings.limits.max_buffered_produce_bytes),
            pod_name=pod_name,
            cluster_size=cluster_size,
        )
        await broker._start_serving()
        return broker

    async def _start_serving(self) -> None:
        listener = self.settings.listener
        try:
            endpoints, contexts = server_endpoints(self.settings)
            inter_broker = inter_broker_context(self.settings)
        except TlsConfigError as exc:
            await self._close_clients()
            raise StartupError(str(exc)) from exc
        self.server = KafkaServer(
            Dispatcher(API_TABLE, self, handle_envelope),
            self.settings.limits,
            listener.host,
            listener.port,
            endpoints=endpoints,
            on_closed=self._connection_closed,
        )
        try:
            await self.server.start(accepting=False)
        except OSError as exc:
            await self._close_clients()
            names = ", ".join(f"{e.listener.host}:{e.listener.port}" for e in endpoints)
            raise StartupError(f"cannot listen on {names}: {exc}") from exc
        self._inter_broker = inter_broker
        problem = missing_login_warning(self.settings, self.cluster_size)
        if problem:
            log.warning("%s", problem)
        inter_reloader = inter_broker_reloader(self.settings, inter_broker)
        if inter_reloader is not None:
            self._tasks.append(start_task(inter_reloader.run(), name="inter-broker-tls"))
        if contexts:
            reloader = CertificateReloader(self.settings.tls, contexts)
            self._tasks.append(start_task(reloader.run(), name="tls-reload"))
        # The admin endpoint comes up before registering, so the registration can name its
        # port (``kafscale status`` finds every broker's /metrics through etcd); /readyz says
        # 503 until the broker serves, and while its cluster view does not follow etcd.
        self.admin = AdminServer(
            AdminRoutes(
                self.is_ready,
                self.drain,
                self.status,
                metrics_renderer(HotPathCollector(), BrokerCollector(self)),
            ),
            listener.host,
            listener.admin_port,
            AdminGuard(
                self.settings.admin.token_file, self.settings.admin.allow_remote_without_token
            ),
        )
        try:
            await self.admin.start()
        except OSError as exc:
            await self.server.close(0)
            await self._close_clients()
            raise StartupError(f"cannot listen on admin port {listener.admin_port}: {exc}") from exc
        self.info = await self._register()
        self.view.listen_broker_deletions(self._registration_deleted)
        set_node_id(self.info.node_id)
        self.groups = GroupCoordinator(self, group_config(self.settings.groups))
        await self.groups.start()
        self.transactions = TransactionCoordinator(
            self,
            self.settings.transactions,
            inter_broker_link(self.settings, self._inter_broker),
            functools.partial(write_markers_here, self),
        )
        await self.transactions.start()
        self.manager = LogManager(
            self.settings, self.etcd, self.view, self.store, self.cache, self.node_id, self.session
        )
        await self.manager.start()
        self.share = ShareManager(
            ShareStateStore(self.etcd, self.cluster, self.node_id), self._still_owns
        )
        self.view.share_members.listen(self.share.on_share_members)
        self._tasks.append(start_task(self.share.run(), name="share-partitions"))
        self.log_sizes = LogSizes(self.cluster, self.store)
        self._tasks.append(start_task(self._watch_session(), name="session-watch"))
        self._tasks.append(start_task(self._follow_cluster(), name="cluster-follow"))
        upkeep = start_upkeep(self)
        self.cleaner = upkeep.cleaner
        self._tasks += upkeep.tasks
        await self.server.accept()
        self.ready = True
        log.info("broker %d serving on %s:%d", self.node_id, self.info.host, self.info.port)

    async def _register(self) -> BrokerInfo:
        assert self.server is not None
        node_id = await self.etcd.increment(keys.broker_id_counter_key(self.cluster))
        admin_port = self.admin.port if self.admin is not None else None
        info = registration(self.settings, node_id, self.server.ports, self.pod_name, admin_port)
        await self._retire_predecessors(info)
        self.session.registered_at = await self.etcd.put(
            keys.broker_key(self.cluster, node_id), info.to_json(), lease=self.session.id
        )
        self.view.brokers[node_id] = info
        return info

    async def _retire_predecessors(self, info: BrokerInfo) -> None:
        """End the session of a registration that advertises our own address.

        That is a broker that died without deregistering (we listen on its address now; a
        restart keeps its port, a new pod may get a dead pod's IP). Until its session expired
        it would keep its partitions, and clients would keep reaching us under its node id:
        a produce we answered there may be retried once the client drops that node, and stored
        twice (non-idempotent producers). Revoking the session frees its partition and group
        leases at once, as its expiry would a TTL later.
        """
        for kv in await self.etcd.get_prefix(keys.brokers_prefix(self.cluster)):
            try:
                other = BrokerInfo.from_json(kv.value)
            except (ValueError, KeyError, TypeError):
                continue
            if (other.host, other.port) == (info.host, info.port) and kv.lease:
                log.warning(
                    "broker %d was registered at our address %s:%d and is gone; ending its session",
                    other.node_id,
                    info.host,
                    info.port,
                )
                await self.etcd.revoke_lease(kv.lease)

    # --- running -----------------------------------------------------------------------------

    async def _watch_session(self) -> None:
        """If our session expired (paused, partitioned), stop owning and come back fresh; never
        ends on an etcd error (``session_renewal``)."""
        while True:
            await self.session.lost.wait()
            log.error("etcd session lost; giving up every partition and re-registering")
            await renew_session(
                self.etcd,
                self.settings.etcd.session_ttl_s,
                self._adopt_session,
                self._register_on,
                counts=self.session.counts,
            )

    def _adopt_session(self, session: SessionLease) -> None:
        self.log_manager.abandon_all(NotLeader("this broker's etcd session expired"))
        self.session = session
        self.log_manager.replace_session(session)

    async def _register_on(self, session: SessionLease) -> None:
        assert self.info is not None
        session.registered_at = await self.etcd.put(
            keys.broker_key(self.cluster, self.node_id), self.info.to_json(), lease=session.id
        )
        self._check_registration()  # a deletion the watch brought before the put's answer
        self._own_deleted_at = 0

    def _registration_deleted(self, node_id: int, revision: int) -> None:
        """The view saw broker ``node_id``'s registration deleted at ``revision``: if it is
        ours, made on the current session, etcd ended that session (``registration_loss``)."""
        if node_id == self.node_id:
            self._own_deleted_at = revision
            self._check_registration()

    def _check_registration(self) -> None:
        """End the current session if etcd deleted its registration: at once, not at the next
        keepalive (up to TTL/3 later), by the keepalive's own path (``SessionLease.mark_lost``,
        then ``_watch_session``)."""
        session = self.session
        if registration_lost(self._own_deleted_at, session.registered_at, session.released):
            session.mark_lost(
                f"etcd deleted this broker's registration at revision {self._own_deleted_at}"
                " (its lease was revoked or expired)"
            )

    async def _follow_cluster(self) -> None:
        """React to cluster changes: deleted topics, draining marks, the desired assignment.
        A reconcile that etcd failed (an outage, or the session lost under it: LeaseLost) is
        tried again within ``_RECONCILE_RETRY_S`` (on the new session), not at the next
        change, which may never come; before, LeaseLost ended this task for good. A run of
        failures is logged once, then summarised (``retry_log``), not once a second."""
        retries = RetryLog(log, "ownership reconcile")
        while True:
            changed = self.view.changed
            try:
                await self._reconcile()
            except KafkaError as exc:
                log.warning("ownership reconcile: %s", exc)
            except MetadataError as exc:
                retries.failed(exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), _RECONCILE_RETRY_S)
                continue
            else:
                retries.succeeded()
            await changed.wait()

    async def _reconcile(self) -> None:
        for topic in {o.topic for o in self.log_manager.owned.values()}:
            if topic not in self.view.topics:
                self.log_manager.abandon_topic(topic)
                self.reader.forget(topic)
        if self.node_id in self.view.draining and not self.draining:
            await self.drain()
        elif self.draining and self.node_id not in self.view.draining and self.ready:
            log.info("draining mark removed; taking partitions again")
            self.draining = False
            self.log_manager.acquiring = True
        plan = plan_ownership(
            self.node_id,
            list(self.log_manager.owned),
            self.view.assignment.owners,
            self.view.owners,
            self.view.brokers.keys(),
            self.draining,
        )
        await follow_once(self.log_manager, plan)

    def _still_owns(self, topic: str, partition: int, lease_revision: int) -> bool:
        owned = self._owned_now((topic, partition))
        return owned is not None and owned.lease_revision == lease_revision

    def _owned_now(self, tp: TopicPartition) -> OwnedPartition | None:
        """The partition if this broker owns it and may act as its owner now: not while its
        session is suspended (``session_lease``), when what it holds is vouched for by memory
        alone; a Fetch for it is refused then (``suspended_owner``), its other reads (offsets
        by time, the epoch Metadata gives) go by etcd, as another broker's do."""
        owned = self.log_manager.owned.get(tp)
        return owned if owned is not None and self.session.still_valid() else None

    def suspended_owner(self, tp: TopicPartition) -> bool:
        """Whether this broker owns ``tp`` but may not act as its owner now (its session
        suspended): Metadata still names it leader, as etcd does (``leaders.live_leaders``), and
        a Fetch for it is answered NOT_LEADER_OR_FOLLOWER until the session resumes. Read as a
        non-owner's, it would go by etcd at the log's end, which does not answer: the client
        would wait out the etcd timeout for a retriable error (KAFKA_STORAGE_ERROR,
        ``fetch_partition_code``); every client refreshes its metadata on
        NOT_LEADER_OR_FOLLOWER at once and comes back here."""
        return tp in self.log_manager.owned and not self.session.still_valid()

    async def _connection_closed(self, connection: Connection) -> None:
        """A client went away: its share sessions end and their records are released."""
        if self.share is not None:
            self.share.release_connection(connection)

    def leader_for(self, tp: TopicPartition) -> int:
        """The leader clients are given; never this broker once etcd may no longer hold its
        session lease (a suspended one that may still be held: as the other brokers see it)."""
        me = None if self.info is None else self.info.node_id
        live = live_leaders(self.view.brokers.keys(), me, self.session.may_be_held())
        return leader_for(
            tp, self.view.owners, self.view.assignment.owners, live, self.view.draining
        )

    def listed_brokers(self) -> list[BrokerInfo]:
        """The brokers Metadata and DescribeCluster list: the registered ones, while it serves
        this one, whose registration a lapsed session took, and those that departed within
        the grace period (``listed_brokers``)."""
        return listing.with_departed(
            self._live_brokers(),
            self.view.departed,
            time.monotonic(),
            self.settings.metadata.departed_broker_grace_s,
        )

    def controller_id(self) -> int:
        """The controller Metadata and DescribeCluster name: among the live brokers only."""
        return listing.controller_id(self._live_brokers())

    def _live_brokers(self) -> list[BrokerInfo]:
        return listing.listed_brokers(self.view.brokers, self.info, self.ready)

    def committed_state(self, tp: TopicPartition) -> PartitionState:
        owned = self._owned_now(tp)
        if owned is not None:
            return owned.state
        return self.view.states.get(tp, PartitionState())

    async def fresh_state(self, tp: TopicPartition) -> PartitionState:
        """The committed state read from etcd now (non-owners: never answer from a stale view)."""
        owned = self._owned_now(tp)
        if owned is not None:
            return owned.state
        kv = await self.etcd.get(keys.partition_state_key(self.cluster, *tp))
        state = PartitionState.from_json(kv.value) if kv else PartitionState()
        self.view.update_state(tp, state)
        return state

    async def auto_create(self, topic: str) -> TopicInfo | None:
        """Create ``topic`` with the defaults if auto-creation is on (as Kafka does)."""
        defaults = self.settings.topics
        if not defaults.auto_create_topics:
            return None
        try:
            info = await create_topic(self.etcd, self.cluster, topic, defaults.num_partitions, {})
        except KafkaError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            kv = await self.etcd.get(keys.topic_key(self.cluster, topic))
            return TopicInfo.from_json(topic, kv.value) if kv else None
        self.view.topics[topic] = info
        return info

    def spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        """Background work the broker owns (cancelled and awaited on shutdown)."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(start_task(coroutine, name))

    def is_ready(self) -> bool:
        """``/readyz``: serving, and its cluster view follows etcd. A view that cannot follow
        (etcd refuses its watches: a role's permission revoked) answers Metadata and routes
        from what it last saw; Kubernetes should send clients to brokers that know better."""
        view = getattr(self, "view", None)
        return self.ready and view is not None and view.following

    def status(self) -> dict[str, object]:
        if self.info is None or self.manager is None:
            return {"ready": False, "starting": True}
        return {
            "node_id": self.node_id,
            "ready": self.ready,
            "cluster_view_following": self.view.following,
            "cluster_view_stopped": self.view.health.stopped_parts(),
            "draining": self.draining,
            "owned": sorted(f"{t}-{p}" for t, p in self.log_manager.owned),
            "segment_cache": {
                "bytes": self.cache.size_bytes,
                "flushing_bytes": self.cache.reserved_bytes,
                **pool_status(self.cache.buffers),
            },
            "request_frames": frame_pool_status(self.server),
            "request_memory": request_memory_status(self.server),
            "buffered_produce_bytes": self.produce_budget.used,
            "fetch_sessions": len(self.fetch_sessions),
            "client_state": self._client_state(),
        }

    def _client_state(self) -> dict[str, int]:
        """Counts of what clients' names make this broker hold (docs/hardening.md)."""
        held = {"long_poll_events": len(self.view.watermarks)}
        if self.groups is not None:
            held.update(self.groups.held())
        if self.transactions is not None:
            held.update(self.transactions.held())
        return held

    # --- handoff and shutdown ----------------------------------------------------------------

    async def drain(self) -> None:
        """Hand every partition, group and transactional id over without exiting (preStop
        hook, draining mark), as Kafka's controlled shutdown moves a broker's leaders and
        coordinators before it stops.

        The draining mark goes first so that the assignment moves our partitions elsewhere
        while we flush, and every broker's FindCoordinator pick leaves us out; the coordinators
        then let their leases go (``hand_over_coordinators``), and each partition release
        deletes a lease the new owner is waiting for. In a whole-cluster stop
        (``stop_acquiring``) there is no new owner: no mark.
        """
        await self._mark_draining()
        await self.hand_over_coordinators()
        await self.log_manager.release_all()

    async def hand_over_coordinators(self) -> None:
        """Give up every transactional id and group coordinated here (the broker drains or
        stops; ``draining`` is set): their next coordinators load them from etcd, and requests
        here get NOT_COORDINATOR. The one hand-off of ``drain`` and ``shutdown``."""
        if self.transactions is not None:
            await self.transactions.hand_over()
        if self.groups is not None:
            await self.groups.hand_over()

    async def _mark_draining(self) -> None:
        """Take on nothing more, and tell the others (the ``draining/<id>`` mark) so that
        neither the assignment nor their FindCoordinator picks name this broker."""
        self.draining = True
        if self.manager is not None:
            self.manager.acquiring = False
        if self.node_id not in self.view.draining and not self.cluster_stopping:
            await self.etcd.put(
                keys.draining_key(self.cluster, self.node_id),
                b'{"reason":"drain"}',
                lease=self.session.id,
            )
            self.view.draining.add(self.node_id)

    def stop_acquiring(self) -> None:
        """The whole cluster stops (``kafscale local``): every broker stops at once, so none
        takes anything from now on and none hands anything over.

        No partition, not even one a stopping sibling releases (it would only bump its epoch
        here to be handed back at once); no group or transactional id a sibling let go (a
        client still connected here would otherwise have its group claimed, loaded and given
        back within the same second); no assignment written (``Rebalancer``). And no draining
        mark at the hand-off (``drain``): it tells the others to take over, and nobody is left
        to; each was an etcd write, and a new assignment written for it another."""
        self.ready = False  # also keeps a removed draining mark from undraining us
        self.cluster_stopping = True
        if self.manager is not None:
            self.manager.acquiring = False
        if self.groups is not None:
            self.groups.stop_claiming()
        if self.transactions is not None:
            self.transactions.stop_claiming()

    async def shutdown(self, began_at: float | None = None) -> None:
        """The graceful stop, in the handoff order, within one grace period from ``began_at``
        (the event loop's time of the stop signal; now if None): the hand-off until
        ``HANDOFF_SHARE`` of ``limits.shutdown_grace_s`` at most, the requests in flight until
        the grace is over (``stop_budget``). Each step used to get the whole grace in turn, so
        a stop still making progress outlived the stop bound and was cut (exit 124)."""
        self.ready = False  # also keeps a removed draining mark from undraining us
        loop = asyncio.get_running_loop()
        start_s = loop.time() if began_at is None else began_at
        deadlines = stop_deadlines(start_s, self.settings.limits.shutdown_grace_s)
        if self.server is not None:
            await self.server.stop_accepting()
        if self.info is not None:
            # The mark first: the other brokers' FindCoordinator pick leaves this broker out
            # before its coordinators let their leases go, so a released group is named at
            # its next coordinator everywhere, never back here (``_mark_draining``).
            try:
                async with asyncio.timeout_at(deadlines.handoff_until):
                    await self._mark_draining()
            except Exception as exc:  # etcd away: the hand-off below meets the same
                log.warning("draining mark not written at the stop (%r); going on", exc)
        if self.transactions is not None:
            await self.transactions.close()
        if self.groups is not None:
            await self.groups.close()  # releases each group lease as its group stops
        if self.manager is not None:
            try:
                async with asyncio.timeout_at(deadlines.handoff_until):
                    await self.drain()
                    await self.manager.close()
            except Exception:
                log.exception("handoff at shutdown did not complete; leases expire with the TTL")
        # Each cancelled until it ends: a task that lost one cancellation inside a library
        # (etcd answering again in that very step) kept a single cancel-and-gather waiting.
        await asyncio.gather(*(cancel_and_wait(task) for task in self._tasks))
        with contextlib.suppress(Exception):  # past the grace: ``_close_clients`` tries again
            async with asyncio.timeout_at(deadlines.graceful_until):
                await self.session.revoke()
        if self.server is not None:
            await self.server.close(left_s(deadlines.graceful_until, loop.time()))
        if self.admin is not None:
            await self.admin.close()
        await self._close_clients()
        log.info("broker stopped")

    async def _close_clients(self) -> None:
        await self.reader.close()
        await self.view.close()
        with contextlib.suppress(Exception):
            await self.session.revoke()
        await self.session.close()
        await self.etcd.close()
        await self.store.close()


def registration(
    settings: BrokerSettings,
    node_id: int,
    ports: dict[str, int],
    pod: str | None,
    admin_port: int | None = None,
) -> BrokerInfo:
    """What a broker registers: every listener's advertised address, the internal one as the
    main ``host``/``port`` (the proxy's way in, and all that older readers know)."""
    plan = settings.listener_plan()
    addresses = {
        listener.name: advertised_address(listener, ports[listener.name], socket.getfqdn)
        for listener in plan
    }
    host, port = addresses[internal_listener(plan, settings.internal_listener_name).name]
    return BrokerInfo(
        node_id=node_id,
        host=host,
        port=port,
        rack=settings.listener.rack,
        pod=pod,
        listeners=tuple((name, h, p) for name, (h, p) in addresses.items()),
        admin_port=admin_port,
        log_dir=log_dir_name(settings.storage),
    )


def server_endpoints(
    settings: BrokerSettings,
) -> tuple[list[ServerEndpoint], list[ssl.SSLContext]]:
    """The listeners to open, with a TLS context for each SSL/SASL_SSL one (one context per
    client-auth mode), and the contexts the certificate reloader keeps current."""
    return listener_endpoints(
        settings.listener_plan(), settings.tls, settings.sasl.enabled_mechanisms
    )


def pool_status(pool: BufferPool) -> dict[str, int]:
    """What a buffer pool holds, and how often it handed out a reused or a fresh buffer."""
    return {
        "pooled_bytes": pool.size_bytes,
        "buffers_reused": pool.reused,
        "buffers_allocated": pool.allocated,
    }


def request_memory_status(server: KafkaServer | None) -> dict[str, int]:
    """Bytes of large request frames held now and at most, and connections waiting for some."""
    if server is None:
        return {}
    memory = server.request_memory
    return {
        "used_bytes": memory.used_bytes,
        "peak_bytes": memory.peak_bytes,
        "limit_bytes": memory.limit_bytes,
        "waiting_connections": memory.waiting,
    }


def frame_pool_status(server: KafkaServer | None) -> dict[str, int]:
    """How often large request frames were received into a reused buffer (``buffer_pool``)."""
    return pool_status(server.frame_buffers if server is not None else BufferPool())
