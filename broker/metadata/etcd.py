"""Our one adapter over aetcd: every etcd call the broker makes goes through here.

Why an adapter: aetcd is thin. It does not keep leases alive, its watches die with the gRPC
stream when etcd restarts, its errors are its own classes, and ``transaction()`` drops the
response header (so the revision of a commit is lost). This module fixes those once:

* every call runs under ``asyncio.timeout(timeout_s)`` and fails with ``MetadataUnavailable``
  when etcd cannot answer (callers map it to REQUEST_TIMED_OUT, or a non-zero exit at
  start-up: fail closed, DESIGN §3.11);
* ``SessionLease`` owns the broker's single session lease and its keepalive task, and sets
  ``lost`` as soon as the lease may have expired, so the broker stops acting as owner
  (DESIGN §3.3, §3.4);
* ``watch_prefix`` resumes after an etcd restart from the last seen revision + 1, so no event
  is lost, and says ``RESYNC`` if that history was compacted away;
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
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc

from kafscale.broker.observability.metrics import METRICS

log = logging.getLogger(__name__)

T = TypeVar("T")

# gRPC channel options: reconnect within ~1 s after an etcd restart (the default backoff grows
# to two minutes), detect a dead peer on an idle watch stream (etcd allows pings every >= 5 s),
# and accept large prefix reads (the default limit is 4 MiB).
_CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 50,
    "grpc.min_reconnect_backoff_ms": 50,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_receive_message_length": 256 * 1024 * 1024,
}

# gRPC status codes that mean "etcd could not answer now", not "etcd said no".
_UNAVAILABLE_CODES = frozenset(
    {
        rpc.StatusCode.UNAVAILABLE,
        rpc.StatusCode.DEADLINE_EXCEEDED,
        rpc.StatusCode.RESOURCE_EXHAUSTED,
        rpc.StatusCode.CANCELLED,
        rpc.StatusCode.UNKNOWN,
    }
)

_WATCH_BACKOFF_MIN_S = 0.05
_WATCH_BACKOFF_MAX_S = 2.0
_WATCH_CANCEL_TIMEOUT_S = 1.0


class MetadataError(Exception):
    """etcd refused a request (a bug or misuse, not an outage)."""


class MetadataUnavailable(MetadataError):
    """etcd could not be reached or did not answer within the configured timeout."""


class MetadataNoSpace(MetadataUnavailable):
    """etcd raised its NOSPACE alarm (its space quota is used up): it refuses every write
    until history is compacted, the database defragmented and the alarm disarmed, which the
    brokers' compactor does (``compaction``)."""


class LeaseLost(MetadataError):
    """The lease no longer exists in etcd (expired or revoked): stop acting as its owner."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


class WatchEventKind(enum.StrEnum):
    PUT = "PUT"
    DELETE = "DELETE"
    RESYNC = "RESYNC"
    """History was compacted: reload the prefix; events after ``mod_revision`` follow."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change under a watched prefix. For RESYNC, ``key`` is the prefix and ``value`` empty."""

    kind: WatchEventKind
    key: str
    value: bytes
    mod_revision: int


# --- transactions -----------------------------------------------------------------------------


class CompareTarget(enum.Enum):
    VALUE = "value"
    CREATE_REVISION = "create_revision"
    MOD_REVISION = "mod_revision"


@dataclass(frozen=True, slots=True)
class Compare:
    """An equality test on one key; build it with the helpers below."""

    key: str
    target: CompareTarget
    expected: bytes | int


@dataclass(frozen=True, slots=True)
class PutOp:
    key: str
    value: bytes
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteOp:
    key: str
    prefix: bool = False  # every key starting with ``key``


@dataclass(frozen=True, slots=True)
class GetOp:
    key: str


Op = PutOp | DeleteOp | GetOp
OpResult = KeyValue | int | None
"""GetOp: the KeyValue or None; PutOp: the revision written; DeleteOp: keys deleted."""


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    revision: int
    """Store revision after the transaction (the revision of its writes, if any)."""
    responses: list[OpResult]
    """One result per op of the branch that ran, in order (see ``OpResult``)."""

    def kv(self, index: int) -> KeyValue | None:
        """The result of the GetOp at ``index``."""
        result = self.responses[index]
        if isinstance(result, int):
            raise TypeError(f"txn response {index} is not a get result")
        return result


def value_is(key: str, value: bytes) -> Compare:
    return Compare(key, CompareTarget.VALUE, value)


def create_revision_is(key: str, revision: int) -> Compare:
    """``revision == 0`` means the key does not exist."""
    return Compare(key, CompareTarget.CREATE_REVISION, revision)


