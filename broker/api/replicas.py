"""ElectLeaders, AlterPartitionReassignments, ListPartitionReassignments: the replica APIs,
where a partition's one replica is its lease owner.

Durability is object storage, not replicas, and ownership is assigned and moved by the
brokers themselves (``ownership.py``, the assignment in etcd). So, as Metadata reports it, a
partition's replicas are its leader alone, and:

- an election is never needed while a broker can lead the partition (ELECTION_NOT_NEEDED, the
  answer Kafka gives when the preferred replica already leads); with no broker alive to lead
  it, a preferred election gets PREFERRED_LEADER_NOT_AVAILABLE and an unclean one
  ELIGIBLE_LEADERS_NOT_AVAILABLE, as Kafka's controller answers them;
- a reassignment is checked as Kafka checks it (the partition exists, one or more distinct
  registered brokers, the replication factor kept if v1 asks so), then accepted and complete at
  once: there is nothing to copy, the storage is shared. The new replica list collapses to the
  lease owner, as CreatePartitions' assignments do; the brokers keep balancing ownership;
- no reassignment is ever in progress: ListPartitionReassignments answers an empty list and a
  cancellation NO_REASSIGNMENT_IN_PROGRESS.

The decisions are pure functions of the topics' partition counts, the leader of each partition
and the registered broker ids, so the proxy answers AlterPartitionReassignments with them in
its own broker ids (``proxy/handlers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.replica_lists import check_replica_list
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

PREFERRED, UNCLEAN = 0, 1
CURRENT_REPLICATION_FACTOR = 1
"""Every partition's replication factor as CreateTopics and Metadata report it."""

Result = tuple[ErrorCode, str | None]
LeaderOf = Callable[[tuple[str, int]], int]


def _missing(counts: Mapping[str, int], topic: str, index: int) -> Result | None:
    """UNKNOWN_TOPIC_OR_PARTITION for a topic or partition that does not exist."""
    count = counts.get(topic)
    if count is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no such topic as {topic}"
    if not 0 <= index < count:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no such partition as {topic}-{index}"
    return None


def election_result(
    election_type: int, counts: Mapping[str, int], topic: str, index: int, leader: int
) -> Result:
    """One partition's answer to an election (``leader``: Metadata's leader, -1 for none)."""
    if missing := _missing(counts, topic, index):
        return missing
    if leader >= 0:
        return ErrorCode.ELECTION_NOT_NEEDED, f"broker {leader} leads {topic}-{index} already"
    message = (
        f"no live broker can lead {topic}-{index}: the first broker to start takes its lease "
        "on the first request for it, within the session TTL"
    )
    if election_type == PREFERRED:
        return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, message
    return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, message


def elect_leaders_body(request: Any, counts: Mapping[str, int], leader_of: LeaderOf) -> Body:
    """Kafka's answer: every named partition; with ``topic_partitions`` null every topic, with
    only the partitions where an election was needed (or failed)."""
    election_type = int(getattr(request, "election_type", PREFERRED))
    if election_type not in (PREFERRED, UNCLEAN):
        raise KafkaError(f"unknown election type {election_type}", ErrorCode.INVALID_REQUEST)
    every = request.topic_partitions is None
    if every:
        wanted = [(name, list(range(counts[name]))) for name in sorted(counts)]
    else:
        wanted = [(str(t.topic), [int(p) for p in t.partitions]) for t in request.topic_partitions]
    results = []
    for topic, partitions in wanted:
        entries = []
        for index in partitions:
            code, message = election_result(
                election_type, counts, topic, index, leader_of((topic, index))
            )
            if not (every and code == ErrorCode.ELECTION_NOT_NEEDED):
                entries.append(
                    {"partition_id": index, "error_code": code, "error_message": message}
                )
        results.append({"topic": topic, "partition_result": entries})
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "replica_election_results": results}


def reassignment_result(
    counts: Mapping[str, int],
    topic: str,
    index: int,
    replicas: list[int] | None,
    registered: Collection[int],
    allow_replication_factor_change: bool,
) -> Result:
    """One partition's answer to a reassignment (``replicas`` None: cancel one)."""
    if missing := _missing(counts, topic, index):
        return missing
    if replicas is None:
        return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is in progress"
    try:
        check_replica_list(replicas, set(registered))
    except KafkaError as exc:
        return exc.code, str(exc)
    if not allow_replication_factor_change and len(replicas) != CURRENT_REPLICATION_FACTOR:
        return ErrorCode.INVALID_REPLICATION_FACTOR, (
            f"the replication factor of {topic}-{index} would change from "
            f"{CURRENT_REPLICATION_FACTOR} to {len(replicas)}, and the request does not allow it"
        )
    return ErrorCode.NONE, None


def alter_reassignments_body(
    request: Any, counts: Mapping[str, int], registered: Collection[int]
) -> Body:
    allow = bool(getattr(request, "allow_replication_factor_change", True))
    responses = []
    for topic in request.topics:
        partitions = []
        for partition in topic.partitions:
            replicas = None if partition.replicas is None else [int(b) for b in partition.replicas]
            code, message = reassignment_result(
                counts, str(topic.name), int(partition.partition_index), replicas, registered, allow
            )
            partitions.append(
                {
                    "partition_index": int(partition.partition_index),
                    "error_code": code,
                    "error_message": message,
                }
            )
        responses.append({"name": str(topic.name), "partitions": partitions})
    return {
        "throttle_time": 0,
        "allow_replication_factor_change": allow,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "responses": responses,
    }


def list_reassignments_body() -> Body:
    """Nothing is ever being reassigned: a reassignment completes when it is accepted. Named
    topics and partitions that do not exist are left out too, as Kafka leaves them out."""
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "topics": []}


def partition_counts(ctx: RequestContext) -> dict[str, int]:
    return {name: info.partitions for name, info in ctx.broker.view.topics.items()}


async def handle_elect_leaders(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.ALTER, access.CLUSTER)
    return elect_leaders_body(request, partition_counts(ctx), ctx.broker.leader_for)


async def handle_alter_partition_reassignments(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.ALTER, access.CLUSTER)
    return alter_reassignments_body(request, partition_counts(ctx), ctx.broker.view.brokers)


async def handle_list_partition_reassignments(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.DESCRIBE, access.CLUSTER)
    return list_reassignments_body()
