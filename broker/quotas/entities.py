"""Quota entities and the pure decisions about them: validation, precedence, filters.

An entity is what Kafka's ``ClientQuotaEntity`` is: a user, a client id, or both, each either
named or the default (``None``, Kafka's ``<default>``). A quota *key* (``producer_byte_rate``)
is resolved for a connection (user, client id) on its own, through Kafka's precedence order
(``/config/users/<user>/clients/<client-id>`` first, ``/config/clients/<default>`` last), as
Kafka's ``DefaultQuotaCallback`` does; the entity that matched also decides which connections
share one rate (``quota_tags``): a quota on ``users/alice`` is shared by all of alice's
clients, one on ``users/<default>`` is each user's own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"

ENFORCED_KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE)
"""The keys KafScale stores and enforces (per broker, as Kafka does)."""
REFUSED_KEYS = (REQUEST_PERCENTAGE, CONTROLLER_MUTATION_RATE)
"""Keys Kafka knows that KafScale refuses rather than store without acting on them: there
are no request-handler threads whose time a percentage could be of, and topic mutations are
etcd writes, not a controller queue. Refused with INVALID_REQUEST and a message saying so."""

MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY = 0, 1, 2

Entity = tuple[tuple[str, str | None], ...]
"""((entity type, name or None for the default), ...): user first, then client id."""

_ORDER = {USER: 0, CLIENT_ID: 1}


class InvalidQuota(ValueError):
    """A request names an entity or key Kafka (or KafScale) refuses: INVALID_REQUEST."""


def make_entity(parts: Iterable[tuple[str, str | None]]) -> Entity:
    """The canonical entity of (type, name) pairs; refuses what Kafka refuses."""
    pairs = list(parts)
    types = [t for t, _ in pairs]
    if not pairs:
        raise InvalidQuota("an entity needs at least one of user, client-id")
    if len(set(types)) != len(types):
        raise InvalidQuota(f"entity type named twice in {types}")
    for entity_type, _ in pairs:
        if entity_type == IP:
            raise InvalidQuota("ip quotas (connection_creation_rate) are not supported")
        if entity_type not in _ORDER:
            raise InvalidQuota(f"unknown entity type {entity_type!r}")
    return tuple(sorted(pairs, key=lambda pair: _ORDER[pair[0]]))


def check_value(key: str, value: float) -> None:
    """Refuse a quota key or value that would not be enforced as asked."""
    if key in REFUSED_KEYS:
        raise InvalidQuota(
            f"{key} is not supported by KafScale (only {', '.join(ENFORCED_KEYS)} are enforced)"
        )
    if key not in ENFORCED_KEYS:
        raise InvalidQuota(f"unknown quota key {key!r}")
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise InvalidQuota(f"{key} must be a positive whole number of bytes per second")


def apply_ops(
    current: Mapping[str, float], ops: Sequence[tuple[str, float, bool]]
) -> dict[str, float]:
    """The entity's quotas after (key, value, remove) operations, each checked first."""
    keys = [key for key, _, _ in ops]
    if len(set(keys)) != len(keys):
        raise InvalidQuota(f"a quota key is named twice in {keys}")
    updated = dict(current)
    for key, value, remove in ops:
        if remove:
            if key not in ENFORCED_KEYS + REFUSED_KEYS:
                raise InvalidQuota(f"unknown quota key {key!r}")
            updated.pop(key, None)
        else:
            check_value(key, value)
            updated[key] = float(value)
    return updated


def precedence(user: str, client_id: str) -> list[Entity]:
    """The entities whose quota applies to (user, client id), most specific first (Kafka's
    documented order)."""
    return [
        ((USER, user), (CLIENT_ID, client_id)),
        ((USER, user), (CLIENT_ID, None)),
        ((USER, user),),
        ((USER, None), (CLIENT_ID, client_id)),
        ((USER, None), (CLIENT_ID, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    ]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A key's quota for a connection: bytes per second, and who shares that rate."""

    limit: float
    tags: tuple[str, str]  # (user, client id); "" where the matched entity has no such type


def resolve(
    quotas: Mapping[Entity, Mapping[str, float]], key: str, user: str, client_id: str
) -> Resolved | None:
    """The quota ``key`` of a connection, or None when no entity sets it."""
    for entity in precedence(user, client_id):
        values = quotas.get(entity)
        if values is not None and key in values:
            types = {t for t, _ in entity}
            tags = (user if USER in types else "", client_id if CLIENT_ID in types else "")
            return Resolved(values[key], tags)
    return None


@dataclass(frozen=True, slots=True)
class Component:
    """One component of a DescribeClientQuotas filter."""

    entity_type: str
    match_type: int
    match: str | None


def check_filter(components: Sequence[Component]) -> None:
    types = [c.entity_type for c in components]
    if len(set(types)) != len(types):
        raise InvalidQuota(f"entity type named twice in the filter: {types}")
    for component in components:
        if component.entity_type not in _ORDER and component.entity_type != IP:
            raise InvalidQuota(f"unknown entity type {component.entity_type!r}")
        if component.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_ANY):
            raise InvalidQuota(f"unknown match type {component.match_type}")
        if component.match_type == MATCH_EXACT and component.match is None:
            raise InvalidQuota("an exact match needs a name")


def filter_matches(components: Sequence[Component], strict: bool, entity: Entity) -> bool:
    """Kafka's filter semantics: every component must match the entity's part of its type
    (exact name, the default, or any name); ``strict`` also excludes entities with types the
    filter does not name."""
    parts = dict(entity)
    if strict and len(parts) != len(components):
        return False
    for component in components:
        if component.entity_type not in parts:
            return False
        name = parts[component.entity_type]
        if component.match_type == MATCH_EXACT and name != component.match:
            return False
        if component.match_type == MATCH_DEFAULT and name is not None:
            return False
    return True
