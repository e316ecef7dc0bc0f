"""When the next flush round starts: group commit, bounded by a request budget.

Pure decision, no I/O, the clock passed in. A round of everything buffered starts as soon as
there is data and the previous round's upload has been handed off to its commit (rounds
pipeline: one uploads while the previous one commits). An ack therefore costs one PUT plus one
etcd commit instead of a wait for a timer, and batches that arrive while a round uploads gather
for the next one: under load rounds grow instead of multiplying, and a client that keeps five
requests in flight finds them all in the next round instead of queued behind four rounds of one
request each. What else holds a round back:

* ``coalesce_s``: how long the first batch of a round waits for others to join it;
* ``min_interval_s``: the shortest time between the starts of two rounds of everything (the
  broker's start counts as one), which bounds the PUT requests a broker makes: each partition
  with data is one PUT per round, so at most ``1 / min_interval_s`` PUTs per second per
  partition, plus one per filled segment. Object stores bill per request; a local directory
  does not, so its default is 0;
* ``max_in_flight``: rounds uploading or committing at once;
* ``max_uploading``: rounds uploading at once, by store. On S3, two: a round may start while
  another uploads, so one slow PUT does not hold back the next round (the minimum interval
  still bounds the rounds; rounds that finish uploading while an earlier one commits are
  committed together with it, in one etcd transaction, see ``flusher``). On a local directory,
  one, and a round hands its upload off only once the round before it committed: there the
  minimum interval is 0, and a second concurrent round made a round (~2.5 ms of broker CPU)
  per request instead of per two or three, for no gain in throughput or latency.

``max_wait_s`` (``log.flush_interval_ms``) caps the first two: no batch waits longer than that for
its round to become due. A partition that has buffered a whole segment gets a round of whole
segments at once, interval or upload in progress or not (within ``max_in_flight``): that PUT is
as large as PUTs get, so it costs nothing to send it early. A handoff or shutdown flushes
everything at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafscale.broker.config import BrokerSettings, StorageKind

# The minimum interval between rounds where ``log.flush_min_interval_ms`` is not set. A local
# directory charges nothing per write. On S3, 20 ms keeps a busy partition at <= 50 PUTs/s
# (~$21.60 a day at $0.005 per 1,000 PUTs; the 100-ms tick before group commit: 10/s, $4.32)
# and adds at most 20 ms to an ack, less than a PUT's own p99 there (docs/performance.md).
DEFAULT_MIN_INTERVAL_MS = {StorageKind.LOCAL: 0.0, StorageKind.S3: 20.0}
# Rounds uploading at once, by store (see above). Measured on 2026-11-26, old and new code run
# alternately on one loaded machine: on S3 (moto) produce p99 at 1,000 records/s 159-343 ms
# with two against 744-1172 ms with one, same PUTs and CPU; on a local directory the Java
# client on its defaults gained nothing (8-11 against 5-13 MB/s) for 45 % more PUTs and 10-25 %
# more broker CPU per MiB.
MAX_UPLOADING = {StorageKind.LOCAL: 1, StorageKind.S3: 2}


@dataclass(frozen=True, slots=True)
class RoundPolicy:
    min_interval_s: float
    coalesce_s: float
    max_wait_s: float
    max_in_flight: int
    max_uploading: int = 1


def round_policy(settings: BrokerSettings, max_in_flight: int) -> RoundPolicy:
    """The broker's policy: the store's default interval unless one is set, capped by
    ``flush_interval_ms`` (the longest any batch waits)."""
    log = settings.log
    min_interval_ms = (
        DEFAULT_MIN_INTERVAL_MS[settings.storage.kind]
        if log.flush_min_interval_ms is None
        else float(log.flush_min_interval_ms)
    )
    return RoundPolicy(
        min_interval_s=min(min_interval_ms, log.flush_interval_ms) / 1000,
        coalesce_s=min(log.flush_coalesce_ms, log.flush_interval_ms) / 1000,
        max_wait_s=log.flush_interval_ms / 1000,
        max_in_flight=max_in_flight,
        max_uploading=MAX_UPLOADING[settings.storage.kind],
    )


@dataclass(frozen=True, slots=True)
class Start:
    """Start a round now: of everything buffered, or only of whole segments."""

    everything: bool


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to start before ``until`` (a loop time), or before something changes (None)."""

    until: float | None


RoundDecision = Start | Wait


def decide_round(
    policy: RoundPolicy,
    now: float,
    *,
    pending_since: float | None,
    segment_full: bool,
    everything_asked: bool,
    last_round_at: float | None,
    rounds_in_flight: int,
    rounds_uploading: int,
) -> RoundDecision:
    """What the flush loop does next.

    ``pending_since``: when the oldest batch no round has taken yet arrived (None: nothing is
    buffered); ``segment_full``: some partition has buffered a whole segment;
    ``everything_asked``: a handoff or shutdown wants everything flushed now;
    ``last_round_at``: when the last round of everything started (None: never);
    ``rounds_uploading``: rounds in flight that have not handed their upload to the commit yet.
    """
    if rounds_in_flight >= policy.max_in_flight:
        return Wait(None)  # a round finishing wakes the loop
    if everything_asked:
        return Start(everything=True)
    if pending_since is None:
        return Wait(None)
    due = pending_since + policy.coalesce_s
    if last_round_at is not None:
        due = max(due, last_round_at + policy.min_interval_s)
    due = min(due, pending_since + policy.max_wait_s)
    if now >= due and rounds_uploading < policy.max_uploading:
        return Start(everything=True)
    if segment_full:
        return Start(everything=False)
    return Wait(due if now < due else None)  # else: an upload's handoff wakes the loop
