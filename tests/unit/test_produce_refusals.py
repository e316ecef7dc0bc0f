"""A Produce answered with an error is logged at INFO with its code and reason, one line per
partition per 10 s and then a count (``api.produce_refusals``): the next fault campaign's
broker logs say what a stalled producer was told."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from kafscale.broker.api import produce
from kafscale.broker.api.produce_refusals import log_refusal
from kafscale.broker.metadata.partition_state import PartitionState
from kafscale.broker.observability.log_limit import REFUSAL_LOG, LogLimiter
from kafscale.broker.protocol.errors import ErrorCode, NotLeader

pytestmark = pytest.mark.unit

LOGGER = "kafscale.broker.api.produce_refusals"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_one_line_per_partition_per_ten_seconds_then_a_count_of_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = Clock()
    limiter = LogLimiter(REFUSAL_LOG.policy, clock)
    refused = ErrorCode.NOT_LEADER_OR_FOLLOWER
    for _ in range(50):  # a producer retrying every ~100 ms for 5 s
        log_refusal("t", 2, refused, "t-2 is being handed over", "10.0.0.7:5000", limiter)
        log_refusal("t", 3, ErrorCode.REQUEST_TIMED_OUT, "", "10.0.0.7:5001", limiter)
        clock.now_s += 0.1
    log_refusal("t", 0, ErrorCode.NONE, "", "10.0.0.7:5000", limiter)  # acked: nothing
    written = lines(caplog)
    assert len(written) == 2
    assert written[0].startswith(
        "produce to t-2 from 10.0.0.7:5000 answered NOT_LEADER_OR_FOLLOWER:"
        " t-2 is being handed over"
    )
    assert written[1].startswith("produce to t-3 from 10.0.0.7:5001 answered REQUEST_TIMED_OUT")
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER)

    clock.now_s += 10.0
    limiter.summarise_ended()
    summaries = lines(caplog)[2:]
    assert summaries == [
        "suppressed 49 similar messages within 10 s: produce refused (last from partition t-2)",
        "suppressed 49 similar messages within 10 s: produce refused (last from partition t-3)",
    ]


def context(peer: str) -> SimpleNamespace:
    """The parts of a request context a Produce response's partition entry reads."""
    broker = SimpleNamespace(committed_state=lambda tp: PartitionState(), leader_for=lambda tp: 11)
    return SimpleNamespace(broker=broker, connection=SimpleNamespace(peer=peer))


def answered(outcome: produce.Outcome) -> dict[str, object]:
    return produce._partition_result(context("127.0.0.1:4242"), ("renewed", 2), outcome)  # type: ignore[arg-type]


def failed(error: BaseException) -> asyncio.Future[object]:
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


def test_a_produce_response_error_is_logged_with_the_brokers_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    REFUSAL_LOG.summarise_all()  # no window of an earlier test of this process

    async def run() -> list[dict[str, object]]:
        suspended = NotLeader("renewed-2: this broker's etcd session is suspended or lost")
        fenced = NotLeader("lease lost; commit fenced")
        unanswered = asyncio.get_running_loop().create_future()
        outcomes = [failed(suspended), failed(fenced), unanswered]
        return [answered(outcome) for outcome in outcomes]  # type: ignore[arg-type]

    entries = asyncio.run(run())
    assert [e["error_code"] for e in entries] == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
    ]
    written = lines(caplog)
    assert len(written) == 1, written  # the later answers of that partition within 10 s: counted
    assert written[0].startswith(
        "produce to renewed-2 from 127.0.0.1:4242 answered NOT_LEADER_OR_FOLLOWER:"
        " renewed-2: this broker's etcd session is suspended or lost"
    )
    REFUSAL_LOG.summarise_all()
    assert lines(caplog)[1] == (
        "suppressed 2 similar messages within 10 s: produce refused (last from partition renewed-2)"
    )


def test_a_refusal_at_append_answers_its_code_and_logs_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    REFUSAL_LOG.summarise_all()
    entry = answered(NotLeader("renewed-2 is being handed over"))
    assert entry["error_code"] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert entry["current_leader"] == {"leader_id": 11, "leader_epoch": -1}
    assert lines(caplog) == [
        "produce to renewed-2 from 127.0.0.1:4242 answered NOT_LEADER_OR_FOLLOWER:"
        " renewed-2 is being handed over (further such lines from partition renewed-2 are"
        " counted for 10 s, then summarised)"
    ]
    REFUSAL_LOG.summarise_all()
