"""Delegation tokens in etcd (``keys.delegation_token_key``), one key per token.

The value is JSON: the token's owner, requester, renewers and timestamps, and the SCRAM
credentials derived from its HMAC (salt, StoredKey, ServerKey per mechanism, as a user's are
kept). Never the HMAC and never the secret key: whoever reads etcd can neither log in with a
token nor renew it.

Every broker and the proxy read a token from etcd when a client logs in with it (one get per
login, as for users' SCRAM credentials): a token created, renewed or expired on one broker
applies on the next login everywhere, with no watch to lag behind. Renewals and expiries are
compare-and-swap on the key's revision, so two brokers renewing at once cannot undo each
other; a broker removing expired tokens deletes only what it read as expired.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    KeyValue,
    create_revision_is,
    delete_op,
    mod_revision_is,
    put_op,
)
from kafscale.broker.protocol.errors import MetadataTimeout
from kafscale.broker.security.scram import ScramCredential, ScramMechanism
from kafscale.broker.security.tokens import TokenInfo, login_principal, to_remove

log = logging.getLogger(__name__)


def _credential_json(credential: ScramCredential) -> dict[str, Any]:
    return {
        "salt": base64.b64encode(credential.salt).decode(),
        "stored_key": base64.b64encode(credential.stored_key).decode(),
        "server_key": base64.b64encode(credential.server_key).decode(),
        "iterations": credential.iterations,
    }


def _credential_of(document: dict[str, Any]) -> ScramCredential:
    return ScramCredential(
        salt=base64.b64decode(document["salt"]),
        iterations=int(document["iterations"]),
        stored_key=base64.b64decode(document["stored_key"]),
        server_key=base64.b64decode(document["server_key"]),
    )


def encode_token(token: TokenInfo) -> bytes:
    return json.dumps(
        {
            "token_id": token.token_id,
            "owner": token.owner,
            "requester": token.requester,
            "renewers": list(token.renewers),
            "issue_ms": token.issue_ms,
            "expiry_ms": token.expiry_ms,
            "max_ms": token.max_ms,
            "key_id": token.key_id,
            "scram": {m.sasl_name: _credential_json(c) for m, c in token.credentials.items()},
        },
        sort_keys=True,
    ).encode()


def decode_token(data: bytes) -> TokenInfo:
    d = json.loads(data)
    credentials = {}
    for name, document in d.get("scram", {}).items():
        mechanism = ScramMechanism.from_sasl_name(name)
        if mechanism is not None:
            credentials[mechanism] = _credential_of(document)
    return TokenInfo(
        token_id=str(d["token_id"]),
        owner=str(d["owner"]),
        requester=str(d["requester"]),
        renewers=tuple(str(r) for r in d["renewers"]),
        issue_ms=int(d["issue_ms"]),
        expiry_ms=int(d["expiry_ms"]),
        max_ms=int(d["max_ms"]),
        credentials=credentials,
        key_id=str(d.get("key_id", "")),
    )


class TokenConflict(Exception):
    """The token changed (or went) between reading and writing it."""


class TokenStore:
    """The delegation tokens of one cluster."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self._etcd = etcd
        self._cluster = cluster

    def _key(self, token_id: str) -> str:
        return keys.delegation_token_key(self._cluster, token_id)

    async def get(self, token_id: str) -> tuple[TokenInfo, int] | None:
        """The token and its key's revision, or None."""
        kv = await self._etcd.get(self._key(token_id))
        return None if kv is None else _decoded(kv)

    async def list(self) -> list[tuple[TokenInfo, int]]:
        """Every readable token with its revision (an unreadable record is logged, skipped)."""
        try:
            entries = await self._etcd.get_prefix(keys.delegation_tokens_prefix(self._cluster))
        except MetadataUnavailable as exc:
            raise MetadataTimeout(str(exc)) from exc
        found = []
        for kv in entries:
            decoded = _decoded(kv)
            if decoded is not None:
                found.append(decoded)
        return found

    async def create(self, token: TokenInfo) -> None:
        result = await self._etcd.txn(
            [create_revision_is(self._key(token.token_id), 0)],
            [put_op(self._key(token.token_id), encode_token(token))],
        )
        if not result.succeeded:
            raise TokenConflict(f"token id {token.token_id} exists")

    async def replace(self, token: TokenInfo, revision: int) -> None:
        """Write ``token`` over the version read at ``revision``; TokenConflict if it moved."""
        key = self._key(token.token_id)
        result = await self._etcd.txn(
            [mod_revision_is(key, revision)], [put_op(key, encode_token(token))]
        )
        if not result.succeeded:
            raise TokenConflict(f"token {token.token_id} changed meanwhile")

    async def remove(self, token_id: str, revision: int) -> bool:
        """Delete the token if it is still the version read at ``revision``."""
        key = self._key(token_id)
        result = await self._etcd.txn([mod_revision_is(key, revision)], [delete_op(key)])
        return result.succeeded

    async def scram_login(
        self, token_id: str, mechanism: ScramMechanism, now_ms: int, current_key_id: str
    ) -> tuple[ScramCredential, str] | None:
        """The credential a SCRAM login with token ``token_id`` is checked against, and the
        principal it becomes (the owner); None for an unknown or expired token, or one signed
        by another key than the cluster's (``current_key_id``)."""
        found = await self.get(token_id)
        if found is None:
            return None
        token = found[0]
        owner = login_principal(token, now_ms, current_key_id)
        credential = token.credentials.get(mechanism)
        if owner is None or credential is None:
            return None
        return credential, owner

    async def remove_expired(self, now_ms: int) -> int:
        """Delete every expired token; how many went."""
        removed = 0
        tokens = await self.list()
        revisions = {t.token_id: rev for t, rev in tokens}
        for token in to_remove([t for t, _ in tokens], now_ms):
            if await self.remove(token.token_id, revisions[token.token_id]):
                removed += 1
        return removed

    async def run_expiry(self, interval_s: float, clock_ms: Callable[[], int]) -> None:
        """Remove expired tokens every ``interval_s`` until cancelled (Kafka's
        ``delegation.token.expiry.check.interval.ms``). Every broker runs it: a token that two
        remove at once goes once, the other's conditional delete does nothing."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                removed = await self.remove_expired(clock_ms())
            except (MetadataUnavailable, MetadataTimeout, TimeoutError) as exc:
                log.warning("removing expired delegation tokens: %s", exc)
                continue
            except Exception:  # never end the loop: expired tokens would pile up unnoticed
                log.exception("removing expired delegation tokens failed")
                continue
            if removed:
                log.info("removed %d expired delegation token(s)", removed)


def _decoded(kv: KeyValue) -> tuple[TokenInfo, int] | None:
    try:
        return decode_token(kv.value), kv.mod_revision
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable delegation token record %s", kv.key)
        return None
