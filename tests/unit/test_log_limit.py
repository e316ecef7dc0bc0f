"""The log limit for lines clients cause (``observability/log_limit``): the first few per kind
and host per window are written, the rest counted and summarised in one line, nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.observability.log_limit import (
    OTHER_HOSTS,
    ClientEvent,
    LogLimiter,
    LogPolicy,
    Window,
    decide,
    expired_keys,
    host_of,
    key_for,
    summarise_periodically,
)
from kafscale.broker.observability.metrics import METRICS

pytestmark = pytest.mark.unit

POLICY = LogPolicy(lines_per_window=3, window_s=10.0, max_keys=4)
SASL = ClientEvent.SASL_FAILURE


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(clock: Clock) -> LogLimiter:
    return LogLimiter(POLICY, clock)


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.INFO, logger="test.log_limit")
    return logging.getLogger("test.log_limit")


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.log_limit"]


# --- the pure decision ---------------------------------------------------------------------


def test_the_first_lines_of_a_window_are_written_then_counted() -> None:
    window = None
    written = []
    for _ in range(5):
        decision = decide(window, 0.0, "h", POLICY)
        window = decision.window
        written.append((decision.log, decision.last_logged))
    assert written == [(True, False), (True, False), (True, True), (False, False), (False, False)]
    assert window == Window(0.0, logged=3, suppressed=2, last_host="h")


def test_a_new_window_hands_back_the_one_that_left_lines_out() -> None:
    full = Window(0.0, logged=3, suppressed=7, last_host="a")
    decision = decide(full, 10.0, "b", POLICY)
    assert decision.ended == full
    assert decision.log
    assert decision.window == Window(10.0, logged=1, last_host="b")
    assert decide(Window(0.0, logged=2), 10.0, "b", POLICY).ended is None  # nothing left out


def test_keys_past_the_cap_share_one_key_per_kind() -> None:
    windows = {(SASL, f"h{i}"): Window(0.0) for i in range(4)}
    assert key_for(windows, SASL, "h1", POLICY) == (SASL, "h1")  # known hosts keep theirs
    assert key_for(windows, SASL, "new", POLICY) == (SASL, OTHER_HOSTS)
    assert key_for({}, SASL, "new", POLICY) == (SASL, "new")


def test_expired_keys_stop_at_the_first_window_still_running() -> None:
    windows = [((SASL, "a"), Window(0.0)), ((SASL, "b"), Window(5.0)), ((SASL, "c"), Window(0.0))]
    assert expired_keys(windows, 12.0, POLICY) == [(SASL, "a")]
    assert expired_keys(windows, 20.0, POLICY) == [(SASL, "a"), (SASL, "b"), (SASL, "c")]


def test_host_of_a_peer_name() -> None:
    assert host_of("127.0.0.1:5000") == "127.0.0.1"
    assert host_of("::1:5000") == "::1"
    assert host_of("unix") == "unix"


@given(
    gaps=st.lists(st.floats(0, 25, allow_nan=False), min_size=1, max_size=200),
    lines=st.integers(1, 5),
    window_s=st.floats(0.5, 20, allow_nan=False),
)
def test_at_most_n_lines_per_window_and_every_event_counted_once(
    gaps: list[float], lines: int, window_s: float
) -> None:
    """Whatever the timing: never more than ``lines_per_window`` written per window, and each
    event is either written or counted in exactly one window's ``suppressed``."""
    policy = LogPolicy(lines_per_window=lines, window_s=window_s)
    window: Window | None = None
    now_s = 0.0
    written_per_window = Counter[float]()  # by the window's start
    summarised = 0
    for gap in gaps:
        now_s += gap
        decision = decide(window, now_s, "h", policy)
        if decision.ended is not None:
            summarised += decision.ended.suppressed
        if decision.log:
            written_per_window[decision.window.started_s] += 1
        window = decision.window
        assert 0 <= now_s - window.started_s < window_s
    assert window is not None
    assert sum(written_per_window.values()) + summarised + window.suppressed == len(gaps)
    assert max(written_per_window.values()) <= lines
    starts = sorted(written_per_window)
    assert all(later - earlier >= window_s for earlier, later in itertools.pairwise(starts))


# --- the limiter: lines, summaries, bounds -------------------------------------------------