def mod_revision_is(key: str, revision: int) -> Compare:
    return Compare(key, CompareTarget.MOD_REVISION, revision)


def put_op(key: str, value: bytes, lease: int | None = None) -> PutOp:
    return PutOp(key, value, lease)


def delete_op(key: str) -> DeleteOp:
    return DeleteOp(key)


def delete_prefix_op(prefix: str) -> DeleteOp:
    return DeleteOp(prefix, prefix=True)


def prefix_range_end(prefix: bytes) -> bytes:
    """etcd's range end for "every key starting with ``prefix``": the prefix with its last byte
    below 0xff incremented (and the bytes after it dropped)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\0"  # all keys
    return stripped[:-1] + bytes([stripped[-1] + 1])


def get_op(key: str) -> GetOp:
    return GetOp(key)


def _compare_message(compare: Compare) -> Any:
    message = rpc.Compare(key=compare.key.encode(), result=rpc.Compare.EQUAL)
    if compare.target is CompareTarget.VALUE:
        message.target = rpc.Compare.VALUE
        message.value = compare.expected
    elif compare.target is CompareTarget.CREATE_REVISION:
        message.target = rpc.Compare.CREATE
        message.create_revision = compare.expected
    else:
        message.target = rpc.Compare.MOD
        message.mod_revision = compare.expected
    return message


def _op_message(op: Op) -> Any:
    key = op.key.encode()
    if isinstance(op, PutOp):
        put = rpc.PutRequest(key=key, value=op.value, lease=op.lease or 0)
        return rpc.RequestOp(request_put=put)
    if isinstance(op, DeleteOp):
        range_end = prefix_range_end(key) if op.prefix else b""
        delete = rpc.DeleteRangeRequest(key=key, range_end=range_end)
        return rpc.RequestOp(request_delete_range=delete)
    return rpc.RequestOp(request_range=rpc.RangeRequest(key=key))


def _op_result(response: Any, revision: int) -> OpResult:
    kind = response.WhichOneof("response")
    if kind == "response_range":
        kvs = response.response_range.kvs
        return _key_value(kvs[0]) if kvs else None
    if kind == "response_delete_range":
        return int(response.response_delete_range.deleted)
    return revision


# --- conversions and errors -------------------------------------------------------------------


def _key_value(raw: Any) -> KeyValue:
    return KeyValue(
        key=bytes(raw.key).decode(),
        value=bytes(raw.value),
        create_revision=int(raw.create_revision),
        mod_revision=int(raw.mod_revision),
        version=int(raw.version),
        lease=int(raw.lease),
    )


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


def _grpc_code(error: BaseException) -> Any:
    for candidate in (error, error.__cause__):
        if isinstance(candidate, rpc.AioRpcError):
            return candidate.code()
    return None


def _translate(error: BaseException, what: str) -> MetadataError:
    """Map aetcd/gRPC errors onto ours: outage, lease gone, or refusal."""
    message = f"etcd {what} failed: {error}"
    if isinstance(
        error, aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError | aetcd.WatchTimeoutError
    ):
        return MetadataUnavailable(message)
    code = _grpc_code(error)
    if "database space exceeded" in str(error):
        return MetadataNoSpace(
            f"{message} (etcd is out of space: its NOSPACE alarm is raised; writes resume once "
            "history is compacted, the database defragmented and the alarm disarmed)"
        )
    if code in _UNAVAILABLE_CODES:
        return MetadataUnavailable(message)
    if code == rpc.StatusCode.NOT_FOUND and "lease not found" in str(error):
        return LeaseLost(message)
    return MetadataError(message)


class BadEndpoint(ValueError):
    """An endpoint that is not ``http(s)://host:port``, or ``https`` without what TLS needs."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    host: str
    port: int
    secure: bool


def parse_endpoint(endpoint: str) -> Endpoint:
    """``http://host:port``, ``https://host:port`` or ``host:port`` (http); port 2379 if none."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise BadEndpoint(f"etcd endpoint {endpoint!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadEndpoint(f"etcd endpoint {endpoint!r} is not http(s)://host:port")
    return Endpoint(endpoint, parts.hostname, port, parts.scheme == "https")


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    parsed = parse_endpoint(endpoint)
    return parsed.host, parsed.port


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """Files for ``https://`` endpoints: the CA that signed the members' certificates (None:
    the system's), and a client certificate and key where etcd asks for one."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        if (self.cert_file is None) != (self.key_file is None):
            raise BadEndpoint("etcd TLS: give both a client certificate and its key, or neither")
        try:
            return grpc.ssl_channel_credentials(
                read(self.ca_file), read(self.key_file), read(self.cert_file)
            )
        except OSError as exc:
            raise BadEndpoint(f"etcd TLS: cannot read {exc.filename}: {exc.strerror}") from exc


