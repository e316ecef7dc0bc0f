"""The client side of SASL PLAIN and SCRAM-SHA-256/512, for the proxy logging in to brokers.

Pure: the messages to send and the checks of the server's answers (RFC 5802/7677). The server
side (``scram``) and this share the key derivation. The client checks the server's final
signature too, so a proxy never forwards to a broker that does not know its credential.
"""

from __future__ import annotations

import base64
import hmac
import secrets

from kafscale.broker.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    AuthenticationFailed,
    ScramMechanism,
    credential_from_salted,
    salted_password,
)


def plain_message(username: str, password: str) -> bytes:
    """PLAIN (RFC 4616) without an authorization id."""
    return b"\x00" + username.encode() + b"\x00" + password.encode()


def _escape_name(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    """One SCRAM login: client-first, then client-final for the server-first, then the
    server-final checked. Raises :class:`AuthenticationFailed` on a bad server answer."""

    GS2_HEADER = "n,,"

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        nonce: str | None = None,
        token_auth: bool = False,
    ) -> None:
        self.mechanism = mechanism
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._bare = f"n={_escape_name(username)},r={self._nonce}"
        if token_auth:  # a delegation token: user = token id, password = its HMAC (base64)
            self._bare += ",tokenauth=true"
        self._server_signature: bytes | None = None

    def first_message(self) -> bytes:
        return (self.GS2_HEADER + self._bare).encode()

    def final_message(self, server_first: bytes) -> bytes:
        text = server_first.decode(errors="replace")
        attributes = dict(item.partition("=")[::2] for item in text.split(","))
        nonce, salt_b64, iterations_text = (attributes.get(k, "") for k in ("r", "s", "i"))
        if "e" in attributes:
            raise AuthenticationFailed(f"the server refused: {attributes['e']}")
        if not nonce.startswith(self._nonce) or nonce == self._nonce:
            raise AuthenticationFailed("the server's SCRAM nonce does not extend ours")
        try:
            salt = base64.b64decode(salt_b64, validate=True)
            iterations = int(iterations_text)
        except ValueError as exc:
            raise AuthenticationFailed("malformed SCRAM server-first message") from exc
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise AuthenticationFailed(f"SCRAM iterations {iterations} out of bounds")
        digest = self.mechanism.digest
        salted = salted_password(self._password, salt, iterations, self.mechanism)
        credential = credential_from_salted(salted, salt, iterations, self.mechanism)
        binding = base64.b64encode(self.GS2_HEADER.encode()).decode()
        without_proof = f"c={binding},r={nonce}"
        auth_message = f"{self._bare},{text},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", digest)
        signature = hmac.digest(credential.stored_key, auth_message, digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = hmac.digest(credential.server_key, auth_message, digest)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def check_final(self, server_final: bytes) -> None:
        if self._server_signature is None:
            raise AuthenticationFailed("SCRAM server-final before server-first")
        expected = b"v=" + base64.b64encode(self._server_signature)
        if not hmac.compare_digest(server_final, expected):
            raise AuthenticationFailed("the server's SCRAM signature is wrong")
