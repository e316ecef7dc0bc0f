"""Listeners as Kafka names them: ``NAME://host:port``, each with a security protocol.

A broker may listen on several ports at once, e.g. a PLAINTEXT one for the proxy and pods inside
the cluster and a SASL_SSL one for clients outside it (``listeners``, ``advertised.listeners``
and ``listener.security.protocol.map`` in Kafka). Everything here is pure: the settings' strings
are parsed and checked once at start-up, and a bad value is a clear configuration error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL"
DEFAULT_LISTENER_NAME = "PLAINTEXT"


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class ClientAuth(StrEnum):
    """Kafka's ``ssl.client.auth``: whether a TLS client must present a certificate."""

    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Listener:
    """One port a broker serves: where it binds, what it advertises, how clients prove who
    they are. ``advertised_host``/``advertised_port`` None: derived from the bind address."""

    name: str
    host: str
    port: int
    protocol: SecurityProtocol
    advertised_host: str | None = None
    advertised_port: int | None = None
    client_auth: ClientAuth = ClientAuth.NONE


_ENDPOINT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)://(?P<host>\[[^\]]*\]|[^:/]*):(?P<port>\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def parse_endpoints(text: str) -> list[tuple[str, str, int]]:
    """``NAME://host:port,...`` as (NAME, host, port); an empty host means every interface."""
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        match = _ENDPOINT.match(item)
        if match is None:
            raise ValueError(f"listener {item!r} is not NAME://host:port")
        host = match["host"].strip("[]")
        port = int(match["port"])
        if port > 65535:
            raise ValueError(f"listener {item!r}: port out of range")
        endpoints.append((match["name"].upper(), host, port))
    names = [name for name, _, _ in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"listener names must be unique: {text!r}")
    return endpoints


def parse_name_map(text: str, what: str) -> dict[str, str]:
    """``NAME:VALUE,...`` (the protocol map, per-listener client auth)."""
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition(":")
        if not sep or not _NAME.match(name.strip()) or not value.strip():
            raise ValueError(f"{what} entry {item!r} is not NAME:VALUE")
        mapping[name.strip().upper()] = value.strip()
    return mapping


def parse_protocol_map(text: str) -> dict[str, SecurityProtocol]:
    mapping = parse_name_map(text, "listener security protocol map")
    try:
        return {name: SecurityProtocol(value.upper()) for name, value in mapping.items()}
    except ValueError as exc:
        raise ValueError(f"unknown security protocol in {text!r}: {exc}") from exc


def plan_listeners(
    listeners: str | None,
    advertised_listeners: str | None,
    protocol_map: str,
    client_auth: ClientAuth,
    client_auth_overrides: str,
    default: Listener,
) -> list[Listener]:
    """The listeners a broker opens. Without ``listeners``, ``default`` alone (one PLAINTEXT
    listener from the ``listener`` section, as before listeners existed)."""
    if not listeners:
        return [default]
    protocols = parse_protocol_map(protocol_map)
    advertised = {
        name: (host, port) for name, host, port in parse_endpoints(advertised_listeners or "")
    }
    auth = {
        name: ClientAuth(value.lower())
        for name, value in parse_name_map(client_auth_overrides, "client auth").items()
    }
    plan = []
    for name, host, port in parse_endpoints(listeners):
        if name not in protocols:
            raise ValueError(f"listener {name} has no entry in the security protocol map")
        ad_host, ad_port = advertised.get(name, (None, None))
        plan.append(
            Listener(
                name=name,
                host=host or "0.0.0.0",
                port=port,
                protocol=protocols[name],
                advertised_host=ad_host or None,
                advertised_port=ad_port or None,
                client_auth=auth.get(name, client_auth),
            )
        )
    unknown = set(advertised) - {listener.name for listener in plan}
    if unknown:
        raise ValueError(f"advertised listeners {sorted(unknown)} are not among the listeners")
    unknown_auth = set(auth) - {listener.name for listener in plan}
    if unknown_auth:
        raise ValueError(f"client auth given for unknown listeners {sorted(unknown_auth)}")
    ports = [listener.port for listener in plan if listener.port]
    if len(set(ports)) != len(ports):
        raise ValueError(f"two listeners bind the same port: {listeners!r}")
    return plan


