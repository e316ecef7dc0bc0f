"""DescribeClientQuotas (48) and AlterClientQuotas (49): Kafka's admin API for client quotas.

What ``kafka-configs --alter --add-config producer_byte_rate=... --entity-type users`` and the
Java AdminClient's ``alterClientQuotas``/``describeClientQuotas`` send. Quotas live in etcd
(``quotas.store``); every broker enforces them from its watched copy (``quotas.enforcement``).
Describing needs DESCRIBE_CONFIGS and altering ALTER_CONFIGS on the cluster, as in Kafka. An
unknown entity type or key, a duplicate, a refused key (``request_percentage``,
``controller_mutation_rate``) or a value that is not a positive whole number of bytes/s is
INVALID_REQUEST with a message; ``validate_only`` checks everything and writes nothing.
"""

from __future__ import annotations

from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import (
    describe_quotas_failed,
    raw_quota_entity,
)
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.quotas.entities import (
    Component,
    Entity,
    InvalidQuota,
    apply_ops,
    check_filter,
    filter_matches,
    make_entity,
)
from kafscale.broker.quotas.store import (
    ConcurrentChange,
    read_entities,
    stored_quotas,
    write_entities,
)

ALTER_ATTEMPTS = 5
ENTITIES_PER_TXN = 64
"""A compare and an op per entity: etcd's default ``--max-txn-ops`` (128) bounds a txn."""


def _entity_body(entity: Entity) -> list[Body]:
    return [{"entity_type": t, "entity_name": name} for t, name in entity]


async def handle_describe_client_quotas(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.DESCRIBE_CONFIGS, access.CLUSTER)
    components = [Component(c.entity_type, int(c.match_type), c.match) for c in request.components]
    try:
        check_filter(components)
    except InvalidQuota as exc:
        return describe_quotas_failed(ErrorCode.INVALID_REQUEST, str(exc))
    quotas = await stored_quotas(ctx.broker.etcd, ctx.broker.cluster)
    entries = [
        {
            "entity": _entity_body(entity),
            "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
        }
        for entity, values in sorted(quotas.items(), key=lambda item: repr(item[0]))
        if values and filter_matches(components, bool(request.strict), entity)
    ]
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "entries": entries,
    }


def _parse(entry: Any) -> tuple[Entity, list[tuple[str, float, bool]]]:
    entity = make_entity((e.entity_type, e.entity_name) for e in entry.entity)
    return entity, [(op.key, float(op.value), bool(op.remove)) for op in entry.ops]


async def handle_alter_client_quotas(request: Any, ctx: RequestContext) -> Body:
    access.require(ctx, Operation.ALTER_CONFIGS, access.CLUSTER)
    errors: dict[int, str] = {}
    parsed: dict[int, tuple[Entity, list[tuple[str, float, bool]]]] = {}
    seen: set[Entity] = set()
    for index, entry in enumerate(request.entries):
        try:
            entity, ops = _parse(entry)
            apply_ops({}, ops)  # the keys and values alone, before anything is read
            if entity in seen:
                raise InvalidQuota("the entity is named twice in the request")
        except InvalidQuota as exc:
            errors[index] = str(exc)
            continue
        seen.add(entity)
        parsed[index] = (entity, ops)
    changes = list(parsed.values())
    if not request.validate_only:
        for start in range(0, len(changes), ENTITIES_PER_TXN):
            await _alter(ctx, changes[start : start + ENTITIES_PER_TXN])
    results = []
    for index, entry in enumerate(request.entries):
        message = errors.get(index)
        code = ErrorCode.INVALID_REQUEST if message is not None else ErrorCode.NONE
        results.append(
            {"error_code": code, "error_message": message, "entity": raw_quota_entity(entry)}
        )
    return {"throttle_time": 0, "entries": results}


Change = tuple[Entity, list[tuple[str, float, bool]]]


async def _alter(ctx: RequestContext, changes: list[Change]) -> None:
    """Read, apply, write under compares; again if another alteration came between."""
    etcd, cluster = ctx.broker.etcd, ctx.broker.cluster
    for attempt in range(ALTER_ATTEMPTS):
        current = await read_entities(etcd, cluster, [entity for entity, _ in changes])
        updated = {entity: apply_ops(current[entity][0], ops) for entity, ops in changes}
        revisions = {entity: current[entity][1] for entity, _ in changes}
        try:
            await write_entities(etcd, cluster, updated, revisions)
            return
        except ConcurrentChange:
            if attempt == ALTER_ATTEMPTS - 1:
                raise
