"""SaslHandshake and SaslAuthenticate: a SASL listener's login (PLAIN, SCRAM-SHA-256/512, and
SCRAM with a delegation token: the connection becomes the token's owner, token-authenticated).

A failed login is answered (SASL_AUTHENTICATION_FAILED with a message, as Kafka answers) and
then the connection is closed; so is a SASL request out of order (ILLEGAL_SASL_STATE). On a
listener without SASL, SaslHandshake gets ILLEGAL_SASL_STATE, as from Kafka.

The proxy logs its clients in with the same two functions (``sasl_handshake``,
``sasl_authenticate``) and the same etcd credential store: one implementation of the exchange.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.observability.log_limit import ClientEvent, client_log, host_of
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.sasl import CredentialLookup, IllegalSaslState, TokenLookup
from kafscale.broker.security.scram import AuthenticationFailed, ScramCredential, ScramMechanism
from kafscale.broker.security.token_store import TokenStore
from kafscale.broker.security.tokens import TokenPolicy, key_id
from kafscale.broker.server import Connection

log = logging.getLogger(__name__)


async def handle_sasl_handshake(request: Any, ctx: RequestContext) -> Body:
    return sasl_handshake(request, ctx.connection)


async def handle_sasl_authenticate(request: Any, ctx: RequestContext) -> Body:
    broker = ctx.broker
    tokens = token_lookup(broker.settings.delegation_token.policy(), broker.tokens)
    return await sasl_authenticate(request, ctx.connection, broker.credentials.get, tokens)


def token_lookup(policy: TokenPolicy, store: TokenStore) -> TokenLookup | None:
    """Token logins against ``store`` when tokens are on (a secret key is set), else None:
    a process without the key refuses them, as a Kafka broker without one does."""
    if policy.secret_key is None or not policy.enabled:
        return None
    current_key_id = key_id(policy.secret_key)

    async def lookup(
        token_id: str, mechanism: ScramMechanism
    ) -> tuple[ScramCredential, str] | None:
        now_ms = int(time.time() * 1000)
        return await store.scram_login(token_id, mechanism, now_ms, current_key_id)

    return lookup


def sasl_handshake(request: Any, connection: Connection) -> Body:
    session = connection.sasl
    if session is None:
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
    mechanisms = list(session.enabled_mechanisms)
    try:
        accepted = session.handshake(request.mechanism)
    except IllegalSaslState as exc:
        _login_failed(connection, "%s sent SaslHandshake out of turn (%s); closing", exc)
        return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": mechanisms}
    if not accepted:
        _login_failed(connection, "%s asked for SASL mechanism %r; closing", request.mechanism)
        return {"error_code": ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanisms": mechanisms}
    return {"error_code": ErrorCode.NONE, "mechanisms": mechanisms}


async def sasl_authenticate(
    request: Any,
    connection: Connection,
    lookup: CredentialLookup,
    tokens: TokenLookup | None = None,
) -> Body:
    session = connection.sasl
    if session is None:
        _login_failed(connection, "%s sent SaslAuthenticate to a listener without SASL; closing")
        return _failure(ErrorCode.ILLEGAL_SASL_STATE, "this listener does not use SASL")
    try:
        answer = await session.authenticate(request.auth_bytes, lookup, tokens)
    except IllegalSaslState as exc:
        _login_failed(connection, "%s sent SaslAuthenticate out of turn (%s); closing", exc)
        return _failure(ErrorCode.ILLEGAL_SASL_STATE, str(exc))
    except AuthenticationFailed as exc:
        _login_failed(connection, "%s failed SASL %s authentication: %s", session.mechanism, exc)
        return _failure(
            ErrorCode.SASL_AUTHENTICATION_FAILED,
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {session.mechanism}",
        )
    principal = session.principal
    if principal is not None:
        connection.principal = principal
        connection.token_authenticated = session.token_authenticated
        how = " (delegation token)" if session.token_authenticated else ""
        client_log(  # keyed by identity too: one user's logins hide no other's
            log, logging.INFO, ClientEvent.AUTHENTICATED,
            f"{host_of(connection.peer)} as {principal}",
            "%s authenticated as %s%s", connection.peer, principal, how,
        )  # fmt: skip
    return {
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "auth_bytes": answer,
        "session_lifetime": 0,
    }


def _login_failed(connection: Connection, msg: str, *args: object) -> None:
    """A failed login: counted, its one log line (limited; ``msg`` starts with the peer), and
    the connection closed once the answer is sent. The close writes no line of its own
    (``server.LoginFailed``): one failed login, one line."""
    METRICS.sasl_authentication_failures += 1
    client_log(
        log, logging.INFO, ClientEvent.SASL_FAILURE, host_of(connection.peer),
        msg, connection.peer, *args,
    )  # fmt: skip
    connection.close_after_response = True


def _failure(code: ErrorCode, message: str) -> Body:
    return {"error_code": code, "error_message": message, "auth_bytes": b"", "session_lifetime": 0}
