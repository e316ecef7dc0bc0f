"""Our one adapter over aetcd: every etcd call the broker makes goes through here.

Why an adapter: aetcd is thin. It does not keep leases alive, its watches die with the gRPC
stream when etcd restarts, its errors are its own classes, and ``transaction()`` drops the
response header (so the revision of a commit is lost). The adapter (this module and the ones
beside it, listed below) fixes those once:

* every call runs under ``asyncio.timeout(timeout_s)`` and fails with ``MetadataUnavailable``
  when etcd cannot answer (callers map it to REQUEST_TIMED_OUT, or a non-zero exit at
  start-up: fail closed, DESIGN §3.11);
* ``SessionLease`` owns the broker's single session lease and its keepalive task, and sets
  ``lost`` as soon as the lease may have expired, so the broker stops acting as owner
  (DESIGN §3.3, §3.4);
* ``watch_prefix`` resumes after an etcd restart from the last seen revision + 1, so no event
  is lost, and says ``RESYNC`` if that history was compacted away, or is gone (etcd restored
  from a backup, or 3.5.1 lost writes: its revision went back; ``watch_history``);
* transactions use our own small compare/op values, so no aetcd type leaks to callers;
* every configured endpoint is used: a call that finds its member unreachable moves the client
  to the next endpoint (reads are retried there at once; writes fail with
  ``MetadataUnavailable`` and the caller's retry goes to the next member, because a write that
  timed out may still have been applied), so watches and the session keepalive, which retry,
  follow too;
* ``https://`` endpoints get a TLS channel (CA, optional client certificate and key), and a
  username and password authenticate every member's channel.

Keys are ``str`` (built by ``keys``), values ``bytes``. Never import ``etcd3aio`` in the same
process: it registers the same protobuf symbols as aetcd.

The client (:class:`Etcd`: calls, fail-over, key-value reads and writes, transactions, leases,
watches) is here; beside it, one concern each: ``etcd_errors`` (our exceptions and the map
from aetcd's), ``etcd_txn`` (key-values, compares, ops, results and their gRPC messages),
``etcd_channel`` (endpoints, TLS, the per-member aetcd client) and ``session_lease``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
from aetcd import rpc

from kafscale.broker.metadata.etcd_channel import BadEndpoint, EtcdTls, make_client, parse_endpoint
from kafscale.broker.metadata.etcd_errors import (
    LeaseLost,
    MetadataError,
    MetadataTokenExpired,
    MetadataUnavailable,
    cut_off_by_channel_close,
    translate_error,
    unreachable_reason,
)
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    KeyValue,
    Op,
    TxnResult,
    compare_message,
    create_revision_is,
    get_op,
    key_value,
    mod_revision_is,
    op_message,
    op_result,
    prefix_range_end,
    put_op,
)
from kafscale.broker.metadata.etcd_watcher import MatchedWatcher, WatchStalled
from kafscale.broker.metadata.watch_history import (
    HistoryProbe,
    LastWrite,
    WatchMark,
    history_lost,
)
from kafscale.broker.metadata.watch_progress import wait_for_stall
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)

T = TypeVar("T")

_WATCH_BACKOFF_MIN_S = 0.05
_WATCH_BACKOFF_MAX_S = 2.0
_WATCH_CANCEL_TIMEOUT_S = 1.0


class WatchEventKind(enum.StrEnum):
    PUT = "PUT"
    DELETE = "DELETE"
    RESYNC = "RESYNC"
    """History was compacted or is gone: reload the prefix; events after ``mod_revision``
    follow."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix. For RESYNC, ``key`` is the prefix and ``value`` empty."""

    kind: WatchEventKind
    key: str
    value: bytes
    mod_revision: int
    rewound: bool = False
    """RESYNC only: etcd's history went back (``watch_history``), so ``mod_revision`` may be
    lower than revisions seen before, and any revision kept from before means nothing now
    (reload even if an earlier reload read "past" it; drop remembered revisions)."""


def _last_write(event: WatchEvent) -> LastWrite:
    return LastWrite(
        event.key, event.mod_revision, event.value, event.kind is WatchEventKind.DELETE
    )


