"""What a producer was told when a Produce was not acked, in the broker's log.

A fault campaign (bench/README.md, "the second run's 1,110 records") had an idempotent
producer whose records to one partition were never acked for 22 s while the partition's owner
logged nothing: whether that broker refused the requests (NOT_LEADER_OR_FOLLOWER, a sequence
error), or took them and never answered in time (REQUEST_TIMED_OUT), was not in any log, and
INFO logged no refusal at all. Now every partition answered with an error in a Produce response
is logged at INFO, with its code and the reason the broker had, limited to one line per
partition per 10 s (``log_limit.REFUSAL_LOG``), then a count of the lines left out: a producer
retries a refused batch every ~100 ms for minutes.
"""

from __future__ import annotations

import logging

from kafscale.broker.observability.log_limit import REFUSAL_LOG, ClientEvent, LogLimiter, named
from kafscale.broker.protocol.errors import ErrorCode

log = logging.getLogger(__name__)


def refusal_line(topic: str, partition: int, code: ErrorCode, reason: str, peer: str) -> str:
    """The line for one partition's error in a Produce response (pure)."""
    because = f": {reason}" if reason else ""
    return f"produce to {topic}-{partition} from {peer} answered {code.name}{because}"


def log_refusal(
    topic: str,
    partition: int,
    code: ErrorCode,
    reason: str,
    peer: str,
    limiter: LogLimiter = REFUSAL_LOG,
) -> None:
    """Log that ``peer`` was answered ``code`` for a partition (``ErrorCode.NONE``: nothing),
    within the limit of one line per partition per window."""
    if code == ErrorCode.NONE:
        return
    line = refusal_line(topic, partition, code, reason, peer)
    key = named("partition", f"{topic}-{partition}")
    limiter.log(log, logging.INFO, ClientEvent.PRODUCE_REFUSED, key, "%s", line)
