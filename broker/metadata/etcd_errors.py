"""What can go wrong talking to etcd, as our exceptions, and the one map from aetcd's.

Callers tell an outage (``MetadataUnavailable``: answer REQUEST_TIMED_OUT, or exit non-zero at
start-up) from a refusal (``MetadataError``), a full etcd (``MetadataNoSpace``) and a lost
lease (``LeaseLost``: stop acting as owner) without knowing aetcd's or gRPC's error classes;
``translate_error`` is where those are read, once.
"""

from __future__ import annotations

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


class LeaseLost(MetadataError):
    """The lease no longer exists in etcd (expired or revoked): stop acting as its owner."""


def _grpc_code(error: BaseException) -> Any:
    for candidate in (error, error.__cause__):
        if isinstance(candidate, rpc.AioRpcError):
            return candidate.code()
    return None


def translate_error(error: BaseException, what: str) -> MetadataError:
    """Map aetcd/gRPC errors onto ours: outage, lease gone, or refusal."""
    message = f"etcd {what} failed: {error}"
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
    if code == rpc.StatusCode.NOT_FOUND and "lease not found" in str(error):
        return LeaseLost(message)
    return MetadataError(message)
