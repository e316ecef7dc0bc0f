"""WriteTxnMarkers (API 27) through the proxy: each marker's partitions to their owners.

Clients seldom send it (transaction coordinators are brokers and reach owners directly), but
admin tools do: ``kafka-transactions.sh abort`` ends a hanging transaction by sending its abort
marker to the partition's leader, which behind the proxy is the proxy. A request carries several
markers, each with topics and partitions; like Produce it is cut into one request per owning
broker (each marker keeping only that broker's partitions, markers left empty dropped), and the
answers are put back in the client's order. A partition with no live owner, or whose owner
cannot be reached, is answered NOT_LEADER_OR_FOLLOWER (the sender routes again and retries, as
with a moved lease); one whose owner refused the proxy's Envelope, CLUSTER_AUTHORIZATION_FAILED.

``split_markers`` and ``merge_markers`` are pure; ``forward_markers`` is the I/O shell.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy import split
from kafscale.broker.proxy.upstream import ForwardingRefused

# A marker's topics as a partitioned list (partition numbers, answers with partition_index).
MARKER = split.PartitionedApi(
    "topics", "name", "partition_indexes", "", "topics", "name", "partitions", "partition_index"
)

MarkerPartition = tuple[int, str, int]  # (marker's index in the request, topic, partition)


@dataclass(frozen=True, slots=True)
class MarkerPart:
    """One broker's share of the request, and which request marker each of its markers is."""

    request: Any
    marker_indexes: tuple[int, ...]


def split_markers(request: Any, route: Callable[[split.TopicPartition], int]) -> dict[int, Any]:
    """One :class:`MarkerPart` per broker that ``route`` names (-1: partitions with no live
    owner), markers and partitions in the request's order."""
    per_broker: dict[int, list[tuple[int, Any]]] = {}
    for index, marker in enumerate(request.markers):
        for broker, part in split.split_request(marker, MARKER, route).items():
            per_broker.setdefault(broker, []).append((index, part))
    return {
        broker: MarkerPart(
            dataclasses.replace(request, markers=tuple(m for _, m in items)),
            tuple(i for i, _ in items),
        )
        for broker, items in per_broker.items()
    }


def part_results(part: MarkerPart, response: Any) -> dict[MarkerPartition, int]:
    """A broker's answer to its part, by (request marker index, topic, partition)."""
    results: dict[MarkerPartition, int] = {}
    for index, marker in zip(part.marker_indexes, response.markers, strict=False):
        for tp, answer in split.response_partitions(marker, MARKER):
            results[(index, *tp)] = int(answer.error_code)
    return results


def failed_results(part: MarkerPart, code: ErrorCode) -> dict[MarkerPartition, int]:
    """Every partition of ``part`` answered ``code``."""
    return {
        (index, *tp): int(code)
        for index, marker in zip(part.marker_indexes, part.request.markers, strict=True)
        for tp in split.requested_partitions(marker, MARKER)
    }


def merge_markers(request: Any, results: Mapping[MarkerPartition, int]) -> dict[str, Any]:
    """The response body: a result per request marker, its topics and partitions in the
    request's order (a partition nobody answered: NOT_LEADER_OR_FOLLOWER)."""
    markers = []
    for index, marker in enumerate(request.markers):
        topics: dict[str, list[dict[str, int]]] = {}
        for topic, partition in split.requested_partitions(marker, MARKER):
            code = results.get((index, topic, partition), int(ErrorCode.NOT_LEADER_OR_FOLLOWER))
            topics.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
        markers.append(
            {
                "producer_id": marker.producer_id,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()],
            }
        )
    return {"markers": markers}


def outcome_results(part: MarkerPart, outcome: Any, api_version: int) -> dict[MarkerPartition, int]:
    """The results of one forwarded part from its future's outcome (a body or an exception)."""
    if isinstance(outcome, ForwardingRefused):
        return failed_results(part, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    if isinstance(outcome, BaseException):
        return failed_results(part, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    try:
        response = codec.decode_response(outcome, 27, api_version)
    except Exception:  # kio raises its own errors: an unreadable answer, routed again
        return failed_results(part, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    return part_results(part, response)


async def forward_markers(
    send: Callable[[list[tuple[int, Any]]], Any],
    encode: Callable[[Any], Any],
    request: Any,
    route: Callable[[split.TopicPartition], int],
    api_version: int,
) -> dict[str, Any]:
    """Split ``request`` by owner, ``send`` the encoded parts (a list of response futures back),
    and merge the answers."""
    parts = split_markers(request, route)
    parts.pop(-1, None)  # no live owner: NOT_LEADER_OR_FOLLOWER in the merge
    brokers = list(parts)
    futures = await send([(broker, encode(parts[broker].request)) for broker in brokers])
    outcomes = await asyncio.gather(*futures, return_exceptions=True)
    results: dict[MarkerPartition, int] = {}
    for broker, outcome in zip(brokers, outcomes, strict=True):
        results.update(outcome_results(parts[broker], outcome, api_version))
    return merge_markers(request, results)
