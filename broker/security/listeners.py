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


def advertised_address(
    listener: Listener, bound_port: int, host_name: Callable[[], str]
) -> tuple[str, int]:
    """What clients of ``listener`` are told to connect to. A listener bound to every
    interface must not advertise loopback: clients elsewhere would be sent to themselves."""
    if listener.advertised_host:
        host = listener.advertised_host
    elif listener.host in ALL_INTERFACES:
        host = host_name()
    else:
        host = listener.host
    return host, listener.advertised_port or bound_port