class _Client(aetcd.Client):  # type: ignore[misc]
    """aetcd's client with a TLS channel where the endpoint is ``https``: aetcd 1.0 only opens
    plaintext channels. ``connect`` follows aetcd's own, with the channel swapped."""

    def __init__(self, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._credentials is None:
            await super().connect()
            return
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True  # type: ignore[has-type]
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(
                target, self._credentials, options=self._options.items()
            )
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", response.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


class _RevisionCompacted(Exception):
    """The watch's start revision is older than etcd's compacted history."""


class _Backoff:
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


# --- the client -------------------------------------------------------------------------------


_READS = frozenset({"range", "get", "get_prefix"})
"""Calls retried at once on the next member: they change nothing."""


def _make_client(
    endpoint: Endpoint,
    timeout_s: float,
    username: str | None,
    password: str | None,
    tls: EtcdTls | None,
) -> aetcd.Client:
    credentials = (tls or EtcdTls()).credentials() if endpoint.secure else None
    return _Client(
        credentials,
        host=endpoint.host,
        port=endpoint.port,
        username=username,
        password=password,
        timeout=timeout_s,
        options=_CHANNEL_OPTIONS,
    )


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
        all; ``MetadataUnavailable`` if none answers."""
        if not endpoints:
            raise BadEndpoint("no etcd endpoints configured")
        parsed = [parse_endpoint(endpoint) for endpoint in endpoints]
        clients = [_make_client(e, timeout_s, username, password, tls) for e in parsed]
        etcd = cls(clients, endpoints, timeout_s)
        failures: list[str] = []
        try:
            for index in range(len(clients)):
                etcd._current = index
                try:
                    await etcd._call_here("range", etcd._probe)
                except MetadataError as error:
                    failures.append(str(error))
                    continue
                return etcd
        except BaseException:
            await etcd.close()
            raise
        await etcd.close()
        tried = "; ".join(failures)
        raise MetadataUnavailable(f"no etcd endpoint answered within {timeout_s:g} s: {tried}")

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
        except (aetcd.ClientError, rpc.AioRpcError) as error:
            translated = _translate(error, f"{what} at {endpoint}")
            failed = not isinstance(translated, LeaseLost)  # an answer: the lease is gone
            raise translated from error
        finally:
            METRICS.etcd_call(what, time.perf_counter() - started, failed)

    async def _probe(self) -> Any:
        probe = b"/kafscale"
        return await self._client.get_range(probe, probe + b"\0")

    # --- key-value ---

    async def revision(self) -> int:
        """The store's current revision (one cheap read)."""
        response = await self._call("range", self._probe)
        return int(response.header.revision)

    async def get(self, key: str) -> KeyValue | None:
        raw = await self._call("get", lambda: self._client.get(key.encode()))
        return None if raw is None else _key_value(raw)

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
        return [_key_value(raw) for raw in response.kvs], int(response.header.revision)

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
            compare=[_compare_message(c) for c in compares],
            success=[_op_message(op) for op in success],
            failure=[_op_message(op) for op in failure],
        )
        # aetcd.Client.transaction() drops the header (the revision): call its KV stub directly.
        response = await self._call(
            "txn",
            lambda: self._client.kvstub.Txn(
                request, timeout=self.timeout_s, metadata=self._client.metadata
            ),
        )
        revision = int(response.header.revision)
        results = [_op_result(r, revision) for r in response.responses]
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

    async def watch_prefix(
        self, prefix: str, start_revision: int | None = None
    ) -> AsyncGenerator[WatchEvent, None]:
        """Every change under ``prefix`` from ``start_revision`` (None: from now), in order.

        Survives etcd restarts and connection loss: the watch is re-created with backoff from
        the last delivered revision + 1, so nothing is skipped or repeated. If that revision was
        compacted meanwhile, yields one ``RESYNC`` event whose ``mod_revision`` is the revision
        the watch continues after: reload with ``get_prefix`` (events that follow may already be
        reflected in the reload; their ``mod_revision`` tells). Ends when the client is closed.

        Like any async generator it starts on the first ``__anext__``, so "from now" means from
        then: to miss nothing, list with ``get_prefix_with_revision`` and watch from its
        revision + 1. Use it under ``contextlib.aclosing`` so the server-side watch is
        cancelled promptly when the caller stops early.
        """
        next_revision = start_revision
        resync = False
        backoff = _Backoff(_WATCH_BACKOFF_MIN_S, _WATCH_BACKOFF_MAX_S)
        while not self.closed:
            try:
                if next_revision is None or resync:
                    current = await self.revision()
                    if resync:
                        yield WatchEvent(WatchEventKind.RESYNC, prefix, b"", current)
                    next_revision, resync = current + 1, False
                async with contextlib.aclosing(self._watch(prefix, next_revision)) as events:
                    async for event in events:
                        backoff.reset()
                        next_revision = event.mod_revision + 1
                        yield event
                if self.closed:
                    return
                log.info("etcd watch on %s ended by the server; re-creating", prefix)
            except _RevisionCompacted:
                log.warning("etcd watch on %s: revision %s compacted", prefix, next_revision)
                resync = True
                continue
            except MetadataUnavailable as error:
                if self.closed:
                    return
                log.info("etcd watch on %s interrupted (%s); resuming", prefix, error)
            await self._pause(backoff.next_delay())

    async def _watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """One aetcd watch: events until its stream breaks (raises) or the client closes."""
        at = self._current
        try:
            watch = await self._call(
                "watch",
                lambda: self._client.watch_prefix(prefix.encode(), start_revision=start_revision),
            )
        except MetadataError as error:
            if isinstance(error.__cause__, aetcd.RevisionCompactedError):
                raise _RevisionCompacted() from error
            raise
        try:
            async for raw in watch:
                yield _watch_event(raw)
        except aetcd.RevisionCompactedError as error:
            raise _RevisionCompacted() from error
        except (aetcd.ClientError, rpc.AioRpcError) as error:
            translated = _translate(error, f"watch at {self._endpoints[at]}")
            if isinstance(translated, MetadataUnavailable):
                self._fail_over(at)
            raise translated from error
        finally:
            await self._cancel_watch(watch)

    async def _cancel_watch(self, watch: Any) -> None:
        """Best effort: the stream may already be gone, then there is nothing to cancel."""
        try:
            async with asyncio.timeout(_WATCH_CANCEL_TIMEOUT_S):
                await watch.cancel()
        except Exception as error:  # a dead stream or a closed client: nothing to cancel
            log.debug("cancelling etcd watch: %r", error)

    async def _pause(self, delay_s: float) -> None:
        """Sleep ``delay_s`` unless the client closes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._closed.wait()


# --- the session lease ------------------------------------------------------------------------


class SessionLease:
    """The broker's one session lease, kept alive every TTL/3 by a task this object owns.

    Every ownership key (partition and group leases, the broker registration) is bound to it,
    so a broker that dies loses everything within one TTL, and ``revoke()`` hands everything
    over at once. ``lost`` is set when etcd says the lease is gone, or when no keepalive has
    succeeded for a whole TTL (measured from when the last good one was sent, so it errs on
    the early side): from then on the broker must not act as owner. A lost lease is not
    renewed; start a new session. ``revoke()`` is a deliberate release and does not set ``lost``.
    """

    def __init__(self, etcd: Etcd, lease_id: int, ttl_s: int) -> None:
        self._etcd = etcd
        self._id = lease_id
        self._ttl_s = ttl_s
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, etcd: Etcd, ttl_s: int) -> SessionLease:
        loop = asyncio.get_running_loop()
        granted_at = loop.time()
        session = cls(etcd, await etcd.grant_lease(ttl_s), ttl_s)
        session._task = asyncio.create_task(
            session._keep_alive(granted_at + ttl_s), name=f"session-lease-{session.id:x}"
        )
        return session

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    async def revoke(self) -> None:
        """Stop the keepalive and revoke: every key bound to the lease is deleted at once."""
        await self._stop_keepalive()
        await self._etcd.revoke_lease(self._id)

    async def close(self) -> None:
        """Stop the keepalive; the lease then expires within its TTL."""
        await self._stop_keepalive()

    async def _stop_keepalive(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _keep_alive(self, valid_until: float) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl_s / 3
        retry = min(interval, 0.5)
        delay = interval
        try:
            while True:
                await asyncio.sleep(max(0.0, min(delay, valid_until - loop.time())))
                if loop.time() >= valid_until:
                    self._mark_lost(f"no keepalive succeeded for {self._ttl_s} s")
                    return
                sent_at = loop.time()
                try:
                    async with asyncio.timeout(valid_until - sent_at):
                        ttl = await self._etcd.refresh_lease(self._id)
                except LeaseLost as error:
                    self._mark_lost(str(error))
                    return
                except (MetadataError, TimeoutError) as error:
                    log.warning("session lease %x keepalive failed: %s", self._id, error)
                    delay = retry
                    continue
                valid_until, delay = sent_at + ttl, interval
        except Exception:
            log.exception("session lease %x keepalive crashed", self._id)
            self._mark_lost("keepalive crashed")

    def _mark_lost(self, reason: str) -> None:
        log.error("session lease %x lost: %s", self._id, reason)
        self.lost.set()
