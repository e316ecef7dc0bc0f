"""FindCoordinator: which broker coordinates a consumer group or a transactional id.

Groups are answered by the group coordinator's lease-aware choice, transactional ids by the
transaction coordinator's. No broker names a draining (``POST /drain``) or stopping one, not
even while it still holds a key's lease (it refuses the key from its mark on): the broker that
takes the key next is named, and its first request for it waits for the release
(``name_coordinator``); COORDINATOR_NOT_AVAILABLE (retriable) only when every live broker
drains. A key the principal may not describe gets its
AUTHORIZATION_FAILED code, an unknown key type INVALID_REQUEST. v4+ batches keys; v0-3 answer
one key at the top.
"""

from __future__ import annotations

from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.group_access import DESCRIBE, coordinator
from kafscale.broker.protocol.errors import ErrorCode

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
HANDING_OVER = "this broker drains or stops and hands its coordinators over: ask again"


async def handle_find_coordinator(request: Any, ctx: RequestContext) -> Body:
    key_type = int(getattr(request, "key_type", GROUP_KEY_TYPE))
    if ctx.api_version >= 4:
        entries = [_coordinator_entry(ctx, key, key_type) for key in request.coordinator_keys]
        return {"throttle_time": 0, "coordinators": entries}
    entry = _coordinator_entry(ctx, request.key, key_type)
    return {"throttle_time": 0, **{k: v for k, v in entry.items() if k != "key"}}


def _coordinator_entry(ctx: RequestContext, key: str, key_type: int) -> Body:
    entry: Body = {"key": key, "node_id": -1, "host": "", "port": -1}
    if key_type == GROUP_KEY_TYPE and not access.allowed(ctx, DESCRIBE, access.GROUP, key):
        return {**entry, "error_code": ErrorCode.GROUP_AUTHORIZATION_FAILED, "error_message": None}
    if key_type == TRANSACTION_KEY_TYPE and not access.allowed(
        ctx, DESCRIBE, access.TRANSACTIONAL_ID, key
    ):
        code = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return {**entry, "error_code": code, "error_message": None}
    handing_over = False
    if key_type == TRANSACTION_KEY_TYPE:
        transactions = ctx.broker.transactions
        broker = transactions.coordinator_for(key) if transactions is not None else None
        handing_over = transactions is not None and transactions.handing_over
    elif key_type == GROUP_KEY_TYPE:
        groups = coordinator(ctx)
        broker = groups.coordinator_for(key)
        handing_over = groups.handing_over
    else:
        message = f"key type {key_type} is not supported"
        return {**entry, "error_code": ErrorCode.INVALID_REQUEST, "error_message": message}
    if broker is None:
        message = HANDING_OVER if handing_over else "no live broker"
        return {
            **entry,
            "error_code": ErrorCode.COORDINATOR_NOT_AVAILABLE,
            "error_message": message,
        }
    host, port = broker.endpoint(ctx.connection.listener)
    return {
        "key": key,
        "node_id": broker.node_id,
        "host": host,
        "port": port,
        "error_code": ErrorCode.NONE,
        "error_message": None,
    }
