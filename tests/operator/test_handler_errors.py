"""A failed handler as one Warning Event on its resource, rate-limited (pure parts and the
wrapper; the real-API test is in test_real_api.py)."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from kafscale.operator.events import Notice
from kafscale.operator.handler_errors import (
    MAX_MESSAGE_CHARS,
    REASON,
    HandlerErrors,
    ToldPermanentError,
    ToldTemporaryError,
    failure_notice,
    one_line,
    post_due,
)

pytestmark = pytest.mark.operator

BODY = {"metadata": {"name": "demo", "namespace": "kafka", "uid": "u-1"}}


def test_the_message_is_one_line_without_a_traceback() -> None:
    exc = RuntimeError("first line\n  Traceback (most recent call last):\n    File x")
    notice = failure_notice("reconcile_cluster", exc)
    assert notice.type == "Warning" and notice.reason == REASON
    assert "\n" not in notice.message
    assert notice.message.startswith("reconcile_cluster failed: RuntimeError: first line")
    assert notice.message.endswith("retrying with backoff")
    temporary = failure_notice("h", kopf.TemporaryError("etcd: down", delay=5))
    assert temporary.message == "h failed: etcd: down; retrying in 5 s"
    permanent = failure_notice("h", kopf.PermanentError("invalid spec: x"))
    assert permanent.message.endswith("not retried until the resource changes")
    assert len(one_line("x" * 5000)) == MAX_MESSAGE_CHARS


def test_the_same_message_posts_once_per_interval_a_new_one_at_once() -> None:
    assert post_due(None, "a", 0.0, 300.0)
    assert not post_due(("a", 0.0), "a", 299.0, 300.0)
    assert post_due(("a", 0.0), "a", 300.0, 300.0)
    assert post_due(("a", 0.0), "b", 1.0, 300.0)


async def test_a_retry_loop_posts_one_event_and_a_success_resets_it() -> None:
    posted: list[tuple[Any, Notice]] = []
    now = [0.0]
    errors = HandlerErrors(
        300.0, post=lambda body, n: posted.append((body, n)), clock=lambda: now[0]
    )
    fail = [True]

    @errors.reported
    async def reconcile_cluster(body: Any, **_: Any) -> str:
        if fail[0]:
            raise kopf.TemporaryError("applying objects: 422 Unprocessable Entity", delay=5)
        return "done"

    assert reconcile_cluster.__name__ == "reconcile_cluster"  # kopf's handler id
    for _ in range(10):  # kopf retries every 5 s
        with pytest.raises(kopf.TemporaryError):
            await reconcile_cluster(body=BODY)
        now[0] += 5.0
    assert len(posted) == 1
    assert posted[0][0] is BODY and "422 Unprocessable Entity" in posted[0][1].message
    fail[0] = False
    assert await reconcile_cluster(body=BODY) == "done"
    fail[0] = True
    with pytest.raises(kopf.TemporaryError):
        await reconcile_cluster(body=BODY)
    assert len(posted) == 2  # failing again after a success is news


async def test_a_failure_whose_condition_event_said_it_posts_no_second_event() -> None:
    """An invalid spec (``InvalidSpec``) or a topic whose cluster is missing
    (``ClusterNotFound``) has its condition's Event; ``ReconcileFailed`` would say it again."""
    posted: list[Notice] = []
    errors = HandlerErrors(300.0, post=lambda body, n: posted.append(n))

    @errors.reported
    async def reconcile_cluster(body: Any, **_: Any) -> None:
        raise ToldPermanentError("invalid spec: brokers.replicas: must be >= 0")

    @errors.reported
    async def reconcile_topic(body: Any, **_: Any) -> None:
        raise ToldTemporaryError("KafScaleCluster demo not found", delay=10)

    with pytest.raises(kopf.PermanentError):
        await reconcile_cluster(body=BODY)
    with pytest.raises(kopf.TemporaryError):
        await reconcile_topic(body=BODY)
    assert posted == []
