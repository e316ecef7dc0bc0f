"""Each broker's live view of the cluster, kept current by watches on the keys it keeps.

Topics, registered brokers, partition states (high watermarks), lease owners, the desired
assignment, draining marks, group configs, ACLs, quotas and share-group membership all live
under ``/kafscale/<cluster>/``. The view reads them once, every range at one revision, then
watches each range from the next revision, so answering Metadata or waking a long-poll never
costs an etcd round trip. High-watermark changes wake fetches through per-partition events.

Only the ranges of ``view_ranges`` are read and watched: the rest of the prefix (committed
offsets above all) is written per request for one broker's own use, and following it cost every
other broker CPU per write. Events of one range come in revision order; those of different
ranges may interleave otherwise, which nothing here relies on (each kind is applied on its own,
as the start-up read applies them in key order).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kafscale.broker.authz.store import AclCache
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment
from kafscale.broker.metadata.etcd import (
    Backoff,
    Etcd,
    WatchEvent,
    WatchEventKind,
    read_ranges_until_answered,
)
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.etcd_txn import KeyValue
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.metadata.share_members import ShareMembers
from kafscale.broker.metadata.topic_info import TopicInfo as TopicInfo  # its former home
from kafscale.broker.metadata.view_health import FollowHealth
from kafscale.broker.metadata.view_ranges import view_ranges
from kafscale.broker.quotas.store import QuotaCache
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)

CLUSTER_ID_PREFIX = "kafscale-"
"""Metadata and DescribeCluster name a cluster ``kafscale-<cluster>`` (brokers and the proxy)."""

TopicPartition = tuple[str, int]

_RETRY_MIN_S = 0.2
_RETRY_MAX_S = 5.0
"""Backoff between attempts of a watch or reload that etcd refused (permission denied, ...)."""

BrokerDeletionListener = Callable[[int, int], None]
"""Told that broker ``node_id``'s registration was deleted at etcd revision ``revision``."""

_QUEUED_EVENTS = 10_000
"""Watch events waiting to be applied, at most: the watches wait beyond that (and etcd holds
their events) rather than the view growing without bound behind a slow event loop."""


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A broker's registration. ``host``/``port`` are its internal listener's advertised
    address (what the proxy and older readers use); ``listeners`` has every listener's, as
    (name, host, port), so Metadata can answer with the listener a client came in on."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    pod: str | None = None
    listeners: tuple[tuple[str, str, int], ...] = ()
    admin_port: int | None = None  # its /metrics (``kafscale status`` reads it)
    log_dir: str | None = None  # the one log dir it reports (the proxy answers as it would)

    def endpoint(self, listener: str) -> tuple[str, int]:
        """The address to give a client of ``listener`` (the main one for a registration
        written before listeners existed, or without that listener)."""
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return self.host, self.port

    def to_json(self) -> bytes:
        document: dict[str, object] = {
            "node_id": self.node_id,
            "host": self.host,
            "port": self.port,
            "rack": self.rack,
            "pod": self.pod,
        }
        if self.admin_port is not None:
            document["admin_port"] = self.admin_port
        if self.log_dir is not None:
            document["log_dir"] = self.log_dir
        if self.listeners:
            document["listeners"] = {
                name: {"host": host, "port": port} for name, host, port in self.listeners
            }
        return json.dumps(document).encode()

    @classmethod
    def from_json(cls, data: bytes) -> BrokerInfo:
        d = json.loads(data)
        admin_port = d.get("admin_port")
        listeners = tuple(
            (str(name), str(entry["host"]), int(entry["port"]))
            for name, entry in (d.get("listeners") or {}).items()
        )
        return cls(
            int(d["node_id"]),
            str(d["host"]),
            int(d["port"]),
            d.get("rack"),
            d.get("pod"),
            listeners,
            None if admin_port is None else int(admin_port),
            None if d.get("log_dir") is None else str(d["log_dir"]),
        )


