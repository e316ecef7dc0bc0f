"""The handlers' one way to ask whether the connection's principal may do something.

A thin shell over the pure ``authz.authorizer``: it takes the principal and host from the
connection, the ACLs from the broker's watched cache and the policy from the settings. With
authorization off (the default) everything is allowed, as before there were ACLs.
"""

from __future__ import annotations

from kafscale.broker.api.dispatch import RequestContext
from kafscale.broker.authz.authorizer import Access, Policy, authorize, authorize_any_resource
from kafscale.broker.authz.model import CLUSTER_NAME, Operation, ResourceType
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
GROUP_CONFIG_RESOURCE = 32
"""A group in the config APIs (``ConfigResource.Type.GROUP``), not the ACL resource type."""
CLUSTER = ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID

# What can be done to each resource type (Kafka's ``AclEntry.supportedOperations``): the
# candidates of the ``authorized_operations`` bit fields Metadata, DescribeCluster and
# DescribeGroups return when asked.
TOPIC_OPS = (
    Operation.READ,
    Operation.WRITE,
    Operation.CREATE,
    Operation.DESCRIBE,
    Operation.DELETE,
    Operation.ALTER,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
)
GROUP_OPS = (
    Operation.READ,
    Operation.DESCRIBE,
    Operation.DELETE,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
)  # the configs ones since Kafka 4.0 (KIP-848's group configs)
CLUSTER_OPS = (
    Operation.CREATE,
    Operation.CLUSTER_ACTION,
    Operation.DESCRIBE_CONFIGS,
    Operation.ALTER_CONFIGS,
    Operation.IDEMPOTENT_WRITE,
    Operation.ALTER,
    Operation.DESCRIBE,
)
OPERATIONS_OMITTED = -(2**31)
"""What an ``authorized_operations`` field holds when the client did not ask for it."""

DENIED_CODES = {
    TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}


def enabled(ctx: RequestContext) -> bool:
    return ctx.broker.settings.authorizer.enabled


def _policy(ctx: RequestContext) -> Policy:
    settings = ctx.broker.settings.authorizer
    return Policy(frozenset(settings.super_users), settings.allow_everyone_if_no_acl_found)


def client_host(ctx: RequestContext) -> str:
    """The client's address as ACL hosts name it (no port, no brackets)."""
    peer = ctx.connection.peer
    return (peer.rpartition(":")[0] or peer).strip("[]")


def allowed(
    ctx: RequestContext, operation: Operation, resource_type: ResourceType, name: str
) -> bool:
    if not enabled(ctx):
        return True
    access = Access(ctx.connection.principal, client_host(ctx), operation, resource_type, name)
    covering = ctx.broker.view.acls.index.covering(resource_type, name)
    return authorize(access, covering, _policy(ctx))


def allowed_on_cluster(ctx: RequestContext, operation: Operation) -> bool:
    return allowed(ctx, operation, CLUSTER, CLUSTER_NAME)


def allowed_on_any(ctx: RequestContext, operation: Operation, resource_type: ResourceType) -> bool:
    """Whether some resource of the type allows it (Kafka's ``authorizeByResourceType``)."""
    if not enabled(ctx):
        return True
    return authorize_any_resource(
        ctx.connection.principal,
        client_host(ctx),
        operation,
        resource_type,
        ctx.broker.view.acls.index.of_type(resource_type),
        _policy(ctx),
    )


def may_create_topic(ctx: RequestContext, topic: str) -> bool:
    """CREATE on the cluster or on the topic, as Kafka asks of CreateTopics and auto-creation."""
    return allowed_on_cluster(ctx, Operation.CREATE) or allowed(ctx, Operation.CREATE, TOPIC, topic)


def topic_denied(ctx: RequestContext, operation: Operation, topic: str) -> ErrorCode | None:
    """TOPIC_AUTHORIZATION_FAILED if ``operation`` on ``topic`` is denied, else None."""
    if allowed(ctx, operation, TOPIC, topic):
        return None
    return ErrorCode.TOPIC_AUTHORIZATION_FAILED


def authorized_operations(
    ctx: RequestContext,
    resource_type: ResourceType,
    name: str,
    candidates: tuple[Operation, ...],
) -> int:
    """Kafka's ``authorized_operations`` bit field: bit ``op`` set for each allowed one."""
    return sum(1 << op for op in candidates if allowed(ctx, op, resource_type, name))


def operations_if_asked(
    ctx: RequestContext, asked: bool, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> int:
    """The bit field of ``resource_type``'s operations the principal may do, if ``asked``."""
    if not asked:
        return OPERATIONS_OMITTED
    candidates = {TOPIC: TOPIC_OPS, GROUP: GROUP_OPS, CLUSTER: CLUSTER_OPS}[resource_type]
    return authorized_operations(ctx, resource_type, name, candidates)


def require_config(
    ctx: RequestContext, operation: Operation, config_resource_type: int, name: str
) -> None:
    """``require`` for a config resource: a topic (type 2) or a group (type 32) is itself,
    anything else (a broker, its loggers) is the cluster, as Kafka authorizes config APIs."""
    if config_resource_type == TOPIC:
        require(ctx, operation, TOPIC, name)
    elif config_resource_type == GROUP_CONFIG_RESOURCE:
        require(ctx, operation, GROUP, name)
    else:
        require(ctx, operation, CLUSTER)


def require(
    ctx: RequestContext,
    operation: Operation,
    resource_type: ResourceType,
    name: str = CLUSTER_NAME,
) -> None:
    """Raise Kafka's authorization error for the resource type unless allowed: for requests
    about one resource, whose error answer the dispatcher then builds."""
    if not allowed(ctx, operation, resource_type, name):
        raise KafkaError(
            f"{ctx.connection.principal} may not {operation.name} {resource_type.name} {name}",
            DENIED_CODES[resource_type],
        )
