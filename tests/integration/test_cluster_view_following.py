"""A cluster view that etcd stops letting follow says so, and follows again when it may.

On an etcd with authentication, the brokers' role loses its permission on the cluster prefix
(an operator's change to roles or users) and etcd restarts, so every watch is created again and
refused (etcd checks a watch's permission only when it is created). Before, the watches were
retried without a word above INFO, the broker stayed ready and answered Metadata from a view
frozen at that moment; now ``/readyz`` says 503, the ``kafscale_cluster_view_following`` gauge
says 0 and the log says why, and all of it comes back, with the changes made meanwhile, once
the permission does.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster
from harness.s3 import S3Endpoint
from harness.tls_etcd import AUTH_PASSWORD, AUTH_USER, AuthEtcd, brokers_on_auth_etcd

from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.groups.leases import GroupLeases
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd import Etcd, read_prefix_until_answered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_DEADLINE_S = 90.0  # generous: two engineers and a CI run share two cores


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = _DEADLINE_S,
    log: Callable[[], str] = str,
) -> None:
    """Waits for ``condition``; the failure says ``what`` and ends with ``log()`` (a broker's
    log tail: the CI failure this test had left no trace of why)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}\n{log()}")
        time.sleep(0.2)


async def wait_for_async(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {_DEADLINE_S:g} s: {what}")
        await asyncio.sleep(0.1)


def readyz(broker: BrokerProcess) -> int:
    try:
        return broker.http("GET", "/readyz", timeout_s=5)[0]
    except OSError:
        return -1


def following_gauge(broker: BrokerProcess) -> float | None:
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("kafscale_cluster_view_following "):
            return float(line.split()[1])
    return None


async def test_a_view_refused_by_etcd_is_not_following_until_etcd_lets_it(
    auth_etcd: AuthEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="kafscale")
    cluster = "follow"
    etcd = await Etcd.connect([auth_etcd.url], 5.0, username=AUTH_USER, password=AUTH_PASSWORD)
    view = ClusterView(etcd, cluster)
    try:
        await view.start()
        assert view.following
        await asyncio.to_thread(auth_etcd.refuse_brokers)
        await asyncio.to_thread(auth_etcd.restart)
        await wait_for_async(lambda: not view.following, "the view reports not following")
        assert any("no longer follows etcd" in r.getMessage() for r in caplog.records)
        # A change made while the view is refused (a broker marked draining, by root)...
        await asyncio.to_thread(auth_etcd.as_root, "put", keys.draining_key(cluster, 7), "1")
        await asyncio.to_thread(auth_etcd.allow_brokers)
        await wait_for_async(lambda: view.following, "the view follows again")
        # ... reaches it once it follows again: the watch resumed from its last revision.
        await wait_for_async(lambda: 7 in view.draining, "the change made meanwhile arrives")
        assert any("follows etcd on" in r.getMessage() for r in caplog.records)
    finally:
        await view.close()
        await etcd.close()


async def test_a_lease_watch_refused_by_etcd_follows_again_when_etcd_lets_it(
    auth_etcd: AuthEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """The group (and transaction) coordinators follow their leases' holders with a watch. The
    read the watch makes before each creation (``history_probe``) refused as permission denied
    ended that watch's task for good (an ERROR, then nothing): a coordinator never again heard
    of a lease taken or freed elsewhere. Now it is retried like a refused creation, and a lease
    taken while etcd refused arrives once it lets the broker read again."""
    caplog.set_level("INFO", logger="kafscale")
    cluster = "follow-leases"
    prefix = keys.group_leases_prefix(cluster)
    etcd = await Etcd.connect([auth_etcd.url], 5.0, username=AUTH_USER, password=AUTH_PASSWORD)
    leases = GroupLeases(etcd, cluster, lambda group, owner, revision: None)

    def about_the_watch(level: str) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if prefix in r.getMessage()
            and r.levelname == level
            and "permission denied" in r.getMessage()
        ]

    try:
        await leases.start()
        await asyncio.to_thread(auth_etcd.refuse_brokers)
        await asyncio.to_thread(auth_etcd.restart)
        await wait_for_async(
            lambda: bool(about_the_watch("INFO") or about_the_watch("ERROR")),
            "the lease watch is refused",
        )
        assert not about_the_watch("ERROR"), about_the_watch("ERROR")
        await asyncio.to_thread(
            auth_etcd.as_root, "put", keys.group_lease_key(cluster, "taken-meanwhile"), "7"
        )
        await asyncio.to_thread(auth_etcd.allow_brokers)
        await wait_for_async(
            lambda: leases.holder("taken-meanwhile") == 7, "the lease taken meanwhile arrives"
        )
    finally:
        await leases.close()
        await etcd.close()


async def test_a_reload_etcd_refuses_is_retried_until_etcd_lets_it(
    auth_etcd: AuthEtcd, caplog: pytest.LogCaptureFixture
) -> None:
    """The reload after a watch's RESYNC (``read_prefix_until_answered``) must not be given up:
    the watch goes on after it, so a reload skipped loses its changes for good. It was retried
    only while etcd was unreachable; refused (permission denied), the reload ended at once and
    the group lease watch logged a traceback and went on without the holders etcd had."""
    caplog.set_level("INFO", logger="kafscale")
    prefix = keys.group_leases_prefix("reload-refused")
    etcd = await Etcd.connect([auth_etcd.url], 5.0, username=AUTH_USER, password=AUTH_PASSWORD)
    try:
        await asyncio.to_thread(auth_etcd.as_root, "put", prefix + "g", "7")
        await asyncio.to_thread(auth_etcd.refuse_brokers)
        reload = asyncio.create_task(read_prefix_until_answered(etcd, prefix, "test reload"))
        await wait_for_async(
            lambda: (
                reload.done() or any("permission denied" in r.getMessage() for r in caplog.records)
            ),
            "the reload is refused",
        )
        assert not reload.done(), reload.exception()
        await asyncio.to_thread(auth_etcd.allow_brokers)
        entries = await asyncio.wait_for(reload, _DEADLINE_S)
        assert [(e.key, e.value) for e in entries] == [(prefix + "g", b"7")]
    finally:
        await etcd.close()


@pytest.fixture
def auth_cluster(
    auth_etcd: AuthEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    with brokers_on_auth_etcd(auth_etcd, s3_server, cluster_name, tmp_path) as brokers:
        yield brokers


def test_a_broker_whose_view_etcd_refuses_is_not_ready_until_it_follows_again(
    auth_etcd: AuthEtcd, auth_cluster: BrokerCluster
) -> None:
    broker = auth_cluster.start()
    assert readyz(broker) == 200
    auth_etcd.refuse_brokers()
    auth_etcd.restart()
    wait_for(
        lambda: readyz(broker) == 503, "/readyz says 503 (Kubernetes takes it out)", log=broker.tail
    )
    assert following_gauge(broker) == 0.0
    assert broker.status()["cluster_view_following"] is False
    assert "no longer follows etcd" in broker.log_path.read_text()
    # The watches broke with etcd's restart: granting before any was created again (refused)
    # would test an outage, not a refusal. (A broker whose watches were refused while it
    # authenticated again had them end for good: CI, under load.)
    wait_for(
        lambda: "permission denied" in broker.log_path.read_text(),
        "etcd refuses the broker",
        log=broker.tail,
    )
    auth_etcd.allow_brokers()
    wait_for(lambda: readyz(broker) == 200, "/readyz says 200 again", log=broker.tail)
    assert following_gauge(broker) == 1.0
    assert broker.status()["cluster_view_following"] is True
    assert "follows etcd on" in broker.log_path.read_text()
    assert broker.alive
