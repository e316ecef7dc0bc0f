"""Reaching a consumer group from a request: the coordinator, the group's runtime, the peer.

Shared by every group API (classic membership, offsets, the consumer protocol, TxnOffsetCommit).
A group is served only by the broker that coordinates it: NOT_COORDINATOR otherwise, and when
etcd cannot be reached the code the calling API's clients retry on, never a guess.
"""

from __future__ import annotations

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.groups.coordinator import GroupCoordinator
from kafscale.broker.groups.runtime import GroupRuntime
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

READ, DESCRIBE, DELETE = Operation.READ, Operation.DESCRIBE, Operation.DELETE


def coordinator(ctx: RequestContext) -> GroupCoordinator:
    """This broker's group coordinator; COORDINATOR_NOT_AVAILABLE while it is not running."""
    group_coordinator = ctx.broker.groups
    if group_coordinator is None:
        raise KafkaError(
            "the group coordinator is not running", ErrorCode.COORDINATOR_NOT_AVAILABLE
        )
    return group_coordinator


async def group_runtime(
    ctx: RequestContext, group_id: str, unavailable: ErrorCode, operation: Operation = READ
) -> GroupRuntime:
    """The group as coordinated here; KafkaError (GROUP_AUTHORIZATION_FAILED unless the
    principal may do ``operation`` to the group, NOT_COORDINATOR, ``unavailable``) if not."""
    access.require(ctx, operation, access.GROUP, group_id)
    try:
        return await coordinator(ctx).runtime(group_id)
    except MetadataUnavailable as exc:
        raise KafkaError(str(exc), unavailable) from exc


def client_host(ctx: RequestContext) -> str:
    """The peer's host as Kafka shows it in group descriptions (``/127.0.0.1``)."""
    host = ctx.connection.peer.rpartition(":")[0] or ctx.connection.peer
    return "/" + host.strip("[]")