@dataclass(frozen=True, slots=True)
class Departure:
    """A registration that etcd deleted, and when (monotonic seconds) the view saw it go:
    Metadata lists it for a grace period (``listed_brokers.with_departed``)."""

    info: BrokerInfo
    at: float


class Watermarks:
    """Per-partition events that fire when a partition's committed state changes.

    An event lives only while a long-poll holds it (weak values): a Fetch names partitions
    (bogus ones too, an index past the topic's end) that may never change, and an event kept
    until its partition's next commit grew the broker by one per name asked, without bound.
    """

    def __init__(self) -> None:
        self._events: weakref.WeakValueDictionary[TopicPartition, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )

    def __len__(self) -> int:
        return len(self._events)

    def event(self, tp: TopicPartition) -> asyncio.Event:
        event = self._events.get(tp)
        if event is None:
            event = self._events[tp] = asyncio.Event()
        return event

    def notify(self, tp: TopicPartition) -> None:
        event = self._events.pop(tp, None)
        if event is not None:
            event.set()


class ClusterView:
    def __init__(self, etcd: Etcd, cluster: str, departed_grace_s: float = 0.0) -> None:
        self._etcd = etcd
        self._cluster = cluster
        self._prefix = keys.cluster_prefix(cluster)
        self._ranges = view_ranges(cluster)
        self.topics: dict[str, TopicInfo] = {}
        self.brokers: dict[int, BrokerInfo] = {}
        self.states: dict[TopicPartition, PartitionState] = {}
        self.owners: dict[TopicPartition, int] = {}
        self.assignment = Assignment(generation=0, owners={})
        self.draining: set[int] = set()
        self.departed: dict[int, Departure] = {}
        """Registrations deleted in the last ``departed_grace_s`` (none kept with 0): only
        Metadata's list of brokers reads them, never a leader or coordinator choice."""
        self._departed_grace_s = departed_grace_s
        # Every log dir name a broker registered with, kept after it leaves: with no broker
        # alive the proxy still answers AlterReplicaLogDirs as one would (LOG_DIR_NOT_FOUND).
        self.log_dirs: dict[int, str] = {}
        self.acls = AclCache()  # ACL bindings: authorization reads them on every request
        self.quotas = QuotaCache(cluster)  # client quotas: produce and fetch resolve them
        self.group_configs: dict[str, dict[str, str]] = {}
        """Groups' own configs (KIP-848): their coordinators read them at each heartbeat."""
        self.share_members = ShareMembers()
        """Every share group's member ids: share-partition leaders check ShareFetch against
        them and release a departed member's records (``share_members``)."""
        self.watermarks = Watermarks()
        self.changed = asyncio.Event()  # any change: brokers follow assignment/draining on it
        self._watch_task: asyncio.Task[None] | None = None  # applies the watches' events
        self._range_tasks: list[asyncio.Task[None]] = []  # one watch per range of the view
        # The etcd revision of this broker's latest commit of each partition's state, until the
        # watch brings that commit back (see ``update_state``).
        self._own_commits: dict[TopicPartition, int] = {}
        # The state document this broker is committing for a partition, and its decoded form:
        # the watch may bring the commit back before the transaction's answer (see
        # ``expect_commit``).
        self._committing: dict[TopicPartition, tuple[bytes, PartitionState]] = {}
        self.events_seen = 0
        """Watch events received (tests count them: keys the view does not keep send none)."""
        self._loaded_revision = 0  # the revision of the latest full read (start or reload)
        self._broker_deletion_listeners: list[BrokerDeletionListener] = []
        self._draining_revision = 0
        """``draining`` holds every mark written up to this revision (``know_draining_at``)."""
        self.health = FollowHealth("cluster view")
        """Which parts of the view cannot follow etcd now (``following``)."""

    @property
    def following(self) -> bool:
        """Whether the view follows etcd: every range's watch is created and no reload is
        pending. Not following, it answers from what it last saw (stale owners, brokers,
        ACLs), so the broker and the proxy report not-ready (``/readyz``) meanwhile."""
        tasks = (self._watch_task, *self._range_tasks)
        alive = all(t is not None and not t.done() for t in tasks)
        return alive and self.health.following

    @property
    def topics_by_id(self) -> dict[str, TopicInfo]:
        return {t.topic_id: t for t in self.topics.values()}

    async def start(self) -> None:
        entries, revision = await self._etcd.get_ranges_with_revision(self._ranges)
        for entry in entries:
            self._load(entry.key, entry.value)
        self._loaded_revision = self._draining_revision = revision
        events: asyncio.Queue[WatchEvent] = asyncio.Queue(_QUEUED_EVENTS)
        self._range_tasks = [
            start_task(self._watch(first, end, revision + 1, events), f"cluster-watch {first}")
            for first, end in self._ranges
        ]
        self._watch_task = start_task(self._follow(events), "cluster-watch")

    async def close(self) -> None:
        """Stop following: each task is cancelled until it has ended (``cancel_and_wait``).

        The range watches are tasks of the view, not of a ``TaskGroup`` in ``_follow``: a task
        group cancels its tasks once, and a watch task can lose that one cancellation while
        aetcd creates its watch just as etcd answers again after a restart (it then iterated
        the created watch; likely through Python 3.11's ``asyncio.wait_for``, which aetcd's
        creation awaits and which returns the result instead of raising when the result and
        the cancellation come in one loop step). The group, the view's close and the broker's
        stop then waited for it forever."""
        await asyncio.gather(*(cancel_and_wait(t) for t in (self._watch_task, *self._range_tasks)))

    def listen_broker_deletions(self, listener: BrokerDeletionListener) -> None:
        """Call ``listener(node_id, revision)`` when a registration is deleted: by a watch
        event, or found gone by a reload (at the reload's revision). A broker learns from it
        that etcd ended its own session (``registration_loss``)."""
        self._broker_deletion_listeners.append(listener)

    def _tell_broker_deleted(self, node_id: int, revision: int) -> None:
        for listener in self._broker_deletion_listeners:
            listener(node_id, revision)

    def live_broker_ids(self) -> list[int]:
        return sorted(self.brokers)

    def partitions(self) -> Iterable[TopicPartition]:
        for topic in self.topics.values():
            for p in range(topic.partitions):
                yield topic.name, p

    def update_state(
        self, tp: TopicPartition, state: PartitionState, revision: int | None = None
    ) -> None:
        """A local commit: apply it now rather than waiting for our own watch event.

        ``revision``: the etcd revision the commit got. The watch brings every commit back, and
        decoding the state document of one's own commits again cost a broker ~5 % of its CPU
        under small requests (one commit per round, a round per few requests); the event with
        that revision is then skipped, since it holds exactly ``state``, and so is every older
        event of the partition still to come (skipping only the latest own revision decoded
        every commit a newer one had overtaken: most of them at a round per few ms)."""
        if revision is not None:
            self._own_commits[tp] = revision
        previous = self.states.get(tp)
        if (
            previous is None
            or state.high_watermark >= previous.high_watermark
            or (state.leader_epoch > previous.leader_epoch)
        ):
            self.states[tp] = state
        self.watermarks.notify(tp)

    def expect_commit(self, tp: TopicPartition, document: bytes, state: PartitionState) -> None:
        """A commit of ``document`` (``state`` encoded) is about to be sent. The watch and the
        transaction's answer race, and the watch often wins: the event is then recognised by
        its bytes and ``state`` applied as it is, instead of decoding the document again
        (``PartitionState.from_json``, 3-4 % of the broker's CPU under the Java client's
        defaults, py-spy --gil). Whoever wrote those exact bytes, they decode to ``state``."""
        self._committing[tp] = (document, state)

    async def _follow(self, events: asyncio.Queue[WatchEvent]) -> None:
        """Apply the events of every range's watch, one at a time, as they come."""
        while True:
            event = await events.get()
            self.events_seen += 1
            if event.kind is WatchEventKind.RESYNC:
                if not event.rewound and event.mod_revision <= self._loaded_revision:
                    continue  # an earlier reload read past where this watch goes on
                if not await self._reload_until_done(rewound=event.rewound):
                    return  # the client was closed: the watches end too
                continue
            if event.mod_revision <= self._loaded_revision:
                continue  # already in the reload (see ``Etcd.watch_range``)
            try:
                self._apply(event)
            except Exception:
                log.exception("cannot apply watch event for %s", event.key)

    async def _watch(
        self, start: str, end: str, start_revision: int, events: asyncio.Queue[WatchEvent]
    ) -> None:
        """One range's events into ``events`` until the client closes.

        ``watch_range`` retries an outage itself and tells of it (``on_state``); a refusal
        (permission denied, a role or user changed under an etcd with auth) ends it, and it
        is started again here from the revision after the last event, with backoff, for as
        long as it takes: the view reports not following meanwhile (``health``), and follows
        again without a restart once etcd lets it."""
        part = f"range {start}"

        def on_state(error: BaseException | None) -> None:
            if error is None:
                self.health.recovered(part)
            else:
                self.health.failed(part, error)

        next_revision = start_revision
        backoff = Backoff(_RETRY_MIN_S, _RETRY_MAX_S)
        while True:  # ``watch_range`` itself ends at once if the client is closed
            try:
                watch = self._etcd.watch_range(start, end, next_revision, on_state)
                async with contextlib.aclosing(watch) as stream:
                    async for event in stream:
                        backoff.reset()
                        next_revision = event.mod_revision + 1
                        await events.put(event)
                return  # the client was closed
            except MetadataError as error:
                if self._etcd.closed:
                    return
                self.health.failed(part, error)
            await self._etcd.pause(backoff.next_delay())

    async def _reload_until_done(self, rewound: bool = False) -> bool:
        """``_reload``, retried with backoff while etcd refuses it (an outage is retried
        inside); False once the client is closed. Not following meanwhile (``health``)."""
        backoff = Backoff(_RETRY_MIN_S, _RETRY_MAX_S)
        self.health.pending("reload")
        while not self._etcd.closed:
            try:
                await self._reload(rewound)
            except MetadataError as error:
                if self._etcd.closed:
                    return False
                self.health.failed("reload", error)
                await self._etcd.pause(backoff.next_delay())
                continue
            self.health.recovered("reload")
            return True
        return False

    async def _reload(self, rewound: bool = False) -> None:
        """The watch lost history (compaction): rebuild the view from a fresh read.

        Retried until etcd answers: the watch goes on after the compacted stretch, so a reload
        given up would lose every change in it for good (a lease that moved then stays where
        it was in this view: a proxy would route to the old owner until that key changed
        again).

        ``rewound``: etcd's history went back (a restore from a backup, writes etcd lost;
        ``watch_history``). Its revisions are then lower than the ones this view remembers and
        its partition states may be older than those held here: the view takes etcd's read as
        it is (high watermarks go back too) and forgets its own commits' revisions."""
        log.warning(
            "cluster watch lost history%s; reloading the view",
            " (etcd's history went back)" if rewound else "",
        )
        entries, revision = await read_ranges_until_answered(
            self._etcd, self._ranges, "cluster view"
        )
        self._loaded_revision = self._draining_revision = revision
        if rewound:
            self._forget_states()
        registered = set(self.brokers)
        self.topics.clear()
        self._forget_brokers()
        self.owners.clear()
        self.draining.clear()
        self.acls.clear()
        self.quotas.clear()
        self.group_configs.clear()
        self.share_members.begin_reload()
        for entry in entries:
            self._load(entry.key, entry.value)
        self.share_members.end_reload()
        for node_id in sorted(registered - set(self.brokers)):  # deleted in the lost stretch
            self._tell_broker_deleted(node_id, revision)
        for tp in list(self.states):
            self.watermarks.notify(tp)
        self._wake_followers()

    def _forget_states(self) -> None:
        """Drop every partition state and remembered commit (waking their long-polls), so a
        reload after a rewind keeps etcd's states, not the newer-looking ones held here."""
        for tp in list(self.states):
            self.watermarks.notify(tp)
        self.states.clear()
        self._own_commits.clear()
        self._committing.clear()

    def _apply(self, event: WatchEvent) -> None:
        parts = self._relative(event.key)
        if event.kind is WatchEventKind.PUT:
            if not self._own_commit(event):
                self._apply_put(event.key, event.value)
        else:
            self._apply_delete(event.key)
            if parts[0] == "brokers" and len(parts) == 2:
                self._tell_broker_deleted(int(parts[1]), event.mod_revision)
        kind = parts[0]
        if kind == "draining":  # its range's events come in order: every mark up to here
            self._draining_revision = max(self._draining_revision, event.mod_revision)
        if kind in ("partitions", "share-groups"):
            return  # data-path churn: followers of ownership need not wake for it
        self._wake_followers()

    def _wake_followers(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def know_draining_at(self, broker: int, revision: int) -> None:
        """Make ``draining`` hold every mark written up to ``revision``, unless it holds
        ``broker``'s already: one read of the marks when the watch has not brought them that
        far. Raises ``MetadataError`` when etcd cannot answer.

        Why: a group's lease lives in another watch than the marks (``GroupLeases``), and two
        watches keep no order between them. A drained broker writes its mark before it
        releases its groups, but another broker could see the release first, take the drained
        broker for a live, non-draining one and name it as the group's next coordinator
        (the client then bounced off it; ``GroupLeases`` asks this before it applies a
        release). The read only adds marks: a mark's removal (undrain) is the watch's to apply,
        in its order, so the draining set never loses a mark for a moment that it still has
        (a drained broker that missed its own mark would take partitions again)."""
        if broker in self.draining or revision <= self._draining_revision:
            return
        marks, read_at = await self._etcd.get_prefix_with_revision(
            keys.draining_prefix(self._cluster)
        )
        marked = {node for node in map(draining_mark_of, marks) if node is not None}
        self._draining_revision = max(self._draining_revision, read_at)
        if not marked <= self.draining:
            self.draining.update(marked)
            self._wake_followers()

    def _own_commit(self, event: WatchEvent) -> bool:
        """Whether ``event`` is a partition-state commit this broker applied already."""
        parts = self._relative(event.key)
        if parts[0] != "partitions" or len(parts) != 3:
            return False
        tp = (parts[1], int(parts[2]))
        own = self._own_commits.get(tp)
        if own is None or event.mod_revision > own:
            return False
        if event.mod_revision == own:
            del self._own_commits[tp]
        # Older than our latest commit: a commit of ours that the next one overtook (rounds
        # pipeline, and the watch lags the transaction's answer), or one before it; our commit
        # compared the key's mod revision, so the state we hold is newer than either.
        return True

    def _relative(self, key: str) -> list[str]:
        return key[len(self._prefix) :].split("/")

    def apply_put(self, key: str, value: bytes) -> None:
        """Apply one stored key without a watch (a one-off snapshot: ``kafscale status``)."""
        self._apply_put(key, value)

    def _load(self, key: str, value: bytes) -> None:
        """Apply one key of a full read. A value that does not decode (etcd written by hand, a
        restore gone wrong) is left out with a line naming it: one bad key must not keep a
        broker from starting or stop a reload of the others."""
        try:
            self._apply_put(key, value)
        except Exception as exc:
            log.warning("cannot load %s, left out of the cluster view: %r", key, exc)

    def _apply_put(self, key: str, value: bytes) -> None:
        parts = self._relative(key)
        kind = parts[0]
        if kind == "topics" and len(parts) == 2:
            self.topics[parts[1]] = TopicInfo.from_json(parts[1], value)
        elif kind == "brokers" and len(parts) == 2:
            info = self.brokers[int(parts[1])] = BrokerInfo.from_json(value)
            self.departed.pop(info.node_id, None)  # registered again: live, not departed
            if info.log_dir is not None:
                self.log_dirs[info.node_id] = info.log_dir
        elif kind == "partitions" and len(parts) == 3:
            tp = (parts[1], int(parts[2]))
            committing = self._committing.get(tp)
            if committing is not None and committing[0] == value:
                self.update_state(tp, committing[1])
            else:
                self.update_state(tp, PartitionState.from_json(value))
        elif kind == "leases" and len(parts) == 4 and parts[1] == "partitions":
            self.owners[(parts[2], int(parts[3]))] = int(value)
        elif kind == "assignment" and len(parts) == 1:
            self.assignment = Assignment.from_json(value)
        elif kind == "draining" and len(parts) == 2:
            self.draining.add(int(parts[1]))
        elif kind == "group-configs" and len(parts) == 2:
            self.group_configs[keys.group_from_key_part(parts[1])] = decode_group_configs(value)
        elif kind == "share-groups" and len(parts) == 2:
            self.share_members.put(keys.group_from_key_part(parts[1]), value)
        elif kind == "acls":
            self.acls.put(key, value)
        elif kind == "quotas":
            self.quotas.put(key, value)

    def _apply_delete(self, key: str) -> None:
        parts = self._relative(key)
        kind = parts[0]
        if kind == "topics" and len(parts) == 2:
            self.topics.pop(parts[1], None)
        elif kind == "brokers" and len(parts) == 2:
            info = self.brokers.pop(int(parts[1]), None)
            if info is not None:
                self._record_departure(info)
        elif kind == "partitions" and len(parts) == 3:
            tp = (parts[1], int(parts[2]))
            self.states.pop(tp, None)
            self._own_commits.pop(tp, None)
            self._committing.pop(tp, None)
            self.watermarks.notify(tp)
        elif kind == "leases" and len(parts) == 4 and parts[1] == "partitions":
            self.owners.pop((parts[2], int(parts[3])), None)
        elif kind == "draining" and len(parts) == 2:
            self.draining.discard(int(parts[1]))
        elif kind == "group-configs" and len(parts) == 2:
            self.group_configs.pop(keys.group_from_key_part(parts[1]), None)
        elif kind == "share-groups" and len(parts) == 2:
            self.share_members.delete(keys.group_from_key_part(parts[1]))
        elif kind == "acls":
            self.acls.delete(key)
        elif kind == "quotas":
            self.quotas.delete(key)

    def _forget_brokers(self) -> None:
        """Before a reload's read: every registration counts as departed until the read puts
        it back (``_apply_put``), so one deleted in the compacted stretch stays departed."""
        for info in self.brokers.values():
            self._record_departure(info)
        self.brokers.clear()

    def _record_departure(self, info: BrokerInfo) -> None:
        """Remember a deleted registration for the grace period, forgetting older ones (ids
        are new at every start: a long-lived cluster would otherwise remember every stop)."""
        if self._departed_grace_s <= 0:
            return
        now = time.monotonic()
        self.departed = {
            node_id: d
            for node_id, d in self.departed.items()
            if now - d.at < self._departed_grace_s
        }
        self.departed[info.node_id] = Departure(info, now)


def draining_mark_of(entry: KeyValue) -> int | None:
    """The broker id a ``draining/<id>`` key marks (None: not one)."""
    try:
        return int(entry.key.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def decode_group_configs(value: bytes) -> dict[str, str]:
    """A group's stored configs (``keys.group_config_key``): name -> value."""
    document = json.loads(value)
    return {str(k): str(v) for k, v in document.items()} if isinstance(document, dict) else {}


def entries_by_key(entries: Iterable[KeyValue]) -> dict[str, KeyValue]:
    return {entry.key: entry for entry in entries}
