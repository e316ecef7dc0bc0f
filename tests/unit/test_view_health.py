"""A cluster view that cannot follow etcd says so once, then at most once a minute per part,
and once when it follows again; a reload under way is not following but logs nothing."""

from __future__ import annotations

import logging

import pytest

from kafscale.broker.metadata.view_health import REPEAT_S, FollowHealth, should_log_again


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.endswith("view_health")]


def test_should_log_again_only_after_the_repeat_interval() -> None:
    assert not should_log_again(10.0, 10.0 + REPEAT_S - 0.1)
    assert should_log_again(10.0, 10.0 + REPEAT_S)


def test_a_part_that_keeps_failing_is_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    clock = Clock()
    health = FollowHealth("cluster view", clock)
    assert health.following
    for _ in range(100):  # a refused watch retried with backoff
        health.failed("range /a/", "permission denied")
        clock.now_s += 0.5
    assert not health.following and health.stopped_parts() == ["range /a/"]
    logged = lines(caplog)
    assert len(logged) == 1 + int(50 // REPEAT_S)
    assert "no longer follows etcd on range /a/" in logged[0]
    health.recovered("range /a/")
    assert health.following
    assert "follows etcd on range /a/ again" in lines(caplog)[-1]


def test_a_reload_under_way_is_not_following_and_quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    health = FollowHealth("cluster view", Clock())
    health.pending("reload")
    assert not health.following
    health.recovered("reload")
    assert health.following and not lines(caplog)
    health.pending("reload")
    health.failed("reload", "permission denied")  # a refusal meanwhile is logged
    assert len(lines(caplog)) == 1
    health.recovered("reload")
    assert len(lines(caplog)) == 2
