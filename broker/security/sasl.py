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
TokenLookup = Callable[[str, ScramMechanism], Awaitable[tuple[ScramCredential, str] | None]]
"""A delegation token's SCRAM credential and owner by token id (None: unknown or expired)."""


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
    token_authenticated: bool = False  # logged in with a delegation token (user: its owner)
    _scram: ScramExchange | None = field(default=None, repr=False)
    _token_owner: str | None = field(default=None, repr=False)

    @property
    def authenticated(self) -> bool:
        return self.stage is SaslStage.DONE

    @property
    def principal(self) -> str | None:
        """Who logged in: ``User:<name>``, or a token's owner."""
        if self.user is None or self.stage is not SaslStage.DONE:
            return None
        return self.user if self.token_authenticated else principal_of(self.user)

    def handshake(self, mechanism: str) -> bool:
        """Choose ``mechanism``; False if it is not enabled (UNSUPPORTED_SASL_MECHANISM)."""
        if self.stage is not SaslStage.HANDSHAKE:
            raise IllegalSaslState("SaslHandshake after the handshake")
        if mechanism not in self.enabled_mechanisms:
            return False
        self.mechanism = mechanism
        self.stage = SaslStage.AUTHENTICATE
        return True

    async def authenticate(
        self, message: bytes, lookup: CredentialLookup, tokens: TokenLookup | None = None
    ) -> bytes:
        """One SaslAuthenticate step: the bytes to answer with. Raises
        :class:`AuthenticationFailed` (wrong credentials) or :class:`IllegalSaslState`.
        A SCRAM login with ``tokenauth=true`` is checked against a delegation token
        (``tokens``; None: tokens are off) and becomes its owner."""
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
                credential = await self._token_credential(first.username, scram, tokens)
            else:
                credential = await lookup(first.username, scram)
            if credential is None:
                raise AuthenticationFailed("invalid credentials")
            self._scram = ScramExchange(scram, first, credential)
            return self._scram.server_first_message()
        final = self._scram.final(message)
        owner = self._token_owner
        self._finish(self._scram.first.username if owner is None else owner)
        self.token_authenticated = owner is not None
        return final

    async def _token_credential(
        self, token_id: str, scram: ScramMechanism, tokens: TokenLookup | None
    ) -> ScramCredential | None:
        if tokens is None:
            raise AuthenticationFailed("delegation tokens are not enabled")
        found = await tokens(token_id, scram)
        if found is None:
            raise AuthenticationFailed("unknown or expired delegation token")
        credential, self._token_owner = found
        return credential

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
        """``user`` is a name (``alice``) or, for a token login, the owner's principal."""
        self.user = user
        self.stage = SaslStage.DONE
        self._scram = None


def principal_of(user: str) -> str:
    return f"User:{user}"
