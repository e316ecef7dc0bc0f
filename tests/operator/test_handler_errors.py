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


def _body(uid: str, *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": uid, "namespace": "kafka", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T23:00:00Z"
    return {"metadata": meta}


async def test_a_resource_deleted_while_failing_leaves_no_entry_behind() -> None:
    """Before, an entry stayed for every resource that failed and was then deleted (a slow
    leak over the operator's life). Its deletion handler's success drops every entry of it."""
    posted: list[Notice] = []
    errors = HandlerErrors(300.0, post=lambda body, n: posted.append(n), clock=lambda: 0.0)

    @errors.reported
    async def reconcile_cluster(body: Any, **_: Any) -> None:
        raise kopf.TemporaryError("applying objects: 403 Forbidden", delay=5)

    @errors.reported
    async def delete_cluster(body: Any, **_: Any) -> None:
        return None

    with pytest.raises(kopf.TemporaryError):
        await reconcile_cluster(body=_body("u-1"))
    with pytest.raises(kopf.TemporaryError):
        await reconcile_cluster(body=_body("u-2"))
    assert errors.tracked == 2
    await delete_cluster(body=_body("u-1", deleting=True))
    assert errors.tracked == 1  # u-2 still fails: its entry still holds its repeats back
    with pytest.raises(kopf.TemporaryError):
        await reconcile_cluster(body=_body("u-2"))
    assert len(posted) == 2


async def test_entries_older_than_the_interval_go_so_the_table_stays_bounded() -> None:
    """Resources that go without a handler seeing it (broker pods whose drain failed, a
    finalizer removed by hand): an entry past the interval holds nothing back, and goes."""
    posted: list[Notice] = []
    now = [0.0]
    errors = HandlerErrors(300.0, post=lambda body, n: posted.append(n), clock=lambda: now[0])

    @errors.reported
    async def drain_terminating_broker(body: Any, **_: Any) -> None:
        raise RuntimeError("etcd refused the drain mark")

    for i in range(1000):  # a thousand pods, each failing once and gone
        with pytest.raises(RuntimeError):
            await drain_terminating_broker(body=_body(f"pod-{i}"))
        now[0] += 1.0
    assert errors.tracked <= 300
    now[0] += 300.0
    with pytest.raises(RuntimeError):
        await drain_terminating_broker(body=_body("pod-last"))
    assert errors.tracked == 1
    assert len(posted) == 1001  # each pod's failure was still posted once
