"""Helpers of the operator tests: the operator running in-process against the API emulator."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from harness.kmock_k8s import KubeEmulator, api_request
from kafscale.operator.main import operate
from kafscale.operator.models import API_VERSION, CLUSTER_KIND, TOPIC_KIND
from kafscale.operator.settings import OperatorSettings

CLUSTERS = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaleclusters"
TOPICS = "/apis/kafscale.io/v1alpha1/namespaces/{ns}/kafscaletopics"


async def eventually(
    probe: Callable[[], Any], *, timeout_s: float = 10.0, what: str = "condition"
) -> Any:
    """Poll ``probe`` until it returns something truthy; fail with the last value."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: Any = None
    while True:
        result = probe()
        last = await result if asyncio.iscoroutine(result) else result
        if last:
            return last
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}")
        await asyncio.sleep(0.05)


@pytest.fixture
def namespace() -> str:
    return f"ns-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def operator_thread(settings: OperatorSettings) -> AsyncIterator[OperatorSettings]:
    """The operator in a thread with its own event loop, stopped (and joined) afterwards.

    Its own loop because kopf, when it stops, cancels every task of its loop that it did not
    start before it, pytest-asyncio's fixture finalizers included.
    """
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(operate(settings, stop_flag=stop, ready_flag=ready))
        except BaseException as exc:  # reported by the fixture
            failure.append(exc)

    thread = threading.Thread(target=run, name="kafscale-operator", daemon=True)
    thread.start()
    try:
        started = await asyncio.to_thread(ready.wait, 60)
        assert started and not failure, f"the operator did not start: {failure}"
        yield settings
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 20)
        assert not thread.is_alive(), "the operator did not stop within 20 s"


@pytest_asyncio.fixture
async def running_operator(kube_api: KubeEmulator) -> AsyncIterator[OperatorSettings]:
    """The operator against the emulator."""
    settings = OperatorSettings(
        api_server=str(kube_api.url).rstrip("/"),
        status_interval_s=0.3,
        rebalance_interval_s=1.0,
        resync_interval_s=3600.0,
        etcd_timeout_s=2.0,
        api_timeout_s=5.0,
        s3_timeout_s=10.0,
        liveness_endpoint=None,
    )
    async with operator_thread(settings) as running:
        yield running


def cluster_body(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": CLUSTER_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def topic_body(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": TOPIC_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


async def create(kube: KubeEmulator, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, result = await api_request(kube, "POST", path, body)
    assert status in (200, 201), result
    return result  # type: ignore[no-any-return]


async def merge_patch(kube: KubeEmulator, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, result = await api_request(
        kube, "PATCH", path, body, content_type="application/merge-patch+json"
    )
    assert status == 200, result
    return result  # type: ignore[no-any-return]


async def delete(kube: KubeEmulator, path: str) -> None:
    status, result = await api_request(kube, "DELETE", path)
    assert status == 200, result
