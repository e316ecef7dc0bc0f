"""Writing a transaction's commit or abort markers: WriteTxnMarkers to each partition's owner.

The coordinator does not write partitions itself (one writer per partition, DESIGN §3.3): it
asks each partition's current owner, over the Kafka protocol (API 27, v1), to append the
control batch through that owner's fenced flush path. Owners come from the cluster view, the
same routing Metadata gives clients. A partition answered NOT_LEADER_OR_FOLLOWER (the lease
moved), an unreachable owner or any other failure is routed again and retried until every
partition has its marker: a decided transaction is never left half written. A partition of a
topic that no longer exists needs no marker, nor one that answers INVALID_PRODUCER_EPOCH or
TRANSACTION_COORDINATOR_FENCED (a newer epoch already ended the producer's transaction there).

The connections to owners are the broker's :class:`InterBrokerClient` (one per owner, over the
security of the listener it reaches, ``inter_broker.*``), so an internal listener that needs mTLS
or SASL gets its markers too. Partitions the coordinator's own broker owns are written in place
(``here``: no connection to itself, so no login to itself), as its partition checks are.

``plan_markers`` and ``settled`` are the pure halves; ``MarkerWriter`` is the I/O shell.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.transactions.inter_broker_client import InterBrokerClient
from kafscale.broker.transactions.state import TopicPartition

log = logging.getLogger(__name__)

WRITE_TXN_MARKERS = 27
WRITE_TXN_MARKERS_VERSION = 1
_FIRST_BACKOFF_S = 0.02
_MAX_BACKOFF_S = 1.0


@dataclass(frozen=True, slots=True)
class Marker:
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


class Routing(Protocol):
    """What the writer needs from its broker: partition owners and broker addresses."""

    def leader_for(self, tp: TopicPartition) -> int: ...

    def broker(self, node_id: int) -> BrokerInfo | None: ...

    def topic_exists(self, topic: str) -> bool: ...


def plan_markers(
    partitions: Iterable[TopicPartition], owner_of: Callable[[TopicPartition], int]
) -> dict[int, list[TopicPartition]]:
    """Partitions grouped by their owner's node id (-1: no live owner now)."""
    plan: dict[int, list[TopicPartition]] = {}
    for tp in sorted(partitions):
        plan.setdefault(owner_of(tp), []).append(tp)
    return plan


def request_body(marker: Marker, partitions: list[TopicPartition]) -> dict[str, Any]:
    topics = [
        {"name": topic, "partition_indexes": [p for _, p in group]}
        for topic, group in itertools.groupby(sorted(partitions), key=lambda tp: tp[0])
    ]
    return {
        "markers": [
            {
                "producer_id": marker.producer_id,
                "producer_epoch": marker.producer_epoch,
                "transaction_result": marker.commit,
                "topics": topics,
                "coordinator_epoch": marker.coordinator_epoch,
            }
        ]
    }


def partition_errors(response: Any) -> dict[TopicPartition, ErrorCode]:
    errors: dict[TopicPartition, ErrorCode] = {}
    for result in response.markers:
        for topic in result.topics:
            for part in topic.partitions:
                errors[(str(topic.name), int(part.partition_index))] = _code(part.error_code)
    return errors


def _code(value: Any) -> ErrorCode:
    try:
        return ErrorCode(int(value))
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def settled(
    errors: Mapping[TopicPartition, ErrorCode], topic_exists: Callable[[str], bool]
) -> set[TopicPartition]:
    """The partitions whose marker is written, or that need none: their topic is gone, or the
    partition has moved past this marker (a newer producer epoch or coordinator epoch wrote
    there: the transaction was superseded, as Kafka's coordinator then stops sending it)."""
    gone = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return {
        tp
        for tp, code in errors.items()
        if code in SUPERSEDED or (code is gone and not topic_exists(tp[0]))
    }


SUPERSEDED = frozenset(
    {ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED}
)


WriteHere = Callable[[Marker, list[TopicPartition]], Awaitable[dict[TopicPartition, ErrorCode]]]
"""Appends a marker to partitions this broker owns: their codes (``api/txn_partitions``)."""


class MarkerWriter:
    def __init__(
        self,
        routing: Routing,
        client: InterBrokerClient,
        node_id: int = -1,
        here: WriteHere | None = None,
    ) -> None:
        """``node_id`` and ``here``: this broker, and how it writes markers to its own
        partitions (None: over the network like any other owner)."""
        self._routing = routing
        self._client = client
        self._node_id = node_id
        self._here = here

    async def write(self, marker: Marker, partitions: Iterable[TopicPartition]) -> None:
        """Return once every partition has the marker; retries forever (cancel to stop).

        A run of failed rounds is logged once, then summarised (``retry_log``), not once a
        round: an owner unreachable for minutes wrote a WARNING about a second. Owners that
        cannot be reached are one run (WARNING); partitions that answered an error to retry
        (a lease moving) another (INFO)."""
        what = f"producer {marker.producer_id} epoch {marker.producer_epoch}"
        unreachable = RetryLog(log, f"cannot write txn markers of {what}")
        refused = RetryLog(log, f"txn markers of {what} to retry", level=logging.INFO)
        remaining = set(partitions)
        backoff = _FIRST_BACKOFF_S
        while remaining:
            remaining = {tp for tp in remaining if self._routing.topic_exists(tp[0])}
            plan = plan_markers(remaining, self._routing.leader_for)
            rounds = await asyncio.gather(
                *(self._write_at(owner, marker, tps) for owner, tps in plan.items())
            )
            for result in rounds:
                remaining -= result.done
            _note(unreachable, {o: r.failure for o, r in zip(plan, rounds, strict=True)})
            _note(refused, {o: r.refused for o, r in zip(plan, rounds, strict=True)})
            if remaining:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _write_at(
        self, owner: int, marker: Marker, partitions: list[TopicPartition]
    ) -> OwnerRound:
        broker = self._routing.broker(owner) if owner >= 0 else None
        if broker is None:
            return OwnerRound(set())
        try:
            async with asyncio.timeout(self._client.timeout_s):
                if owner == self._node_id and self._here is not None:
                    errors = await self._here(marker, partitions)
                else:
                    response = await self._client.call(
                        broker,
                        WRITE_TXN_MARKERS,
                        WRITE_TXN_MARKERS_VERSION,
                        request_body(marker, partitions),
                    )
                    errors = partition_errors(response)
        except Exception as exc:  # unreachable, timed out, closed (API not served): retry
            return OwnerRound(set(), failure=repr(exc))
        done = settled(errors, self._routing.topic_exists)
        refused = {tp: code.name for tp, code in errors.items() if tp not in done}
        return OwnerRound(done, refused=str(refused) if refused else None)


@dataclass(frozen=True, slots=True)
class OwnerRound:
    """One owner's part of a round: the partitions settled, and what went wrong, if anything
    (``failure``: the owner could not be reached; ``refused``: partitions to retry)."""

    done: set[TopicPartition]
    failure: str | None = None
    refused: str | None = None


def _note(retries: RetryLog, problems: Mapping[int, str | None]) -> None:
    """One round's outcome for a run of failures: any owner's problem fails it, none ends it."""
    failed = {owner: problem for owner, problem in problems.items() if problem is not None}
    if failed:
        retries.failed("; ".join(f"at broker {owner}: {p}" for owner, p in failed.items()))
    else:
        retries.succeeded()
