"""Enforcing byte-rate quotas on one broker: which bytes count, whose quota, how long to mute.

As in Kafka, a quota is per broker. Produce requests count their size on the wire against
``producer_byte_rate``, Fetch responses the record bytes they carry against
``consumer_byte_rate``; the quota is the one Kafka's precedence order picks for the
connection's user (its SASL or certificate principal's name, ``ANONYMOUS`` otherwise) and the
client id of the request header. A request over the quota is answered at once with
``throttle_time_ms`` and its connection reads no further request for that long (KIP-219);
the throttle is also counted in the broker's metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.quotas.entities import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    Entity,
    resolve,
)
from kafscale.broker.quotas.throttle import Throttles

PRODUCE, FETCH = 0, 1
QUOTA_KEYS = {PRODUCE: PRODUCER_BYTE_RATE, FETCH: CONSUMER_BYTE_RATE}


def user_of(principal: str) -> str:
    """Kafka's quota user: the principal's name (``User:alice`` is ``alice``)."""
    _, _, name = principal.partition(":")
    return name or principal


def fetched_bytes(body: Mapping[str, Any] | None) -> int:
    """Record bytes a Fetch response body carries (what ``consumer_byte_rate`` counts)."""
    if not body:
        return 0
    return sum(
        len(partition.get("records") or b"")
        for topic in body.get("responses", ())
        for partition in topic.get("partitions", ())
    )


class QuotaEnforcer:
    """The broker's buckets over its watched quotas."""

    def __init__(
        self,
        quotas: Callable[[], Mapping[Entity, Mapping[str, float]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._quotas = quotas
        self._clock = clock
        self.throttles = Throttles()

    @property
    def enforcing(self) -> bool:
        """Whether any quota is set (without one, nothing is counted: the common case)."""
        return bool(self._quotas())

    def charge(self, api_key: int, principal: str, client_id: str | None, nbytes: int) -> int:
        """Count ``nbytes`` of a Produce or Fetch; the throttle in milliseconds (0: none)."""
        key = QUOTA_KEYS.get(api_key)
        quotas = self._quotas()
        if key is None or not quotas or nbytes <= 0:
            return 0
        user = user_of(principal)
        resolved = resolve(quotas, key, user, client_id or "")
        if resolved is None:
            return 0
        bucket = (key, *resolved.tags)
        throttle_ms = self.throttles.record(bucket, resolved.limit, nbytes, self._clock())
        if throttle_ms:
            METRICS.throttled(key, throttle_ms)
        return throttle_ms
