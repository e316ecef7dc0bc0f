"""SCRAM credentials in etcd, one key per user and mechanism (``keys.scram_credential_key``).

The value is JSON with what Kafka keeps in its metadata log: base64 salt, StoredKey and
ServerKey, and the iteration count. The password itself is never stored. Brokers read a
credential when a client authenticates (one etcd get per login, no cache to go stale: a
deleted user cannot log in on the next connection).
"""

from __future__ import annotations

import base64
import json

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.security.scram import ScramCredential, ScramMechanism


def encode_credential(credential: ScramCredential) -> bytes:
    return json.dumps(
        {
            "salt": base64.b64encode(credential.salt).decode(),
            "stored_key": base64.b64encode(credential.stored_key).decode(),
            "server_key": base64.b64encode(credential.server_key).decode(),
            "iterations": credential.iterations,
        }
    ).encode()


def decode_credential(data: bytes) -> ScramCredential:
    document = json.loads(data)
    return ScramCredential(
        salt=base64.b64decode(document["salt"]),
        iterations=int(document["iterations"]),
        stored_key=base64.b64decode(document["stored_key"]),
        server_key=base64.b64decode(document["server_key"]),
    )


class CredentialStore:
    """Read and write the users' SCRAM credentials of one cluster."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self._etcd = etcd
        self._cluster = cluster

    async def get(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        kv = await self._etcd.get(
            keys.scram_credential_key(self._cluster, user, mechanism.sasl_name)
        )
        return None if kv is None else decode_credential(kv.value)

    async def put(self, user: str, mechanism: ScramMechanism, credential: ScramCredential) -> None:
        key = keys.scram_credential_key(self._cluster, user, mechanism.sasl_name)
        await self._etcd.put(key, encode_credential(credential))

    async def delete(self, user: str, mechanism: ScramMechanism) -> bool:
        key = keys.scram_credential_key(self._cluster, user, mechanism.sasl_name)
        return await self._etcd.delete(key)

    async def list(self) -> dict[str, dict[ScramMechanism, int]]:
        """Every user with its mechanisms and their iteration counts."""
        users: dict[str, dict[ScramMechanism, int]] = {}
        for kv in await self._etcd.get_prefix(keys.users_prefix(self._cluster)):
            parsed = keys.user_from_key(self._cluster, kv.key)
            mechanism = ScramMechanism.from_sasl_name(parsed[1]) if parsed else None
            if parsed is None or mechanism is None:
                continue
            try:
                iterations = decode_credential(kv.value).iterations
            except (ValueError, KeyError, TypeError):
                continue
            users.setdefault(parsed[0], {})[mechanism] = iterations
        return users
