"""SCRAM-SHA-256/512 (RFC 5802, RFC 7677) on the server side, and PLAIN against the same store.

Credentials are what Kafka stores: salt, iterations, StoredKey = H(HMAC(SaltedPassword,
"Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"); never the password. Kafka's
admin clients send AlterUserScramCredentials with the salted password already derived, so the
broker sees no password either way. PLAIN (RFC 4616) is checked against these credentials:
the given password is salted with the stored salt and iterations and its StoredKey compared,
so one user store serves every mechanism (a deliberate choice: no second password file).

Everything here is pure: the exchange is a small state machine fed the client's messages and
a credential looked up by its caller.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from enum import IntEnum

MIN_ITERATIONS = 4096  # Kafka's bounds for SCRAM-SHA-256/512
MAX_ITERATIONS = 16384


class ScramMechanism(IntEnum):
    """The numbers Kafka's AlterUserScramCredentials and DescribeUserScramCredentials use."""

    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def sasl_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def digest(self) -> str:
        return "sha256" if self is ScramMechanism.SCRAM_SHA_256 else "sha512"

    @classmethod
    def from_sasl_name(cls, name: str) -> ScramMechanism | None:
        return {m.sasl_name: m for m in cls}.get(name.upper())


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class AuthenticationFailed(Exception):
    """The client's proof or password is wrong, or its message is malformed."""


def salted_password(
    password: bytes, salt: bytes, iterations: int, mechanism: ScramMechanism
) -> bytes:
    """Hi() of RFC 5802: PBKDF2 with HMAC of the mechanism's hash."""
    return hashlib.pbkdf2_hmac(mechanism.digest, password, salt, iterations)


def credential_from_salted(
    salted: bytes, salt: bytes, iterations: int, mechanism: ScramMechanism
) -> ScramCredential:
    client_key = hmac.digest(salted, b"Client Key", mechanism.digest)
    stored_key = hashlib.new(mechanism.digest, client_key).digest()
    server_key = hmac.digest(salted, b"Server Key", mechanism.digest)
    return ScramCredential(salt, iterations, stored_key, server_key)


def new_credential(
    password: str, mechanism: ScramMechanism, iterations: int = MIN_ITERATIONS
) -> ScramCredential:
    """A credential for ``password`` with a fresh random salt (``kafscale users create``)."""
    salt = secrets.token_bytes(32)
    salted = salted_password(password.encode(), salt, iterations, mechanism)
    return credential_from_salted(salted, salt, iterations, mechanism)


def check_password(password: bytes, credential: ScramCredential, mechanism: ScramMechanism) -> bool:
    """Whether ``password`` derives ``credential``'s StoredKey (PLAIN against SCRAM)."""
    salted = salted_password(password, credential.salt, credential.iterations, mechanism)
    derived = credential_from_salted(salted, credential.salt, credential.iterations, mechanism)
    return hmac.compare_digest(derived.stored_key, credential.stored_key)


def parse_plain(message: bytes) -> tuple[str, str, bytes]:
    """(authzid, username, password) of a PLAIN message: ``authzid NUL user NUL password``."""
    parts = message.split(b"\x00")
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise AuthenticationFailed("malformed PLAIN message")
    try:
        return parts[0].decode(), parts[1].decode(), parts[2]
    except UnicodeDecodeError as exc:
        raise AuthenticationFailed("PLAIN names are not UTF-8") from exc


@dataclass(frozen=True, slots=True)
class ClientFirst:
    gs2_header: str
    username: str
    client_nonce: str
    bare: str
    token_auth: bool


def _unescape_name(name: str) -> str:
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("bad escape in SCRAM user name")
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(text: str, extensions_from: int | None = None) -> list[tuple[str, str]]:
    """``k=v,...`` with one-letter keys (RFC 5802); from item ``extensions_from`` on, Kafka's
    SCRAM extensions (``tokenauth=true``), whose keys are words."""
    pairs = []
    for index, item in enumerate(text.split(",")):
        key, sep, value = item.partition("=")
        word_keys = extensions_from is not None and index >= extensions_from
        if not sep or not key or (len(key) != 1 and not (word_keys and key.isalnum())):
            raise AuthenticationFailed(f"malformed SCRAM attribute {item[:20]!r}")
        pairs.append((key, value))
    return pairs


def parse_client_first(message: bytes) -> ClientFirst:
    """``gs2-header client-first-message-bare`` (``n,,n=user,r=nonce[,ext...]``)."""
    try:
        text = message.decode()
    except UnicodeDecodeError as exc:
        raise AuthenticationFailed("SCRAM message is not UTF-8") from exc
    parts = text.split(",", 2)
    if len(parts) != 3 or parts[0] not in ("n", "y") or parts[0].startswith("p"):
        raise AuthenticationFailed("SCRAM channel binding is not supported")
    gs2_header = f"{parts[0]},{parts[1]},"
    bare = parts[2]
    attributes = _attributes(bare, extensions_from=2)
    if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
        raise AuthenticationFailed("SCRAM client-first message must start with n= and r=")
    extensions = dict(attributes[2:])
    username = _unescape_name(attributes[0][1])
    if not username or not attributes[1][1]:
        raise AuthenticationFailed("empty SCRAM user name or nonce")
    token_auth = extensions.get("tokenauth", "").lower() == "true"  # Kafka's KIP-48 extension
    return ClientFirst(gs2_header, username, attributes[1][1], bare, token_auth)


class ScramExchange:
    """One SCRAM authentication, server side: client-first → server-first, client-final →
    server-final. A wrong proof raises :class:`AuthenticationFailed`."""

    def __init__(
        self,
        mechanism: ScramMechanism,
        first: ClientFirst,
        credential: ScramCredential,
        server_nonce: str | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.first = first
        self._credential = credential
        self.nonce = first.client_nonce + (server_nonce or secrets.token_urlsafe(24))
        self.server_first = (
            f"r={self.nonce},s={base64.b64encode(credential.salt).decode()},"
            f"i={credential.iterations}"
        )

    def server_first_message(self) -> bytes:
        return self.server_first.encode()

    def final(self, message: bytes) -> bytes:
        """Check the client-final message; return the server-final message (``v=...``)."""
        try:
            text = message.decode()
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from exc
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("SCRAM client-final message has no proof")
        attributes = dict(_attributes(without_proof))
        expected_binding = base64.b64encode(self.first.gs2_header.encode()).decode()
        if attributes.get("c") != expected_binding:
            raise AuthenticationFailed("SCRAM channel binding does not match")
        # Kafka checks that the nonce ends with the one it sent, not that it equals it:
        # librdkafka before 2.1 (Debian's kcat) prefixes the client nonce once more.
        if not attributes.get("r", "").endswith(self.nonce):
            raise AuthenticationFailed("SCRAM nonce does not match")
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError as exc:
            raise AuthenticationFailed("SCRAM proof is not base64") from exc
        auth_message = f"{self.first.bare},{self.server_first},{without_proof}".encode()
        digest = self.mechanism.digest
        credential = self._credential
        signature = hmac.digest(credential.stored_key, auth_message, digest)
        if len(proof) != len(signature):
            raise AuthenticationFailed("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(digest, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed("invalid credentials")
        server_signature = hmac.digest(credential.server_key, auth_message, digest)
        return b"v=" + base64.b64encode(server_signature)
