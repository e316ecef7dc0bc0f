"""What can go wrong talking to etcd, as our exceptions, and the one map from aetcd's.

Callers tell an outage (``MetadataUnavailable``: answer REQUEST_TIMED_OUT, or exit non-zero at
start-up) from a refusal (``MetadataError``), a full etcd (``MetadataNoSpace``) and a lost
lease (``LeaseLost``: stop acting as owner) without knowing aetcd's or gRPC's error classes;
``translate_error`` is where those are read, once. ``unreachable_reason`` says in a few words
why a member could not be reached, for the one-line message of a process that cannot start.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd
from aetcd import rpc

from kafscale.broker.metadata.etcd_watcher import WatchCancelled

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


class MetadataError(Exception):
    """etcd refused a request (a bug or misuse, not an outage)."""


class MetadataUnavailable(MetadataError):
    """etcd could not be reached or did not answer within the configured timeout."""


class MetadataNoSpace(MetadataUnavailable):
    """etcd raised its NOSPACE alarm (its space quota is used up): it refuses every write
    until history is compacted, the database defragmented and the alarm disarmed, which the
    brokers' compactor does (``compaction``)."""


class MetadataTokenExpired(MetadataUnavailable):
    """etcd no longer accepts the client's auth token (``invalid auth token``; seen after the
    client's role lost and regained its permission across an etcd restart). The client
    authenticates again (``Etcd``); until then it is an outage like any other."""


class LeaseLost(MetadataError):
    """The lease no longer exists in etcd (expired or revoked): stop acting as its owner."""


def _grpc_code(error: BaseException) -> Any:
    for candidate in (error, error.__cause__):
        if isinstance(candidate, rpc.AioRpcError):
            return candidate.code()
    return None


def translate_error(error: BaseException, what: str) -> MetadataError:
    """Map aetcd/gRPC errors onto ours: outage, lease gone, or refusal."""
    message = f"etcd {what} failed: {_one_line(error)}"
    if isinstance(
        error,
        aetcd.ConnectionFailedError
        | aetcd.ConnectionTimeoutError
        | aetcd.WatchTimeoutError
        | WatchCancelled,  # a watch etcd dropped: re-create it from its last revision
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
    if "invalid auth token" in str(error):
        return MetadataTokenExpired(message)
    if code == rpc.StatusCode.NOT_FOUND and "lease not found" in str(error):
        return LeaseLost(message)
    return MetadataError(message)


def _one_line(error: BaseException) -> str:
    """The error's text for our message. gRPC's own error prints as a block of lines (status,
    details, debug string), which made a log line of five ("offset retention check: etcd
    range ... failed: <AioRpcError of RPC that terminated with: ..."); its details alone say
    what etcd said ("etcdserver: permission denied"), as aetcd's errors do."""
    if isinstance(error, rpc.AioRpcError):
        return str(error.details() or error.code().name)
    return str(error)


def cut_off_by_channel_close(task: asyncio.Task[Any] | None) -> bool:
    """Whether a ``CancelledError`` that reached ``task`` from an etcd call means the call was
    cut off (its gRPC channel closed under it), not that ``task`` is being cancelled.

    grpc.aio raises ``CancelledError`` in whoever awaits a call its channel's ``close()``
    cancelled, and a client's channel is closed while others use it (``Etcd._reauthenticate``
    after etcd restarted and forgot our token). Raised as it is, it ended the caller as if
    cancelled: the cluster view's watch tasks ended silently and the view never followed etcd
    again (``/readyz`` 503 until a restart). Nobody asked ``task`` to stop when its
    ``cancelling()`` count is 0 (``asyncio.timeout`` turns its own into ``TimeoutError``)."""
    return task is not None and task.cancelling() == 0


_REASON_MAX_CHARS = 200

_REASONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("connection refused",), "connection refused"),
    (
        (
            "domain name not found",
            "dns resolution failed",
            "errors resolving",
            "name or service not known",
            "hostname lookup",
        ),
        "host name not resolved",
    ),
    (("connection reset",), "connection reset"),
    (("authentication failed", "invalid auth token", "permission denied"), "authentication failed"),
    (("ssl", "handshake", "certificate"), "TLS handshake failed"),
)
"""Words of gRPC's and etcd's error texts and what they mean to an operator. gRPC says
UNAVAILABLE for a refused connection and an unresolved name alike: only its text tells them
apart."""


def unreachable_reason(error: BaseException, timeout_s: float) -> str:
    """Why one etcd member could not be used, in a few words: connection refused, host name
    not resolved, no answer within ``timeout_s``, ...; otherwise the error's own text on one
    line. (Before, every failure read "no etcd endpoint answered within 5 s", a refusal that
    came at once too.)"""
    chain = _causes(error)
    if any(isinstance(e, TimeoutError) for e in chain):
        return f"no answer within {timeout_s:g} s"
    text = " ".join(str(e) for e in chain).lower()
    if "deadline exceeded" in text or "timed out" in text:
        return f"no answer within {timeout_s:g} s"
    for words, reason in _REASONS:
        if any(word in text for word in words):
            return reason
    cause = chain[1] if len(chain) > 1 else error  # aetcd's text, without our "etcd range at"
    return " ".join(str(cause).split())[:_REASON_MAX_CHARS] or type(cause).__name__


def _causes(error: BaseException) -> list[BaseException]:
    """``error`` and what it was raised from, outermost first (bounded: a cycle ends it)."""
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain
