"""CreateAcls, DescribeAcls and DeleteAcls, as Kafka's admin clients call them.

As in Kafka: without an authorizer (``authorizer.enabled`` false) all three answer
SECURITY_DISABLED; creating and deleting need ALTER on the cluster, describing needs DESCRIBE
on it (CLUSTER_AUTHORIZATION_FAILED otherwise); a binding or filter Kafka refuses gets
INVALID_REQUEST with a message. Describe and delete read etcd afresh (not the watched cache the
authorizer uses): a client that just created an ACL sees it, and a delete removes exactly what
is stored now.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import (
    AclBinding,
    AclFilter,
    InvalidBinding,
    Operation,
    binding_of,
    filter_matches,
    filter_of,
)
from kafscale.broker.authz.store import create_bindings, delete_matching, stored_bindings
from kafscale.broker.protocol.errors import ErrorCode, KafkaError


def _check_enabled(ctx: RequestContext, operation: Operation) -> None:
    if not access.enabled(ctx):
        raise KafkaError("no authorizer is enabled on the broker", ErrorCode.SECURITY_DISABLED)
    access.require(ctx, operation, access.CLUSTER)


# --- CreateAcls -------------------------------------------------------------------------------


async def handle_create_acls(request: Any, ctx: RequestContext) -> Body:
    _check_enabled(ctx, Operation.ALTER)
    results: list[Body] = []
    valid: list[AclBinding] = []
    for creation in request.creations:
        try:
            valid.append(_binding(creation))
            results.append({"error_code": ErrorCode.NONE, "error_message": None})
        except InvalidBinding as exc:
            results.append({"error_code": ErrorCode.INVALID_REQUEST, "error_message": str(exc)})
    await create_bindings(ctx.broker.etcd, ctx.broker.cluster, valid)
    return {"throttle_time": 0, "results": results}


def _binding(creation: Any) -> AclBinding:
    return binding_of(
        int(creation.resource_type),
        creation.resource_name,
        int(getattr(creation, "resource_pattern_type", 3)),
        creation.principal,
        creation.host,
        int(creation.operation),
        int(creation.permission_type),
    )


# --- DescribeAcls -----------------------------------------------------------------------------


async def handle_describe_acls(request: Any, ctx: RequestContext) -> Body:
    _check_enabled(ctx, Operation.DESCRIBE)
    try:
        acl_filter = _filter(request)
    except InvalidBinding as exc:
        raise KafkaError(str(exc), ErrorCode.INVALID_REQUEST) from exc
    stored = await stored_bindings(ctx.broker.etcd, ctx.broker.cluster)
    found = [b for b in stored.values() if filter_matches(acl_filter, b)]
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "resources": describe_resources(found),
    }


def _filter(wire: Any) -> AclFilter:
    return filter_of(
        int(wire.resource_type_filter),
        wire.resource_name_filter,
        int(getattr(wire, "pattern_type_filter", 3)),
        wire.principal_filter,
        wire.host_filter,
        int(wire.operation),
        int(wire.permission_type),
    )


def describe_resources(bindings: Iterable[AclBinding]) -> list[Body]:
    """Bindings grouped by resource pattern, as DescribeAcls answers them."""

    def resource(b: AclBinding) -> tuple[int, str, int]:
        return int(b.resource_type), b.resource_name, int(b.pattern_type)

    return [
        {
            "resource_type": resource_type,
            "resource_name": name,
            "pattern_type": pattern_type,
            "acls": [_description(b) for b in group],
        }
        for (resource_type, name, pattern_type), group in groupby(
            sorted(bindings, key=lambda b: (resource(b), b)), key=resource
        )
    ]


def _description(b: AclBinding) -> Body:
    return {
        "principal": b.principal,
        "host": b.host,
        "operation": int(b.operation),
        "permission_type": int(b.permission),
    }


# --- DeleteAcls -------------------------------------------------------------------------------


async def handle_delete_acls(request: Any, ctx: RequestContext) -> Body:
    _check_enabled(ctx, Operation.ALTER)
    parsed: list[AclFilter | InvalidBinding] = []
    for wire in request.filters:
        try:
            parsed.append(_filter(wire))
        except InvalidBinding as exc:
            parsed.append(exc)
    filters = [f for f in parsed if isinstance(f, AclFilter)]
    matched = iter(await delete_matching(ctx.broker.etcd, ctx.broker.cluster, filters))
    results = []
    for item in parsed:
        if isinstance(item, InvalidBinding):
            results.append(
                {
                    "error_code": ErrorCode.INVALID_REQUEST,
                    "error_message": str(item),
                    "matching_acls": [],
                }
            )
        else:
            results.append(
                {
                    "error_code": ErrorCode.NONE,
                    "error_message": None,
                    "matching_acls": [_matching(b) for b in next(matched)],
                }
            )
    return {"throttle_time": 0, "filter_results": results}


def _matching(b: AclBinding) -> Body:
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "resource_type": int(b.resource_type),
        "resource_name": b.resource_name,
        "pattern_type": int(b.pattern_type),
        **_description(b),
    }
