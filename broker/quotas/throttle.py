"""Per-broker byte-rate enforcement: one token bucket per quota entity and key.

Kafka measures a rate over a window of samples and answers a client over its quota with the
time it must stay quiet (KIP-219: the response goes out at once, then the channel is muted for
that long). A token bucket gives the same long-run rate with one pure step per request: it
refills at the quota, holds at most ``burst_s`` seconds of it, every request's bytes are taken
(the bucket may go into debt) and a debt of D bytes is D / quota seconds of throttle, so the
achieved rate stays at the quota. One response asks for at most ``MAX_THROTTLE_MS`` (the debt
is bounded by as much): a single request larger than that many seconds of quota (a 1 MiB
batch against a quota under ~35 KB/s) is let through once per ``MAX_THROTTLE_MS``.

Memory is bounded: buckets idle for ``idle_s`` are dropped (their debt is paid by then unless
a huge request was capped), and beyond ``max_buckets`` the least recently used goes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

BURST_S = 1.0
"""Seconds of quota a quiet client may send at once before it is throttled."""
MAX_THROTTLE_MS = 30_000
"""The longest one response asks a client to wait (Kafka bounds it by its quota window)."""
IDLE_S = 600.0
MAX_BUCKETS = 10_000


@dataclass(slots=True)
class Bucket:
    tokens: float  # bytes that may still be sent now; negative: a debt
    updated_s: float


def take(bucket: Bucket, limit: float, nbytes: int, now_s: float, burst_s: float) -> int:
    """Take ``nbytes`` from ``bucket`` (refilled at ``limit`` bytes/s up to ``burst_s`` of
    it) and return the throttle in milliseconds: zero unless the bucket is in debt."""
    elapsed = max(0.0, now_s - bucket.updated_s)
    refilled = min(limit * burst_s, bucket.tokens + elapsed * limit)
    bucket.tokens = max(refilled - nbytes, -limit * MAX_THROTTLE_MS / 1000)
    bucket.updated_s = now_s
    if bucket.tokens >= 0:
        return 0
    return min(MAX_THROTTLE_MS, max(1, round(-bucket.tokens / limit * 1000)))


BucketKey = tuple[str, str, str]
"""(quota key, user tag, client-id tag)."""


class Throttles:
    """The buckets of one broker, bounded in number."""

    def __init__(
        self, burst_s: float = BURST_S, idle_s: float = IDLE_S, max_buckets: int = MAX_BUCKETS
    ) -> None:
        self._burst_s = burst_s
        self._idle_s = idle_s
        self._max_buckets = max_buckets
        self._buckets: OrderedDict[BucketKey, Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def record(self, key: BucketKey, limit: float, nbytes: int, now_s: float) -> int:
        """Count ``nbytes`` against ``key``'s quota of ``limit`` bytes/s; the throttle (ms)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(limit * self._burst_s, now_s)
            self._evict(now_s)
        else:
            self._buckets.move_to_end(key)
        return take(bucket, limit, nbytes, now_s, self._burst_s)

    def _evict(self, now_s: float) -> None:
        while len(self._buckets) > self._max_buckets:
            self._buckets.popitem(last=False)
        while self._buckets:
            oldest = next(iter(self._buckets.values()))
            if now_s - oldest.updated_s < self._idle_s:
                break
            self._buckets.popitem(last=False)
