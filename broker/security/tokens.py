"""Delegation tokens (KIP-48): what a token is and every decision about it, as pure functions.

A token lets short-lived workers (Spark executors, Flink task managers) log in as its owner
without the owner's password: SCRAM with the ``tokenauth=true`` extension, the token id as
user name and the token's HMAC (base64) as password. The HMAC is HMAC-SHA512 of the token id
under the cluster's ``delegation.token.secret.key``, as Kafka's ``DelegationTokenManager``
computes it, so it is never stored: brokers holding the key recompute it (DescribeDelegation-
Token answers it; Renew and Expire name a token by it). What is stored is the token's
information and the SCRAM credentials derived from the HMAC (salt, StoredKey, ServerKey: what a
login needs, from which neither the HMAC nor a proof can be recovered).

The rules are Kafka's: a token lives until its expiry time (issue + ``expiry_time_ms``, 24 h),
renewable up to its max lifetime (``max_lifetime_ms``, 7 days); the owner, the requester and
the named renewers may renew or expire it; a connection that is not authenticated or that
logged in with a token may not create, renew, expire or describe tokens. Clocks are passed in
(milliseconds since the epoch).
"""

from __future__ import annotations

import base64
import hmac
import secrets
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.scram import (
    MIN_ITERATIONS,
    ScramCredential,
    ScramMechanism,
    credential_from_salted,
    salted_password,
)

ANONYMOUS = "User:ANONYMOUS"
USER_TYPE = "User"
DEFAULT_MAX_LIFETIME_MS = 7 * 24 * 3600 * 1000  # delegation.token.max.lifetime.ms
DEFAULT_EXPIRY_TIME_MS = 24 * 3600 * 1000  # delegation.token.expiry.time.ms
TOKEN_ITERATIONS = MIN_ITERATIONS  # Kafka derives token credentials with 4096 iterations


@dataclass(frozen=True, slots=True)
class TokenPolicy:
    """The cluster's token settings: the key (None: tokens are disabled) and the lifetimes."""

    secret_key: bytes | None = field(repr=False)
    max_lifetime_ms: int = DEFAULT_MAX_LIFETIME_MS
    expiry_time_ms: int = DEFAULT_EXPIRY_TIME_MS

    @property
    def enabled(self) -> bool:
        return bool(self.secret_key)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as stored: who owns it and may renew it, and its three timestamps."""

    token_id: str
    owner: str
    requester: str
    renewers: tuple[str, ...]
    issue_ms: int
    expiry_ms: int
    max_ms: int
    credentials: dict[ScramMechanism, ScramCredential] = field(
        default_factory=dict, compare=False, repr=False
    )
    key_id: str = ""
    """Which secret key signed the token (``key_id``; "" for a record without one): its
    stored credentials hold only while the cluster has that key."""

    def signed_by(self, current_key_id: str) -> bool:
        """Whether the cluster's key is still the one that signed this token. A new key ends
        every earlier token (as in Kafka, whose brokers derive a token's credentials from
        the key they hold): its stored credentials must not outlive the key."""
        return bool(self.key_id) and hmac.compare_digest(self.key_id, current_key_id)

    def expired(self, now_ms: int) -> bool:
        return self.expiry_ms < now_ms or self.max_ms < now_ms

    def owner_or_renewer(self, principal: str) -> bool:
        """Kafka's ``TokenInformation.ownerOrRenewer``: the owner, the requester who made it
        for the owner (KIP-373) and the renewers."""
        return principal in (self.owner, self.requester) or principal in self.renewers


class TokenError(Exception):
    """A token request refused with one of Kafka's delegation token error codes."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- identity and secrets ---------------------------------------------------------------------


