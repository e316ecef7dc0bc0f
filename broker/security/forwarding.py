"""Forwarded principals: how the proxy tells a broker on whose behalf a request comes.

The proxy authenticates its clients (TLS, SASL) and forwards their requests over its own
connections to the brokers. Each forwarded request travels inside a KIP-590 ``Envelope``
(API 58) that carries the client's principal (Kafka's serialized ``DefaultPrincipalData``) and
the client's IP address (4 or 16 bytes, as Kafka's ``InetAddress.getAddress()``). A broker runs
the inner request as that principal from that address, so its ACLs apply to the client, not to
the proxy, and it trusts an Envelope only from a connection whose own principal it allows
``CLUSTER_ACTION`` on the cluster (or a super user). Pure: the byte helpers for the address.
"""

from __future__ import annotations

import ipaddress

ENVELOPE_KEY = 58
NOT_IN_ENVELOPE = frozenset({17, 36, 58})
"""APIs an Envelope must not carry: a login (SaslHandshake, SaslAuthenticate) belongs to the
connection, and Envelopes do not nest."""


def address_bytes(host: str) -> bytes:
    """The client's address as an Envelope carries it; empty when it is not an IP address
    (a Unix socket): the broker then matches only ACLs for every host."""
    try:
        return ipaddress.ip_address(host.strip("[]")).packed
    except ValueError:
        return b""


def address_text(data: bytes) -> str:
    """The address an Envelope carries, as ACL hosts name it (``*`` when none was given)."""
    if not data:
        return "*"
    if len(data) not in (4, 16):
        raise ValueError(f"client address of {len(data)} bytes")
    return str(ipaddress.ip_address(data))


def peer_host(peer: str) -> str:
    """The host part of a connection's ``host:port`` peer name."""
    return (peer.rpartition(":")[0] or peer).strip("[]")