def test_a_flood_writes_n_lines_then_one_summary(
    limiter: LogLimiter, clock: Clock, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    before = METRICS.client_log_lines_suppressed.get(SASL.value, 0)
    for attempt in range(300):
        limiter.log(logger, logging.INFO, SASL, "10.0.0.7", "login %d failed", attempt)
    written = messages(caplog)
    assert written[:2] == ["login 0 failed", "login 1 failed"]
    assert written[2].startswith("login 2 failed (further such lines from 10.0.0.7 are counted")
    assert len(written) == 3
    assert METRICS.client_log_lines_suppressed[SASL.value] - before == 297
    clock.now_s += 10
    limiter.summarise_ended()
    assert messages(caplog)[3:] == [
        "suppressed 297 similar messages within 10 s: SASL authentication failed "
        "(last from 10.0.0.7)"
    ]
    assert len(limiter) == 0


def test_one_noisy_host_does_not_hide_another(
    limiter: LogLimiter, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(50):
        limiter.log(logger, logging.INFO, SASL, "10.0.0.7", "noisy")
    limiter.log(logger, logging.INFO, SASL, "10.0.0.8", "other")
    limiter.log(logger, logging.INFO, ClientEvent.MALFORMED_REQUEST, "10.0.0.7", "bad request")
    assert messages(caplog).count("other") == 1
    assert messages(caplog).count("bad request") == 1


def test_the_key_map_stays_bounded_under_an_address_scan(
    limiter: LogLimiter, clock: Clock, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    for index in range(10_000):
        limiter.log(logger, logging.WARNING, SASL, f"10.{index // 256}.{index % 256}.1", "x")
    assert len(limiter) == POLICY.max_keys + 1  # the cap, and the shared key of the kind
    assert len(messages(caplog)) == POLICY.max_keys + POLICY.lines_per_window
    limiter.summarise_all()
    assert messages(caplog)[-1] == (
        "suppressed 9,993 similar messages within 10 s: SASL authentication failed "
        "(last from 10.39.15.1)"
    )


def test_a_later_window_writes_again_after_its_summary(
    limiter: LogLimiter, clock: Clock, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(5):
        limiter.log(logger, logging.INFO, SASL, "h", "fail")
    clock.now_s += 11
    limiter.log(logger, logging.INFO, SASL, "h", "fail again")
    assert messages(caplog)[-2:] == [
        "suppressed 2 similar messages within 10 s: SASL authentication failed (last from h)",
        "fail again",
    ]


def test_summary_goes_to_the_logger_and_level_of_its_lines(
    limiter: LogLimiter, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(4):
        limiter.log(logger, logging.WARNING, ClientEvent.MALFORMED_REQUEST, "h", "bad")
    limiter.summarise_all()
    summary = caplog.records[-1]
    assert (summary.name, summary.levelno) == ("test.log_limit", logging.WARNING)
    assert summary.getMessage().startswith("suppressed 1 similar messages")


def test_a_quiet_window_leaves_no_summary(
    limiter: LogLimiter, clock: Clock, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    limiter.log(logger, logging.INFO, SASL, "h", "once")
    clock.now_s += 60
    limiter.summarise_ended()
    assert messages(caplog) == ["once"]
    assert len(limiter) == 0


def test_the_traceback_of_a_written_line_is_kept(
    limiter: LogLimiter, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        limiter.log(logger, logging.ERROR, ClientEvent.INTERNAL_ERROR, "h", "failed", exc_info=True)
    assert caplog.records[-1].exc_info is not None


def test_the_summary_of_a_client_gone_quiet_is_written_by_the_periodic_sweep(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    """No further event needs to come: ``summarise_periodically`` (which every listener runs)
    ends the window on the event loop's own time."""
    limiter = LogLimiter(LogPolicy(lines_per_window=1, window_s=0.2))
    for _ in range(3):
        limiter.log(logger, logging.INFO, SASL, "h", "fail")

    async def sweep_until_summarised() -> None:
        summarised = asyncio.Event()
        handler = logging.Handler()
        handler.emit = lambda record: summarised.set()  # type: ignore[method-assign]
        logger.addHandler(handler)
        sweeper = asyncio.create_task(summarise_periodically(limiter))
        try:
            async with asyncio.timeout(30):  # a deadline only: it ends as soon as it is written
                await summarised.wait()
        finally:
            logger.removeHandler(handler)
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    asyncio.run(sweep_until_summarised())
    assert messages(caplog)[-1] == (
        "suppressed 2 similar messages within 0.2 s: SASL authentication failed (last from h)"
    )


def test_windows_end_when_the_last_server_sharing_the_limiter_detaches(
    limiter: LogLimiter, logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    """``kafscale local``: two brokers share the limiter; the first to stop ends nothing."""
    limiter.attach()
    limiter.attach()
    for _ in range(5):
        limiter.log(logger, logging.INFO, SASL, "h", "fail")
    limiter.detach()
    limiter.log(logger, logging.INFO, SASL, "h", "fail")
    assert len(messages(caplog)) == 3  # still the first window: no line more
    limiter.detach()
    assert messages(caplog)[-1] == (
        "suppressed 3 similar messages within 10 s: SASL authentication failed (last from h)"
    )
