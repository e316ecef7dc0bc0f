"""A new ``delegation.token.secret.key`` ends the tokens the old key signed, against a real
etcd: the token stored by a broker with key A no longer logs in, renews or shows on a broker
or proxy with key B (as in Kafka, whose brokers derive a token's credentials from their key).
Rotating the key is how an operator revokes every token at once, a leaked one included."""

from __future__ import annotations

import dataclasses
import time

import pytest

from kafscale.broker.api.sasl import token_lookup
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.security.sasl import SaslSession
from kafscale.broker.security.sasl_client import ScramClient
from kafscale.broker.security.scram import AuthenticationFailed, ScramMechanism
from kafscale.broker.security.token_store import TokenStore
from kafscale.broker.security.tokens import (
    TokenPolicy,
    key_id,
    new_token,
    new_token_id,
    token_credentials,
    token_hmac,
    token_password,
)

OLD, NEW = TokenPolicy(b"old-cluster-key"), TokenPolicy(b"new-cluster-key")
MECHANISM = ScramMechanism.SCRAM_SHA_512


async def _login(policy: TokenPolicy, store: TokenStore, token_id: str, password: str) -> str:
    async def no_user(_name: str, _m: ScramMechanism) -> None:
        return None

    session = SaslSession((MECHANISM.sasl_name,))
    session.handshake(MECHANISM.sasl_name)
    client = ScramClient(MECHANISM, token_id, password, token_auth=True)
    tokens = token_lookup(policy, store)
    first = await session.authenticate(client.first_message(), no_user, tokens)
    client.check_final(await session.authenticate(client.final_message(first), no_user, tokens))
    assert session.principal is not None
    return session.principal


async def test_a_new_secret_key_ends_the_old_keys_tokens(etcd: Etcd, cluster_name: str) -> None:
    store = TokenStore(etcd, cluster_name)
    assert OLD.secret_key is not None
    now_ms = int(time.time() * 1000)
    token = new_token(OLD, new_token_id(), "User:alice", "User:alice", [], -1, now_ms)
    mac = token_hmac(OLD.secret_key, token.token_id)
    await store.create(dataclasses.replace(token, credentials=token_credentials(mac)))
    password = token_password(mac)

    assert await _login(OLD, store, token.token_id, password) == "User:alice"
    with pytest.raises(AuthenticationFailed, match="unknown or expired"):
        await _login(NEW, store, token.token_id, password)
    # The old key's token is not signed by the new one: not renewable, not shown.
    ((stored, _rev),) = await store.list()
    assert not stored.signed_by(_key_id(NEW)) and stored.signed_by(_key_id(OLD))


def _key_id(policy: TokenPolicy) -> str:
    assert policy.secret_key is not None
    return key_id(policy.secret_key)