def internal_listener(plan: list[Listener], name: str | None) -> Listener:
    """The listener registered as the broker's main address (what the proxy connects to):
    the one named, else the first."""
    if name is None:
        return plan[0]
    for listener in plan:
        if listener.name == name.upper():
            return listener
    raise ValueError(f"internal listener {name!r} is not among the listeners")


ALL_INTERFACES = frozenset({"0.0.0.0", "::", ""})


def advertised_host(host: str, advertised: str | None, host_name: Callable[[], str]) -> str:
    """The host clients are told to connect to. A listener bound to every interface must not
    advertise loopback: clients on other machines would be sent to themselves (as Kafka does,
    it advertises this machine's fully qualified name instead)."""
    if advertised:
        return advertised
    if host in ALL_INTERFACES:
        return host_name()
    return host


def advertised_address(
    listener: Listener, bound_port: int, host_name: Callable[[], str]
) -> tuple[str, int]:
    """What clients of ``listener`` are told to connect to."""
    host = advertised_host(listener.host, listener.advertised_host, host_name)
    return host, listener.advertised_port or bound_port


# --- the settings' listeners ------------------------------------------------------------------
# The broker's and the proxy's settings describe their listeners with the same fields; these
# protocols name those fields so that one function plans and checks both.


class BindSection(Protocol):
    """The ``listener`` section: the one PLAINTEXT listener used when ``listeners`` is unset."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def advertised_host(self) -> str | None: ...

    @property
    def advertised_port(self) -> int | None: ...


class TlsSection(Protocol):
    """The ``tls`` section: the certificate of TLS listeners and who must present one."""

    @property
    def cert_file(self) -> Path | None: ...

    @property
    def key_file(self) -> Path | None: ...

    @property
    def ca_file(self) -> Path | None: ...

    @property
    def client_auth(self) -> ClientAuth: ...

    @property
    def client_auth_overrides(self) -> str: ...


class ListenerConfig(Protocol):
    """The listener fields the broker's and the proxy's settings share."""

    @property
    def listener(self) -> BindSection: ...

    @property
    def listeners(self) -> str | None: ...

    @property
    def advertised_listeners(self) -> str | None: ...

    @property
    def listener_security_protocol_map(self) -> str: ...

    @property
    def tls(self) -> TlsSection: ...


def configured_listeners(config: ListenerConfig) -> list[Listener]:
    """Every listener ``config`` opens: ``listeners`` parsed, or else one PLAINTEXT listener
    from the ``listener`` section (as before listeners existed)."""
    section = config.listener
    default = Listener(
        name=DEFAULT_LISTENER_NAME,
        host=section.host,
        port=section.port,
        protocol=SecurityProtocol.PLAINTEXT,
        advertised_host=section.advertised_host,
        advertised_port=section.advertised_port,
    )
    return plan_listeners(
        config.listeners,
        config.advertised_listeners,
        config.listener_security_protocol_map,
        config.tls.client_auth,
        config.tls.client_auth_overrides,
        default,
    )


def check_listener_tls(plan: list[Listener], tls: TlsSection) -> None:
    """Raise ValueError when a TLS listener lacks its certificate, or client authentication
    its CA (the broker's and the proxy's settings both check this at start-up)."""
    tls_listeners = [listener for listener in plan if listener.protocol.uses_tls]
    if tls_listeners and not (tls.cert_file and tls.key_file):
        raise ValueError("an SSL or SASL_SSL listener needs tls.cert_file and tls.key_file")
    if any(item.client_auth != ClientAuth.NONE for item in tls_listeners) and not tls.ca_file:
        raise ValueError("client certificate authentication needs tls.ca_file")
