"""Delegation tokens: lifetimes, HMACs, who may renew or see a token, and SCRAM token logins."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac

import pytest

from kafscale.broker.config import BrokerSettings
from kafscale.broker.protocol import codec
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.security.sasl import SaslSession
from kafscale.broker.security.sasl_client import ScramClient
from kafscale.broker.security.scram import AuthenticationFailed, ScramCredential, ScramMechanism
from kafscale.broker.security.token_store import decode_token, encode_token
from kafscale.broker.security.tokens import (
    TokenError,
    TokenInfo,
    TokenPolicy,
    describable,
    expired_by,
    find_by_hmac,
    login_principal,
    new_token,
    new_token_id,
    renewed,
    to_remove,
    token_credentials,
    token_hmac,
    token_password,
    token_requests_allowed,
)

KEY = b"cluster-secret"
POLICY = TokenPolicy(KEY, max_lifetime_ms=10_000, expiry_time_ms=3_000)
NOW = 1_000_000


def _token(**changes: object) -> TokenInfo:
    token = new_token(POLICY, "tok", "User:alice", "User:alice", ["User:bob"], -1, NOW)
    return TokenInfo(**{**{f: getattr(token, f) for f in token.__slots__}, **changes})  # type: ignore[arg-type]


def test_the_hmac_is_kafkas_hmac_sha512_of_the_token_id() -> None:
    expected = hmac.new(KEY, b"tok", hashlib.sha512).digest()
    assert token_hmac(KEY, "tok") == expected
    assert token_password(expected) == base64.b64encode(expected).decode()
    token_id = new_token_id()
    assert len(token_id) == 22 and "," not in token_id and "=" not in token_id


def test_lifetimes_follow_the_policy_and_the_request() -> None:
    default = new_token(POLICY, "t", "User:a", "User:a", [], -1, NOW)
    assert (default.issue_ms, default.expiry_ms, default.max_ms) == (NOW, NOW + 3_000, NOW + 10_000)
    short = new_token(POLICY, "t", "User:a", "User:a", [], 2_000, NOW)
    assert (short.expiry_ms, short.max_ms) == (NOW + 2_000, NOW + 2_000)  # expiry ≤ max
    capped = new_token(POLICY, "t", "User:a", "User:a", [], 99_000, NOW)
    assert capped.max_ms == NOW + 10_000


def test_creation_refusals() -> None:
    with pytest.raises(TokenError) as disabled:
        new_token(TokenPolicy(None), "t", "User:a", "User:a", [], -1, NOW)
    assert disabled.value.code == ErrorCode.DELEGATION_TOKEN_AUTH_DISABLED
    with pytest.raises(TokenError) as bad_renewer:
        new_token(POLICY, "t", "User:a", "User:a", ["Group:ops"], -1, NOW)
    assert bad_renewer.value.code == ErrorCode.INVALID_PRINCIPAL_TYPE


def test_renewal_moves_the_expiry_but_never_past_the_max_lifetime() -> None:
    token = _token()
    later = NOW + 1_000
    assert renewed(POLICY, token, "User:bob", -1, later).expiry_ms == later + 3_000
    assert renewed(POLICY, token, "User:alice", 500, later).expiry_ms == later + 500
    assert renewed(POLICY, token, "User:alice", 60_000, later).expiry_ms == token.max_ms


@pytest.mark.parametrize(
    ("token", "principal", "now", "code"),
    [
        (None, "User:alice", NOW, ErrorCode.DELEGATION_TOKEN_NOT_FOUND),
        (_token(), "User:mallory", NOW, ErrorCode.DELEGATION_TOKEN_OWNER_MISMATCH),
        (_token(), "User:alice", NOW + 3_001, ErrorCode.DELEGATION_TOKEN_EXPIRED),
    ],
)
def test_renew_and_expire_refusals(
    token: TokenInfo | None, principal: str, now: int, code: ErrorCode
) -> None:
    with pytest.raises(TokenError) as renew:
        renewed(POLICY, token, principal, -1, now)
    with pytest.raises(TokenError) as expire:
        expired_by(token, principal, -1, now)
    assert renew.value.code == expire.value.code == code


def test_expiring_now_removes_and_a_period_sets_the_expiry() -> None:
    token = _token()
    assert expired_by(token, "User:alice", -1, NOW) is None
    changed = expired_by(token, "User:bob", 0, NOW + 10)
    assert changed is not None and changed.expiry_ms == NOW + 10
    assert login_principal(changed, NOW + 11, changed.key_id) is None
    assert to_remove([token, changed], NOW + 11) == [changed]


def test_the_requester_of_a_token_for_someone_else_may_renew_it() -> None:
    token = _token(owner="User:etl", requester="User:scheduler", renewers=())
    assert renewed(POLICY, token, "User:scheduler", -1, NOW).expiry_ms == NOW + 3_000


def test_token_requests_need_an_authenticated_connection_without_a_token() -> None:
    assert token_requests_allowed("User:alice", token_authenticated=False)
    assert not token_requests_allowed("User:alice", token_authenticated=True)
    assert not token_requests_allowed("User:ANONYMOUS", token_authenticated=False)


def test_who_sees_a_token() -> None:
    token = _token()
    never = lambda _: False  # noqa: E731
    always = lambda _: True  # noqa: E731
    assert describable(token, "User:alice", None, never, never, NOW)  # owner
    assert describable(token, "User:bob", None, never, never, NOW)  # renewer
    assert not describable(token, "User:eve", None, never, never, NOW)
    assert describable(token, "User:eve", None, always, never, NOW)  # DESCRIBE on the token
    assert describable(token, "User:eve", None, never, lambda o: o == "User:alice", NOW)
    assert not describable(token, "User:alice", ["User:carol"], always, always, NOW)  # filtered
    assert describable(token, "User:alice", ["User:bob"], never, never, NOW)  # bob renews it
    assert not describable(token, "User:alice", None, always, always, NOW + 3_001)  # expired


def test_find_by_hmac_compares_every_token() -> None:
    tokens = [_token(token_id=f"t{i}") for i in range(5)]
    assert find_by_hmac(tokens, KEY, token_hmac(KEY, "t3")) is tokens[3]
    assert find_by_hmac(tokens, KEY, token_hmac(b"other key", "t3")) is None
    assert find_by_hmac(tokens, KEY, b"") is None


def test_a_stored_token_keeps_credentials_but_not_its_hmac() -> None:
    mac = token_hmac(KEY, "tok")
    token = _token(credentials=token_credentials(mac))
    stored = encode_token(token)
    assert base64.b64encode(mac) not in stored and KEY not in stored
    back = decode_token(stored)
    assert back == token and back.credentials == token.credentials


def _login(session: SaslSession, client: ScramClient, tokens: object, users: object = None) -> None:
    async def no_user(_name: str, _m: ScramMechanism) -> ScramCredential | None:
        return None

    async def run() -> None:
        first = await session.authenticate(client.first_message(), no_user, tokens)  # type: ignore[arg-type]
        final = await session.authenticate(client.final_message(first), no_user, tokens)  # type: ignore[arg-type]
        client.check_final(final)

    asyncio.run(run())


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_a_scram_login_with_a_token_becomes_its_owner(mechanism: ScramMechanism) -> None:
    mac = token_hmac(KEY, "tok")
    credentials = token_credentials(mac)

    async def tokens(token_id: str, m: ScramMechanism) -> tuple[ScramCredential, str] | None:
        return (credentials[m], "User:alice") if token_id == "tok" else None

    session = SaslSession((mechanism.sasl_name,))
    session.handshake(mechanism.sasl_name)
    _login(session, ScramClient(mechanism, "tok", token_password(mac), token_auth=True), tokens)
    assert session.principal == "User:alice" and session.token_authenticated
    for wrong in (
        ScramClient(mechanism, "tok", token_password(token_hmac(b"k2", "tok")), token_auth=True),
        ScramClient(mechanism, "nope", token_password(mac), token_auth=True),
    ):
        failing = SaslSession((mechanism.sasl_name,))
        failing.handshake(mechanism.sasl_name)
        with pytest.raises(AuthenticationFailed):
            _login(failing, wrong, tokens)
    disabled = SaslSession((mechanism.sasl_name,))
    disabled.handshake(mechanism.sasl_name)
    with pytest.raises(AuthenticationFailed, match="not enabled"):
        _login(disabled, ScramClient(mechanism, "tok", token_password(mac), token_auth=True), None)


def test_forwarded_principals_say_whether_a_token_logged_in() -> None:
    data = codec.encode_principal("User:alice", token_authenticated=True)
    assert codec.decode_forwarded_principal(data) == ("User:alice", True)
    assert codec.decode_forwarded_principal(codec.encode_principal("User:bob")) == (
        "User:bob",
        False,
    )


def test_the_secret_key_is_a_secret_setting() -> None:
    settings = BrokerSettings(delegation_token={"secret_key": "k3y-material"})  # type: ignore[arg-type]
    assert settings.delegation_token.policy().secret_key == b"k3y-material"
    assert "k3y-material" not in repr(settings) and "k3y-material" not in repr(
        settings.delegation_token.policy()
    )
    assert not BrokerSettings().delegation_token.policy().enabled


def test_describe_configs_never_answers_the_secret_key() -> None:
    from kafscale.broker.api.admin import _broker_entry
    from kafscale.broker.api.configs import broker_configs

    settings = BrokerSettings(
        delegation_token={"secret_key": "k3y-material", "max_lifetime_ms": 60_000}  # type: ignore[arg-type]
    )
    configs = {c.name: c for c in broker_configs(settings, 1, [("PLAINTEXT", "h", 9092)], {})}
    entry = _broker_entry(configs["delegation.token.secret.key"], True, include_synonyms=True)
    assert entry["is_sensitive"] and entry["value"] is None
    assert entry["synonyms"] and all(s["value"] is None for s in entry["synonyms"])
    assert "k3y-material" not in repr([_broker_entry(c, True, True) for c in configs.values()])
    lifetime = _broker_entry(configs["delegation.token.max.lifetime.ms"], True, False)
    assert lifetime["value"] == "60000" and not lifetime["is_sensitive"]
