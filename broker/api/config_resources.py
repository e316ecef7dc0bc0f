"""ListConfigResources (KIP-1142, Kafka 4.1; v0 was KIP-1000's ListClientMetricsResources):
the resources whose configs DescribeConfigs can be asked for.

v0 lists client-metrics resources only, and KafScale has none. v1 takes a filter of resource
types (empty: every supported type): topics (type 2) are every topic; brokers (4) the live
brokers' ids, as Metadata lists them (the proxy lists its own ids); broker loggers (8),
client metrics (16) are empty: KafScale has no dynamic logger levels or client-metrics
subscriptions; groups (32) are the groups that have their own configs (KIP-848). A type
outside Kafka's set gets UNSUPPORTED_VERSION, as Kafka answers it. DESCRIBE_CONFIGS on the
cluster is required, as for Kafka.

The answer is a pure function of the topic names, broker ids and configured groups, shared
with the proxy.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode, KafkaError

TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP = 2, 4, 8, 16, 32
SUPPORTED_TYPES = (TOPIC, BROKER, BROKER_LOGGER, CLIENT_METRICS, GROUP)


def config_resources(
    version: int,
    resource_types: Iterable[int],
    topics: Iterable[str],
    broker_ids: Iterable[int],
    groups: Iterable[str] = (),
) -> list[Body]:
    """The resources of the requested types (raises UNSUPPORTED_VERSION for an unknown one)."""
    if version == 0:
        return []  # client metrics only: there are none
    wanted = [int(t) for t in resource_types] or list(SUPPORTED_TYPES)
    unknown = sorted(set(wanted) - set(SUPPORTED_TYPES))
    if unknown:
        raise KafkaError(f"unsupported resource types {unknown}", ErrorCode.UNSUPPORTED_VERSION)
    resources: list[Body] = []
    if TOPIC in wanted:
        resources += [{"resource_name": name, "resource_type": TOPIC} for name in sorted(topics)]
    if BROKER in wanted:
        resources += [
            {"resource_name": str(node), "resource_type": BROKER} for node in sorted(broker_ids)
        ]
    if GROUP in wanted:
        resources += [{"resource_name": name, "resource_type": GROUP} for name in sorted(groups)]
    return resources


def list_config_resources_body(
    request: Any,
    version: int,
    topics: Iterable[str],
    broker_ids: Iterable[int],
    groups: Iterable[str] = (),
) -> Body:
    types = getattr(request, "resource_types", ())
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "config_resources": config_resources(version, types, topics, broker_ids, groups),
    }


async def handle_list_config_resources(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.DESCRIBE_CONFIGS, access.CLUSTER)
    view = ctx.broker.view
    return list_config_resources_body(
        request, ctx.api_version, view.topics, view.brokers, view.group_configs
    )