def new_token_id() -> str:
    """A random id as Kafka writes one (URL-safe base64 of a UUID, unpadded): no ``,`` or
    ``=``, so it travels in a SCRAM user name unescaped."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def token_hmac(secret_key: bytes, token_id: str) -> bytes:
    """HMAC-SHA512 of the token id under the secret key (Kafka's ``createHmac``)."""
    return hmac.digest(secret_key, token_id.encode(), "sha512")


def key_id(secret_key: bytes) -> str:
    """A public fingerprint of the secret key, kept with each token so that a changed key ends
    the tokens it signed. HMAC of a fixed label: it tells nothing about the key."""
    digest = hmac.digest(secret_key, b"kafscale delegation token key id", "sha256")
    return base64.urlsafe_b64encode(digest[:12]).decode()


def token_password(token_hmac_bytes: bytes) -> str:
    """The SCRAM password of a token: its HMAC in standard base64, as Kafka's clients send it
    (``DelegationToken.hmacAsBase64String``)."""
    return base64.b64encode(token_hmac_bytes).decode()


def token_credentials(
    token_hmac_bytes: bytes, iterations: int = TOKEN_ITERATIONS
) -> dict[ScramMechanism, ScramCredential]:
    """The SCRAM-SHA-256 and -512 credentials of a token (PBKDF2: run it off the event loop)."""
    password = token_password(token_hmac_bytes).encode()
    found = {}
    for mechanism in ScramMechanism:
        salt = secrets.token_bytes(32)
        salted = salted_password(password, salt, iterations, mechanism)
        found[mechanism] = credential_from_salted(salted, salt, iterations, mechanism)
    return found


def find_by_hmac(tokens: Sequence[TokenInfo], secret_key: bytes, given: bytes) -> TokenInfo | None:
    """The token whose HMAC is ``given`` (Renew and Expire name a token by it), compared in
    constant time; every token is compared, so the time says nothing about which one matched."""
    found = None
    for token in tokens:
        if hmac.compare_digest(token_hmac(secret_key, token.token_id), given):
            found = token
    return found


# --- decisions --------------------------------------------------------------------------------


def token_requests_allowed(principal: str, token_authenticated: bool) -> bool:
    """Kafka's ``allowTokenRequests``: not from an unauthenticated connection (PLAINTEXT, SSL
    without a client certificate: ``User:ANONYMOUS``) nor from one that logged in with a token
    (a token must not beget tokens that outlive it)."""
    return not token_authenticated and principal != ANONYMOUS


def check_renewers(renewers: Sequence[str]) -> None:
    """Renewers must be users (Kafka answers INVALID_PRINCIPAL_TYPE otherwise)."""
    for renewer in renewers:
        kind, _, name = renewer.partition(":")
        if kind != USER_TYPE or not name:
            raise TokenError(ErrorCode.INVALID_PRINCIPAL_TYPE, f"renewer {renewer!r} is not a User")


def new_token(
    policy: TokenPolicy,
    token_id: str,
    owner: str,
    requester: str,
    renewers: Sequence[str],
    requested_max_lifetime_ms: int,
    now_ms: int,
) -> TokenInfo:
    """A token issued now: its max lifetime is the requested one capped by the policy's (-1 or
    0: the policy's), and it expires after ``expiry_time_ms`` unless renewed, never later than
    its max lifetime."""
    check_renewers(renewers)  # Kafka checks them before asking its token manager
    if not policy.enabled:
        raise TokenError(ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED, "delegation tokens are off")
    lifetime = policy.max_lifetime_ms
    if requested_max_lifetime_ms > 0:
        lifetime = min(requested_max_lifetime_ms, lifetime)
    max_ms = now_ms + lifetime
    expiry_ms = min(max_ms, now_ms + policy.expiry_time_ms)
    assert policy.secret_key is not None  # enabled
    return TokenInfo(
        token_id,
        owner,
        requester,
        tuple(dict.fromkeys(renewers)),
        now_ms,
        expiry_ms,
        max_ms,
        key_id=key_id(policy.secret_key),
    )


def _check_may_change(token: TokenInfo | None, principal: str, now_ms: int) -> TokenInfo:
    if token is None:
        raise TokenError(ErrorCode.DELEGATION_TOKEN_NOT_FOUND, "no token has this HMAC")
    if not token.owner_or_renewer(principal):
        raise TokenError(
            ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH,
            f"{principal} is neither the owner nor a renewer of the token",
        )
    if token.expired(now_ms):
        raise TokenError(ErrorCode.DELEGATION_TOKEN_EXPIRED, "the token has expired")
    return token


def renewed(
    policy: TokenPolicy,
    token: TokenInfo | None,
    principal: str,
    renew_period_ms: int,
    now_ms: int,
) -> TokenInfo:
    """The token renewed by ``principal``: it now expires ``renew_period_ms`` from now (-1: the
    policy's expiry time), never past its max lifetime."""
    found = _check_may_change(token, principal, now_ms)
    period = policy.expiry_time_ms if renew_period_ms < 0 else renew_period_ms
    return replace(found, expiry_ms=min(found.max_ms, now_ms + period))


def expired_by(
    token: TokenInfo | None, principal: str, expiry_period_ms: int, now_ms: int
) -> TokenInfo | None:
    """The token after ``principal`` asked it to expire in ``expiry_period_ms``: None when it
    is to go at once (a negative period, Kafka's "expire now"), else the token with its new
    (earlier or later, never past its max lifetime) expiry time."""
    found = _check_may_change(token, principal, now_ms)
    if expiry_period_ms < 0:
        return None
    return replace(found, expiry_ms=min(found.max_ms, now_ms + expiry_period_ms))


def describable(
    token: TokenInfo,
    principal: str,
    owners: Sequence[str] | None,
    may_describe_token: Callable[[str], bool],
    may_describe_owner_tokens: Callable[[str], bool],
    now_ms: int,
) -> bool:
    """Whether DescribeDelegationToken shows ``token`` to ``principal`` (Kafka's
    ``filterToken``): it must belong to (or be renewable by) one of ``owners`` if they are
    named, and be the caller's own (owner, requester or renewer), or the caller may DESCRIBE
    the DELEGATION_TOKEN resource of its id, or DESCRIBE_TOKENS on the owner's USER resource.
    An expired token is shown to nobody: it no longer authenticates, and it is being removed."""
    if token.expired(now_ms):
        return False
    if owners is not None and not any(token.owner_or_renewer(o) for o in owners):
        return False
    return (
        token.owner_or_renewer(principal)
        or may_describe_token(token.token_id)
        or may_describe_owner_tokens(token.owner)
    )


def login_principal(token: TokenInfo | None, now_ms: int, current_key_id: str) -> str | None:
    """The principal a SCRAM login with this token becomes (the owner's), None when the token
    does not exist, has expired or was signed by another key than ``current_key_id``'s (the
    login fails)."""
    if token is None or token.expired(now_ms) or not token.signed_by(current_key_id):
        return None
    return token.owner


def to_remove(tokens: Sequence[TokenInfo], now_ms: int) -> list[TokenInfo]:
    """The expired tokens, which the broker deletes from etcd."""
    return [t for t in tokens if t.expired(now_ms)]