WatchStateListener = Callable[[BaseException | None], None]
"""Told of a watch's interruption (the error) and of its (re-)creation (None)."""


def _watch_event(raw: Any) -> WatchEvent:
    return WatchEvent(
        kind=WatchEventKind(str(raw.kind)),
        key=bytes(raw.kv.key).decode(),
        value=bytes(raw.kv.value),
        mod_revision=int(raw.kv.mod_revision),
    )


def _alarm_name(alarm_type: Any) -> str:
    """aetcd gives alarm types as protobuf enum numbers: NONE 0, NOSPACE 1, CORRUPT 2."""
    names = {0: "NONE", 1: "NOSPACE", 2: "CORRUPT"}
    return (
        names.get(int(alarm_type), str(alarm_type))
        if isinstance(alarm_type, int)
        else str(alarm_type)
    )


def _history_compacted(error: MetadataError) -> bool:
    """Whether etcd refused a read at a revision because its history was compacted past it."""
    return "required revision has been compacted" in str(error.__cause__ or error)


class _RevisionCompacted(Exception):
    """The watch's start revision is older than etcd's compacted history."""


class Backoff:
    """Exponential delay with jitter, so many watchers do not reconnect in lockstep."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self._first_s = first_s
        self._max_s = max_s
        self._next_s = first_s

    def reset(self) -> None:
        self._next_s = self._first_s

    def next_delay(self) -> float:
        delay = self._next_s
        self._next_s = min(self._max_s, self._next_s * 2)
        return delay * random.uniform(0.5, 1.0)


_REAUTHENTICATE_S = 1.0
"""A member's client is closed to authenticate again at most this often."""

_READS = frozenset({"range", "get", "get_prefix"})
"""Calls retried at once on the next member: they change nothing."""


