"""A retry loop's log (``retry_log``): the first failure, a summary at most every 30 s, the
recovery; never a line per attempt. Pure decisions with the clock passed in, and the thin
``RetryLog`` on a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata.etcd import read_prefix_until_answered
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.retry_log import (
    SUMMARY_INTERVAL_S,
    LogLine,
    RetryLog,
    RetryState,
    on_failure,
    on_success,
    reason,
)


def lines_of(events: list[tuple[float, bool]]) -> list[tuple[float, LogLine]]:
    """The lines a loop writes for ``events`` (time, succeeded?), with their times."""
    state, written = RetryState(), []
    for now_s, ok in events:
        if ok:
            state, line = on_success(state, now_s, "reconcile")
        else:
            state, line = on_failure(state, now_s, "reconcile", "etcd refused")
        if line is not None:
            written.append((now_s, line))
    return written


def test_a_minute_of_failures_each_second_writes_a_warning_and_two_summaries_then_recovery() -> (
    None
):
    events = [(float(t), False) for t in range(61)] + [(61.0, True)]
    assert [line for _, line in lines_of(events)] == [
        LogLine(logging.WARNING, "reconcile: etcd refused; retrying"),
        LogLine(logging.WARNING, "reconcile: still failing after 31 attempts / 30 s: etcd refused"),
        LogLine(logging.WARNING, "reconcile: still failing after 61 attempts / 60 s: etcd refused"),
        LogLine(logging.INFO, "reconcile: recovered after 61 failed attempts / 61 s"),
    ]


def test_successes_without_failures_write_nothing() -> None:
    assert lines_of([(float(t), True) for t in range(10)]) == []


def test_a_new_run_after_recovery_starts_with_a_warning_again() -> None:
    events = [(0.0, False), (1.0, False), (2.0, True), (3.0, False)]
    assert [line.message for _, line in lines_of(events)] == [
        "reconcile: etcd refused; retrying",
        "reconcile: recovered after 2 failed attempts / 2 s",
        "reconcile: etcd refused; retrying",
    ]


def test_the_first_failure_is_written_at_the_level_given() -> None:
    _, line = on_failure(RetryState(), 0.0, "balancer", "no etcd yet", level=logging.INFO)
    assert line == LogLine(logging.INFO, "balancer: no etcd yet; retrying")


def test_an_error_without_text_is_named_in_the_line() -> None:
    # The keepalive's own deadline (asyncio.timeout) raises a bare TimeoutError: the campaign's
    # log read "session lease ... keepalive failed: ; retrying".
    _, line = on_failure(RetryState(), 0.0, "keepalive failed", TimeoutError())
    assert line == LogLine(logging.WARNING, "keepalive failed: no answer in time; retrying")
    assert reason(ConnectionResetError()) == "ConnectionResetError"
    assert reason(MetadataUnavailable("etcd is away")) == "etcd is away"


@given(st.lists(st.tuples(st.floats(0, 5), st.booleans()), max_size=300))
def test_failure_lines_are_bounded_by_the_elapsed_time(steps: list[tuple[float, bool]]) -> None:
    """However often a loop fails, a run writes at most one line per interval after its first
    (and one for the recovery)."""
    now_s, events = 0.0, []
    for gap_s, ok in steps:
        now_s += gap_s
        events.append((now_s, ok))
    written = lines_of(events)
    runs = 1 + sum(1 for (_, a), (_, b) in itertools.pairwise(events) if a and not b)
    failure_lines = [t for t, line in written if "recovered" not in line.message]
    assert len(failure_lines) <= runs + now_s / SUMMARY_INTERVAL_S
    summaries = [t for t, line in written if "still failing" in line.message]
    assert all(b - a >= SUMMARY_INTERVAL_S for a, b in itertools.pairwise(summaries))


def test_retry_log_writes_the_decided_lines_to_its_logger(caplog: pytest.LogCaptureFixture) -> None:
    clock = [0.0]
    logger = logging.getLogger("test.retry_log")
    retries = RetryLog(logger, "rebalancer: etcd", clock=lambda: clock[0])
    with caplog.at_level(logging.DEBUG, logger="test.retry_log"):
        for _ in range(45):
            retries.failed(TimeoutError("deadline exceeded"))
            clock[0] += 1.0
        retries.succeeded()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "rebalancer: etcd: deadline exceeded; retrying"),
        (
            logging.WARNING,
            "rebalancer: etcd: still failing after 31 attempts / 30 s: deadline exceeded",
        ),
        (logging.INFO, "rebalancer: etcd: recovered after 45 failed attempts / 45 s"),
    ]


class RefusingEtcd:
    """An etcd client port that refuses ``refusals`` reads, then answers (no waiting)."""

    closed = False

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals

    async def get_prefix(self, prefix: str) -> list[object]:
        if self.refusals:
            self.refusals -= 1
            raise MetadataUnavailable("etcd refused")
        return []

    async def pause(self, delay_s: float) -> None:
        return None


def test_a_reload_retried_a_hundred_times_logs_once_and_its_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watch's reload after a RESYNC wrote a WARNING per attempt (hundreds while etcd was
    down); now one, and an INFO when etcd answers."""
    etcd = RefusingEtcd(100)
    with caplog.at_level(logging.INFO, logger="kafscale.broker.metadata.etcd"):
        read = read_prefix_until_answered(etcd, "/kafscale/c/", "cluster view")  # type: ignore[arg-type]
        assert asyncio.run(read) == []
    messages = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert messages == [
        (logging.WARNING, "cluster view: cannot reload from etcd: etcd refused; retrying"),
        (
            logging.INFO,
            "cluster view: cannot reload from etcd: recovered after 100 failed attempts / 0 s",
        ),
    ]
