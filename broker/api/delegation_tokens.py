"""CreateDelegationToken, RenewDelegationToken, ExpireDelegationToken, DescribeDelegationToken.

Kafka's semantics (KIP-48, KIP-373), decided by the pure ``security.tokens``; the tokens live
in etcd (``security.token_store``), so every broker serves all four for every token and a
token works on every broker and the proxy at once. In Kafka's order, each API answers:

* DELEGATION_TOKEN_REQUEST_NOT_ALLOWED from a connection that is not authenticated or that
  logged in with a token;
* DELEGATION_TOKEN_AUTH_DISABLED when this broker has no ``delegation_token.secret_key``;
* Create: DELEGATION_TOKEN_AUTHORIZATION_FAILED for a token owned by someone else without
  CREATE_TOKENS on that owner's USER resource; INVALID_PRINCIPAL_TYPE for a renewer that is not
  a ``User``;
* Renew and Expire: DELEGATION_TOKEN_NOT_FOUND for an HMAC no token has,
  DELEGATION_TOKEN_OWNER_MISMATCH for a caller that is not the owner, requester or a renewer,
  DELEGATION_TOKEN_EXPIRED for an expired token;
* Describe: only the tokens the caller owns, renews or may describe (DESCRIBE on the
  DELEGATION_TOKEN, or DESCRIBE_TOKENS on the owner's USER resource).

The HMAC (the token's password) is answered by Create and Describe only, and never logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.authz.model import Operation, ResourceType
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.token_store import TokenConflict, TokenStore
from kafscale.broker.security.tokens import (
    TokenError,
    TokenInfo,
    TokenPolicy,
    describable,
    expired_by,
    find_by_hmac,
    key_id,
    new_token,
    new_token_id,
    renewed,
    token_credentials,
    token_hmac,
    token_requests_allowed,
)

CAS_ATTEMPTS = 5
"""Renewals and expiries are compare-and-swap; a token changing this often is being fought
over, and the caller is told to retry (REQUEST_TIMED_OUT is retriable)."""


def _now_ms() -> int:
    return int(time.time() * 1000)


def _split(principal: str) -> tuple[str, str]:
    kind, _, name = principal.partition(":")
    return kind, name


def _refusal(ctx: RequestContext, policy: TokenPolicy) -> ErrorCode | None:
    """The error every token API answers before looking at tokens, if any."""
    connection = ctx.connection
    if not token_requests_allowed(connection.principal, connection.token_authenticated):
        return ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
    if not policy.enabled:
        return ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED
    return None


# --- CreateDelegationToken ---------------------------------------------------------------------


def _owner(request: Any, requester: str) -> str:
    name = getattr(request, "owner_principal_name", None)  # v3+ (KIP-373)
    if not name:
        return requester
    return f"{getattr(request, 'owner_principal_type', None) or 'User'}:{name}"


def _create_answer(code: ErrorCode, owner: str, requester: str) -> Body:
    owner_type, owner_name = _split(owner)
    requester_type, requester_name = _split(requester)
    return {
        "error_code": code,
        "principal_type": owner_type,
        "principal_name": owner_name,
        "token_requester_principal_type": requester_type,
        "token_requester_principal_name": requester_name,
        "issue_timestamp": -1,
        "expiry_timestamp": -1,
        "max_timestamp": -1,
        "token_id": "",
        "hmac": b"",
        "throttle_time": 0,
    }


async def handle_create_delegation_token(request: Any, ctx: RequestContext) -> Body:
    requester = ctx.connection.principal
    owner = _owner(request, requester)
    policy = ctx.broker.settings.delegation_token.policy()
    connection = ctx.connection
    if not token_requests_allowed(requester, connection.token_authenticated):
        return _create_answer(ErrorCode.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED, owner, requester)
    if owner != requester and not access.allowed(
        ctx, Operation.CREATE_TOKENS, ResourceType.USER, owner
    ):
        return _create_answer(ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED, owner, requester)
    renewers = [f"{r.principal_type}:{r.principal_name}" for r in request.renewers]
    try:
        token = new_token(
            policy,
            new_token_id(),
            owner,
            requester,
            renewers,
            codec.millis(request.max_lifetime),
            _now_ms(),
        )
    except TokenError as exc:
        return _create_answer(exc.code, owner, requester)
    assert policy.secret_key is not None  # new_token refuses a policy without one
    mac = token_hmac(policy.secret_key, token.token_id)
    # PBKDF2 twice (4096 iterations each): milliseconds of CPU, off the event loop.
    credentials = await asyncio.to_thread(token_credentials, mac)
    token = dataclasses.replace(token, credentials=credentials)
    await ctx.broker.tokens.create(token)
    return {
        **_create_answer(ErrorCode.NONE, owner, requester),
        "issue_timestamp": token.issue_ms,
        "expiry_timestamp": token.expiry_ms,
        "max_timestamp": token.max_ms,
        "token_id": token.token_id,
        "hmac": mac,
    }


# --- RenewDelegationToken and ExpireDelegationToken --------------------------------------------


def _expiry_answer(code: ErrorCode, expiry_ms: int = -1) -> Body:
    return {"error_code": code, "expiry_timestamp": expiry_ms, "throttle_time": 0}


async def handle_renew_delegation_token(request: Any, ctx: RequestContext) -> Body:
    policy = ctx.broker.settings.delegation_token.policy()
    refused = _refusal(ctx, policy)
    if refused is not None:
        return _expiry_answer(refused)
    principal, period_ms = ctx.connection.principal, codec.millis(request.renew_period)

    async def renew(token: TokenInfo | None, revision: int, now_ms: int) -> int:
        changed = renewed(policy, token, principal, period_ms, now_ms)
        await ctx.broker.tokens.replace(changed, revision)
        return changed.expiry_ms

    return await _change(ctx, policy, bytes(request.hmac), renew)


async def handle_expire_delegation_token(request: Any, ctx: RequestContext) -> Body:
    policy = ctx.broker.settings.delegation_token.policy()
    refused = _refusal(ctx, policy)
    if refused is not None:
        return _expiry_answer(refused)
    principal, period_ms = ctx.connection.principal, codec.millis(request.expiry_time_period)
    store = ctx.broker.tokens

    async def expire(token: TokenInfo | None, revision: int, now_ms: int) -> int:
        changed = expired_by(token, principal, period_ms, now_ms)
        if changed is None:
            assert token is not None  # expired_by refuses a missing token
            if not await store.remove(token.token_id, revision):
                raise TokenConflict(token.token_id)
            return now_ms
        await store.replace(changed, revision)
        return changed.expiry_ms

    return await _change(ctx, policy, bytes(request.hmac), expire)


async def _change(ctx: RequestContext, policy: TokenPolicy, mac: bytes, change: Any) -> Body:
    """Find the token by ``mac`` and apply ``change`` (token, revision, now) → new expiry;
    again from a fresh read if another broker changed the token meanwhile."""
    assert policy.secret_key is not None
    store: TokenStore = ctx.broker.tokens
    for _ in range(CAS_ATTEMPTS):
        listed = _signed(await store.list(), policy.secret_key)
        token = find_by_hmac([t for t, _ in listed], policy.secret_key, mac)
        revision = next((rev for t, rev in listed if t is token), 0)
        try:
            return _expiry_answer(ErrorCode.NONE, await change(token, revision, _now_ms()))
        except TokenError as exc:
            return _expiry_answer(exc.code)
        except TokenConflict:
            continue
    return _expiry_answer(ErrorCode.REQUEST_TIMED_OUT)


def _signed(listed: list[tuple[TokenInfo, int]], secret_key: bytes) -> list[tuple[TokenInfo, int]]:
    """The tokens the cluster's current key signed: one made under an earlier key no longer
    logs in, so it is not found, renewed or shown (the expiry sweep removes it in time)."""
    current = key_id(secret_key)
    return [(token, rev) for token, rev in listed if token.signed_by(current)]


# --- DescribeDelegationToken -------------------------------------------------------------------


def _described(token: TokenInfo, mac: bytes) -> Body:
    owner_type, owner_name = _split(token.owner)
    requester_type, requester_name = _split(token.requester)
    return {
        "principal_type": owner_type,
        "principal_name": owner_name,
        "token_requester_principal_type": requester_type,
        "token_requester_principal_name": requester_name,
        "issue_timestamp": token.issue_ms,
        "expiry_timestamp": token.expiry_ms,
        "max_timestamp": token.max_ms,
        "token_id": token.token_id,
        "hmac": mac,
        "renewers": [
            {"principal_type": kind, "principal_name": name}
            for kind, name in map(_split, token.renewers)
        ],
    }


async def handle_describe_delegation_token(request: Any, ctx: RequestContext) -> Body:
    policy = ctx.broker.settings.delegation_token.policy()
    refused = _refusal(ctx, policy)
    if refused is not None:
        return {"error_code": refused, "tokens": [], "throttle_time": 0}
    assert policy.secret_key is not None
    owners = None
    if request.owners is not None:
        owners = [f"{o.principal_type}:{o.principal_name}" for o in request.owners]
        if not owners:  # an empty list asks for nothing (Kafka's ownersListEmpty)
            return {"error_code": ErrorCode.NONE, "tokens": [], "throttle_time": 0}
    principal, now_ms = ctx.connection.principal, _now_ms()

    def may_describe_token(token_id: str) -> bool:
        return access.allowed(ctx, Operation.DESCRIBE, ResourceType.DELEGATION_TOKEN, token_id)

    def may_describe_owner(owner: str) -> bool:
        return access.allowed(ctx, Operation.DESCRIBE_TOKENS, ResourceType.USER, owner)

    shown = [
        _described(token, token_hmac(policy.secret_key, token.token_id))
        for token, _ in _signed(await ctx.broker.tokens.list(), policy.secret_key)
        if describable(token, principal, owners, may_describe_token, may_describe_owner, now_ms)
    ]
    return {"error_code": ErrorCode.NONE, "tokens": shown, "throttle_time": 0}