class Etcd:
    """A connected etcd client; build it with ``await Etcd.connect(...)``."""

    def __init__(
        self, clients: Sequence[aetcd.Client], endpoints: Sequence[str], timeout_s: float
    ) -> None:
        self._clients = list(clients)
        self._endpoints = list(endpoints)
        self._current = 0
        self.timeout_s = timeout_s
        self._closed = asyncio.Event()
        self._reauthenticated_s: dict[int, float] = {}  # member -> when it last did

    @property
    def _client(self) -> aetcd.Client:
        return self._clients[self._current]

    @property
    def endpoint(self) -> str:
        """The member this client talks to now."""
        return self._endpoints[self._current]

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        timeout_s: float,
        *,
        username: str | None = None,
        password: str | None = None,
        tls: EtcdTls | None = None,
    ) -> Etcd:
        """A client over every endpoint, talking first to the first that answers a real read
        within ``timeout_s``, in order. ``BadEndpoint`` for an endpoint that cannot be used at
        all; ``MetadataUnavailable`` if none answers, saying of each what happened on one
        line (``http://etcd-0:2379: connection refused; ...``)."""
        if not endpoints:
            raise BadEndpoint("no etcd endpoints configured")
        parsed = [parse_endpoint(endpoint) for endpoint in endpoints]
        clients = [make_client(e, timeout_s, username, password, tls) for e in parsed]
        etcd = cls(clients, endpoints, timeout_s)
        failures: list[str] = []
        try:
            for index in range(len(clients)):
                etcd._current = index
                try:
                    await etcd._call_here("range", etcd._probe)
                except MetadataError as error:
                    reason = unreachable_reason(error, timeout_s)
                    failures.append(f"{endpoints[index]}: {reason}")
                    continue
                return etcd
        except BaseException:
            await etcd.close()
            raise
        await etcd.close()
        raise MetadataUnavailable("; ".join(failures))

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def close(self) -> None:
        """Close the channels; running ``watch_prefix`` iterators end."""
        if self.closed:
            return
        self._closed.set()
        for client, endpoint in zip(self._clients, self._endpoints, strict=True):
            try:
                async with asyncio.timeout(self.timeout_s):
                    await client.close()
            except (TimeoutError, aetcd.ClientError, rpc.AioRpcError) as error:
                log.warning("closing etcd client for %s: %s", endpoint, error)

    def _fail_over(self, failed: int) -> None:
        """The member at ``failed`` did not answer: talk to the next one from now on."""
        if self._current == failed and len(self._clients) > 1:
            self._current = (failed + 1) % len(self._clients)
            log.warning(
                "etcd at %s unreachable; using %s",
                self._endpoints[failed],
                self._endpoints[self._current],
            )

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run one RPC under the timeout and translate its failures; move to the next member
        when this one cannot answer (and retry there at once if the call only reads)."""
        attempts = len(self._clients) if what in _READS else 1
        for attempt in range(attempts):
            at = self._current
            try:
                return await self._call_here(what, call)
            except MetadataUnavailable:
                self._fail_over(at)
                if attempt == attempts - 1 or self.closed:
                    raise
        raise AssertionError("unreachable")

    async def _call_here(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """One RPC at the current member."""
        if self.closed:
            raise MetadataUnavailable(f"etcd {what}: the client is closed")
        endpoint = self.endpoint
        started = time.perf_counter()
        failed = True
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._client.connect()
                result = await call()
                failed = False
                return result
        except TimeoutError as error:
            message = f"etcd {what} timed out after {self.timeout_s:g} s at {endpoint}"
            raise MetadataUnavailable(message) from error
        except asyncio.CancelledError as error:
            if not cut_off_by_channel_close(asyncio.current_task()):
                raise
            message = f"etcd {what} at {endpoint} cut off: its channel was closed meanwhile"
            raise MetadataUnavailable(message) from error
        except (aetcd.ClientError, rpc.AioRpcError) as error:
            translated = translate_error(error, f"{what} at {endpoint}")
            failed = not isinstance(translated, LeaseLost)  # an answer: the lease is gone
            if isinstance(translated, MetadataTokenExpired):
                await self._reauthenticate(self._current)
            raise translated from error
        finally:
            METRICS.etcd_call(what, time.perf_counter() - started, failed)

    async def _check_token(self) -> None:
        """A watch refused as "permission denied" may be one whose token etcd no longer
        accepts (etcd names that only on unary calls): one read tells, and authenticates again
        if so (``_call_here``)."""
        with contextlib.suppress(MetadataError):
            await self.revision()

    async def _reauthenticate(self, member: int) -> None:
        """The member no longer accepts our token: close its channel, so the next call
        connects and authenticates again (aetcd authenticates only when it connects: a broker
        whose role lost and regained its permission across an etcd restart failed every call
        with UNAUTHENTICATED, and had every watch refused, until the process restarted). At
        most once a second per member: calls failing together close it once."""
        now = time.monotonic()
        if now - self._reauthenticated_s.get(member, -1e9) < _REAUTHENTICATE_S:
            return
        self._reauthenticated_s[member] = now
        log.warning("etcd at %s no longer knows our auth token; authenticating again",
                    self._endpoints[member])  # fmt: skip
        try:
            await self._clients[member].close()
        except Exception as error:  # a channel already broken: connecting anew is the point
            log.debug("closing etcd client to authenticate again: %r", error)

    async def _probe(self) -> Any:
        probe = b"/kafscale"
        return await self._client.get_range(probe, probe + b"\0")

    # --- key-value ---

    async def revision(self) -> int:
        """The store's current revision (one cheap read)."""
        response = await self._call("range", self._probe)
        return int(response.header.revision)

    async def history_probe(self, last_write: LastWrite | None) -> HistoryProbe:
        """etcd's cluster id and current revision and, if given, ``last_write``'s key as etcd
        holds it at that write's revision: what ``watch_history.history_lost`` decides from."""
        header = (await self._call("range", self._probe)).header
        probe = HistoryProbe(int(header.cluster_id), int(header.revision))
        if last_write is None or last_write.mod_revision > probe.current_revision:
            return probe
        request = rpc.RangeRequest(key=last_write.key.encode(), revision=last_write.mod_revision)
        try:
            response = await self._call(
                "range",
                lambda: self._client.kvstub.Range(
                    request, timeout=self.timeout_s, metadata=self._client.metadata
                ),
            )
        except MetadataError as error:
            if _history_compacted(error):
                return probe  # nothing to compare with; the watch's creation says RESYNC
            raise
        found = key_value(response.kvs[0]) if response.kvs else None
        return HistoryProbe(probe.cluster_id, probe.current_revision, True, found)

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._call("get", lambda: self._client.get(key.encode()))
        return None if raw is None else key_value(raw)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        """Every key under ``prefix``, sorted by key."""
        kvs, _ = await self.get_prefix_with_revision(prefix)
        return kvs

    async def get_prefix_with_revision(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the revision read at: watch from revision + 1."""
        response = await self._call(
            "get_prefix",
            lambda: self._client.get_prefix(
                prefix.encode(), sort_order="ascend", sort_target="key"
            ),
        )
        return [key_value(raw) for raw in response.kvs], int(response.header.revision)

    async def get_ranges_with_revision(
        self, ranges: Sequence[tuple[str, str]]
    ) -> tuple[list[KeyValue], int]:
        """Every key in each ``[start, end)`` of ``ranges``, all read at one revision (the first
        read's), and that revision: watch each range from revision + 1 and nothing is missed
        or seen twice. Keys come range by range, sorted within each.

        History compacted past that revision before the last range is read (the compactor
        compacts to the current revision under etcd's NOSPACE alarm; an external etcd may
        auto-compact by revision) makes etcd refuse the later reads: the read starts over at
        the revision then current. (Raised, it ended the cluster view's reload for good.)"""
        while True:
            try:
                return await self._read_ranges(ranges)
            except MetadataError as error:
                if not _history_compacted(error):
                    raise
                log.info(
                    "etcd history compacted while reading %d ranges; reading again", len(ranges)
                )

    async def _read_ranges(self, ranges: Sequence[tuple[str, str]]) -> tuple[list[KeyValue], int]:
        """One attempt of ``get_ranges_with_revision``."""
        found: list[KeyValue] = []
        revision = 0
        for start, end in ranges:
            request = rpc.RangeRequest(
                key=start.encode(),
                range_end=end.encode(),
                revision=revision,
                sort_order=rpc.RangeRequest.ASCEND,
                sort_target=rpc.RangeRequest.KEY,
            )
            response = await self._call(
                "get_prefix",
                functools.partial(
                    self._client.kvstub.Range,
                    request,
                    timeout=self.timeout_s,
                    metadata=self._client.metadata,
                ),
            )
            revision = revision or int(response.header.revision)
            found += [key_value(raw) for raw in response.kvs]
        return found, revision

    async def get_range(
        self, start: str, end: str, limit: int, keys_only: bool = False
    ) -> tuple[list[KeyValue], bool]:
        """One page of a range too large to read whole: at most ``limit`` keys from ``start``
        (inclusive) to ``end`` (exclusive), sorted by key, and whether more keys follow. With
        ``keys_only`` the values are left out (empty). Every answer is bounded, whatever the
        range holds."""
        request = rpc.RangeRequest(
            key=start.encode(), range_end=end.encode(), limit=limit, keys_only=keys_only
        )
        # aetcd's range calls take no limit: call its KV stub directly.
        response = await self._call(
            "range",
            lambda: self._client.kvstub.Range(
                request, timeout=self.timeout_s, metadata=self._client.metadata
            ),
        )
        return [key_value(raw) for raw in response.kvs], bool(response.more)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> int:
        """Write ``key``; returns the revision of the write."""
        response = await self._call("put", lambda: self._client.put(key.encode(), value, lease))
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        """True if the key existed."""
        response = await self._call("delete", lambda: self._client.delete(key.encode()))
        return response is not None

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many."""
        response = await self._call(
            "delete_prefix", lambda: self._client.delete_prefix(prefix.encode())
        )
        return int(response.deleted)

    async def server_version(self) -> str:
        """The etcd version the current member reports (the maintenance Status RPC)."""
        response = await self._call("status", self._status)
        return str(response.version)

    async def _status(self) -> Any:
        client = self._client
        return await client.maintenancestub.Status(
            rpc.StatusRequest(), timeout=self.timeout_s, metadata=client.metadata
        )

    async def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (watches from older revisions then RESYNC)."""
        await self._call("compact", lambda: self._client.compact(revision, physical=True))

    async def alarms(self) -> list[str]:
        """The alarms raised on any member (``NOSPACE``, ``CORRUPT``)."""
        raw = await self._call("alarm list", self._list_alarms)
        return sorted({_alarm_name(alarm.alarm_type) for alarm in raw})

    async def _disarm(self, member_id: int) -> Any:
        return await self._client.disarm_alarm(member_id)

    async def _list_alarms(self) -> list[Any]:
        return [alarm async for alarm in self._client.list_alarms()]

    async def recover_space(self) -> None:
        """After a compaction: defragment every member (giving the freed pages back, which
        brings the database under its quota) and disarm the NOSPACE alarm."""
        for index, client in enumerate(self._clients):
            try:
                async with asyncio.timeout(max(self.timeout_s, 30.0)):
                    await client.connect()
                    await client.defragment()
            except (TimeoutError, aetcd.ClientError, rpc.AioRpcError) as error:
                log.warning("defragmenting etcd at %s: %s", self._endpoints[index], error)
        for alarm in await self._call("alarm list", self._list_alarms):
            if _alarm_name(alarm.alarm_type) == "NOSPACE":
                await self._call("alarm disarm", functools.partial(self._disarm, alarm.member_id))

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """All compares hold → run ``success``, else ``failure``; atomically."""
        request = rpc.TxnRequest(
            compare=[compare_message(c) for c in compares],
            success=[op_message(op) for op in success],
            failure=[op_message(op) for op in failure],
        )
        # aetcd.Client.transaction() drops the header (the revision): call its KV stub directly.
        response = await self._call(
            "txn",
            lambda: self._client.kvstub.Txn(
                request, timeout=self.timeout_s, metadata=self._client.metadata
            ),
        )
        revision = int(response.header.revision)
        results = [op_result(r, revision) for r in response.responses]
        return TxnResult(bool(response.succeeded), revision, results)

    async def create_if_absent(self, key: str, value: bytes, lease: int | None = None) -> bool:
        """Create ``key`` unless it exists; True if this call created it."""
        result = await self.txn([create_revision_is(key, 0)], [put_op(key, value, lease)])
        return result.succeeded

    async def increment(self, key: str) -> int:
        """Atomically add one to the decimal counter at ``key`` (absent = 0); returns the new value.

        A compare-and-swap loop on the key's mod revision; a lost race reads the winner's value
        in the same transaction, so contention costs one round trip per retry. Some caller wins
        every round, so ``n`` concurrent callers finish in at most ``n`` rounds.
        """
        current = await self.get(key)
        while True:
            if current is None:
                expected, value = create_revision_is(key, 0), 1
            else:
                expected, value = mod_revision_is(key, current.mod_revision), int(current.value) + 1
            result = await self.txn([expected], [put_op(key, str(value).encode())], [get_op(key)])
            if result.succeeded:
                return value
            current = result.kv(0)

    # --- leases ---

    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._call("lease grant", lambda: self._client.lease(ttl_s))
        return int(lease.id)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease, deleting every key bound to it; a lease already gone is fine."""
        with contextlib.suppress(LeaseLost):
            await self._call("lease revoke", lambda: self._client.revoke_lease(lease_id))

    async def refresh_lease(self, lease_id: int) -> int:
        """One keepalive; returns the TTL granted again. LeaseLost if the lease is gone."""
        reply = await self._call("lease keepalive", lambda: self._client.refresh_lease(lease_id))
        if reply is None:
            raise MetadataUnavailable(f"etcd lease keepalive at {self.endpoint}: no reply")
        if reply.TTL <= 0:
            raise LeaseLost(f"etcd lease {lease_id:x} has expired or was revoked")
        return int(reply.TTL)

    # --- watches ---

    def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under ``prefix``: ``watch_range`` over the prefix's keys."""
        end = prefix_range_end(prefix.encode()).decode()
        return self.watch_range(prefix, end, start_revision)

    async def watch_range(
        self,
        start: str,
        end: str,
        start_revision: int | None = None,
        on_state: WatchStateListener | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change to a key in ``[start, end)`` from ``start_revision`` (None: from now),
        in order.

        Survives etcd restarts and connection loss: the watch is re-created with backoff from
        the last delivered revision + 1, so nothing is skipped or repeated. If that revision was
        compacted meanwhile, yields one ``RESYNC`` event whose ``mod_revision`` is the revision
        the watch continues after: reload with ``get_prefix`` (events that follow may already be
        reflected in the reload; their ``mod_revision`` tells). Ends when the client is closed.

        Before each creation it checks that etcd still holds the history it followed (the
        caller's ``start_revision - 1`` counts as seen): after a restore from a backup, or
        writes etcd 3.5.1 lost, the revision goes back and later writes reuse revisions, so
        resuming at the last revision + 1 would skip them. Then it yields a ``RESYNC`` with
        ``rewound`` set, at etcd's current revision (``watch_history``).

        ``on_state`` hears of each interruption (with its error) and of each watch created
        (None): between the two the range is not followed, though the generator goes on (an
        etcd that refuses the watch or the read before it, permission denied, is retried like
        one that is down: a refused read ended the generator, and the group and transaction
        lease watches with it, for good).

        A run of interruptions is logged as any retry loop's (``RetryLog``, at INFO: a watch
        re-created after a blip is normal): its first, a summary now and then, and the
        re-creation with how long the watch was down. Each retry used to log a line, several a
        second per watch for as long as etcd was unreachable.

        Like any async generator it starts on the first ``__anext__``, so "from now" means from
        then: to miss nothing, list with ``get_prefix_with_revision`` and watch from its
        revision + 1. Use it under ``contextlib.aclosing`` so the server-side watch is
        cancelled promptly when the caller stops early.
        """
        seen = None if start_revision is None else start_revision - 1
        cluster_id: int | None = None
        last: WatchEvent | None = None  # the last event delivered (not a RESYNC)
        resync = False
        backoff = Backoff(_WATCH_BACKOFF_MIN_S, _WATCH_BACKOFF_MAX_S)
        retries = RetryLog(log, f"etcd watch on {start}", level=logging.INFO)

        def created(state: BaseException | None) -> None:
            """``_watch`` tells of each watch created (None): the end of a run of failures."""
            if state is None:
                retries.succeeded()
            if on_state is not None:
                on_state(state)

        while not self.closed:
            try:
                last_write = None if last is None else _last_write(last)
                probe = await self.history_probe(last_write)
                lost = None
                if seen is not None:  # a creation from now has nothing to lose yet
                    lost = history_lost(WatchMark(seen, cluster_id, last_write), probe)
                if lost is not None:
                    log.warning("etcd watch on %s: %s; resyncing", start, lost)
                if resync or lost is not None:
                    event = WatchEvent(
                        WatchEventKind.RESYNC, start, b"", probe.current_revision, lost is not None
                    )
                    yield event
                if seen is None or resync or lost is not None:
                    seen, last, resync = probe.current_revision, None, False
                cluster_id = probe.cluster_id
                watch = self._watch(start, end, seen + 1, created)
                async with contextlib.aclosing(watch) as events:
                    async for event in events:
                        backoff.reset()
                        seen, last = event.mod_revision, event
                        yield event
                if self.closed:
                    return
                log.info("etcd watch on %s ended by the server; re-creating", start)
            except _RevisionCompacted:
                log.warning("etcd watch on %s: revision %s compacted", start, (seen or 0) + 1)
                resync = True
                continue
            except MetadataError as error:  # an outage, or a refusal: the probe's read too
                if self.closed:
                    return
                retries.failed(error)
                if on_state is not None:
                    on_state(error)
                if "permission denied" in str(error):
                    await self._check_token()
            await self.pause(backoff.next_delay())

    async def _watch(
        self, start: str, end: str, start_revision: int, on_state: WatchStateListener | None
    ) -> AsyncGenerator[WatchEvent, None]:
        """One aetcd watch: events until its stream breaks (raises) or the client closes."""
        at = self._current
        try:
            watch = await self._call(
                "watch",
                lambda: self._client.watch(
                    start.encode(), range_end=end.encode(), start_revision=start_revision
                ),
            )
        except MetadataError as error:
            if isinstance(error.__cause__, aetcd.RevisionCompactedError):
                raise _RevisionCompacted() from error
            raise
        if on_state is not None:
            on_state(None)
        guard = start_task(self._guard_watch(at, watch, start), f"etcd watch guard {start}")
        try:
            async for raw in watch:
                yield _watch_event(raw)
        except aetcd.RevisionCompactedError as error:
            raise _RevisionCompacted() from error
        except (aetcd.ClientError, rpc.AioRpcError) as error:
            translated = translate_error(error, f"watch at {self._endpoints[at]}")
            if isinstance(translated, MetadataUnavailable):
                self._fail_over(at)
            raise translated from error
        finally:
            await cancel_and_wait(guard)
            await self._cancel_watch(watch)

    async def _guard_watch(self, at: int, watch: Any, start: str) -> None:
        """End ``watch`` if its member stops delivering while the cluster goes on (frozen,
        partitioned or diverged: the stream stays open and silent; ``watch_progress``)."""
        watcher = getattr(self._clients[at], "_watcher", None)
        if not isinstance(watcher, MatchedWatcher):
            return
        lag = await wait_for_stall(
            self.revision,
            watcher.request_progress,
            lambda: watcher.heard_revision,
            # one call deadline: a member that leaves a progress request unanswered that long
            # would have failed a unary call
            self.timeout_s,
        )
        endpoint = self._endpoints[at]
        log.warning(
            "etcd watch on %s at %s heard nothing up to revision %d for %.0f s while the "
            "cluster went on (member frozen, partitioned or diverged?); re-creating it",
            start, endpoint, lag.target_revision, self.timeout_s,
        )  # fmt: skip
        METRICS.etcd_watch_stalled()
        await watcher.fail_watch(watch.watch_id, WatchStalled(f"no progress from {endpoint}"))

    async def _cancel_watch(self, watch: Any) -> None:
        """Best effort: the stream may already be gone, then there is nothing to cancel."""
        try:
            async with asyncio.timeout(_WATCH_CANCEL_TIMEOUT_S):
                await watch.cancel()
        except Exception as error:  # a dead stream or a closed client: nothing to cancel
            log.debug("cancelling etcd watch: %r", error)

    async def pause(self, delay_s: float) -> None:
        """Sleep ``delay_s`` unless the client closes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._closed.wait()


async def _until_answered(etcd: Etcd, read: Callable[[], Awaitable[T]], what: str) -> T:
    """``read``, retried with backoff while etcd cannot answer or refuses it (permission
    denied, until a role is mended): for the reload after a RESYNC, which must not be skipped
    (the watch goes on after the compacted stretch, so a reload given up loses its changes for
    good: a proxy kept routing to an owner that had moved). Ends when the client is closed
    (``MetadataUnavailable``)."""
    backoff = Backoff(_WATCH_BACKOFF_MIN_S, _WATCH_BACKOFF_MAX_S)
    retries = RetryLog(log, f"{what}: cannot reload from etcd")
    while True:
        try:
            result = await read()
        except MetadataError as exc:
            if etcd.closed:
                raise
            retries.failed(exc)
            await etcd.pause(backoff.next_delay())
            continue
        retries.succeeded()
        return result


async def read_prefix_until_answered(etcd: Etcd, prefix: str, what: str) -> list[KeyValue]:
    """``get_prefix``, retried while etcd cannot answer (``_until_answered``)."""
    return await _until_answered(etcd, lambda: etcd.get_prefix(prefix), what)


async def read_ranges_until_answered(
    etcd: Etcd, ranges: Sequence[tuple[str, str]], what: str
) -> tuple[list[KeyValue], int]:
    """``get_ranges_with_revision``, retried while etcd cannot answer (``_until_answered``)."""
    return await _until_answered(etcd, lambda: etcd.get_ranges_with_revision(ranges), what)
