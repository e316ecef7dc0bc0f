"""The SASL state of one connection on a SASL listener, as Kafka's authenticator keeps it.

Before authentication a SASL connection may send ApiVersions, SaslHandshake and
SaslAuthenticate only; anything else ends the connection (Kafka closes it too: its client
treats that as an authentication failure). The handshake picks a mechanism; SaslAuthenticate
then carries the mechanism's messages until it succeeds (the principal becomes
``User:<name>``) or fails (SASL_AUTHENTICATION_FAILED, and the connection is closed after the
answer). Pure: the credential lookup is passed in.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from kafscale.broker.security.scram import (
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    ScramMechanism,
    check_password,
    parse_client_first,
    parse_plain,
)

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
ALLOWED_BEFORE_AUTHENTICATION = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

CredentialLookup = Callable[[str, ScramMechanism], Awaitable[ScramCredential | None]]


class SaslStage(enum.Enum):
    HANDSHAKE = "handshake"  # waiting for SaslHandshake
    AUTHENTICATE = "authenticate"  # mechanism chosen, SaslAuthenticate expected
    DONE = "done"  # authenticated


class IllegalSaslState(Exception):
    """A SASL request arrived at a stage that does not expect it."""


@dataclass(slots=True)
class SaslSession:
    enabled_mechanisms: tuple[str, ...]
    stage: SaslStage = SaslStage.HANDSHAKE
    mechanism: str | None = None
    user: str | None = None
    _scram: ScramExchange | None = field(default=None, repr=False)

    @property
    def authenticated(self) -> bool:
        return self.stage is SaslStage.DONE

    def handshake(self, mechanism: str) -> bool:
        """Choose ``mechanism``; False if it is not enabled (UNSUPPORTED_SASL_MECHANISM)."""
        if self.stage is not SaslStage.HANDSHAKE:
            raise IllegalSaslState("SaslHandshake after the handshake")
        if mechanism not in self.enabled_mechanisms:
            return False
        self.mechanism = mechanism
        self.stage = SaslStage.AUTHENTICATE
        return True

    async def authenticate(self, message: bytes, lookup: CredentialLookup) -> bytes:
        """One SaslAuthenticate step: the bytes to answer with. Raises
        :class:`AuthenticationFailed` (wrong credentials) or :class:`IllegalSaslState`."""
        if self.stage is not SaslStage.AUTHENTICATE or self.mechanism is None:
            raise IllegalSaslState("SaslAuthenticate before SaslHandshake")
        if self.mechanism == "PLAIN":
            return await self._plain(message, lookup)
        scram = ScramMechanism.from_sasl_name(self.mechanism)
        if scram is None:  # enabled but not implemented: refused at handshake in practice
            raise AuthenticationFailed(f"mechanism {self.mechanism} is not implemented")
        if self._scram is None:
            first = parse_client_first(message)
            if first.token_auth:
                raise AuthenticationFailed("delegation tokens are not supported")
            credential = await lookup(first.username, scram)
            if credential is None:
                raise AuthenticationFailed("invalid credentials")
            self._scram = ScramExchange(scram, first, credential)
            return self._scram.server_first_message()
        final = self._scram.final(message)
        self._finish(self._scram.first.username)
        return final

    async def _plain(self, message: bytes, lookup: CredentialLookup) -> bytes:
        authzid, user, password = parse_plain(message)
        if authzid and authzid != user:
            raise AuthenticationFailed("PLAIN authorization id differs from the user name")
        for scram in (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256):
            credential = await lookup(user, scram)
            if credential is not None:
                # PBKDF2 takes milliseconds of CPU: off the event loop, or a client sending
                # PLAIN logins in a loop would stall every other connection.
                if not await asyncio.to_thread(check_password, password, credential, scram):
                    break
                self._finish(user)
                return b""
        raise AuthenticationFailed("invalid credentials")

    def _finish(self, user: str) -> None:
        self.user = user
        self.stage = SaslStage.DONE
        self._scram = None


def principal_of(user: str) -> str:
    return f"User:{user}"
