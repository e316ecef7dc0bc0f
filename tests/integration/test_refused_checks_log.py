"""Background checks that etcd refuses say so once, without a traceback, and recover.

On an etcd with authentication, the brokers' role loses its permission on the cluster prefix
(an operator's change to roles or users). The transaction coordinator's periodic check reads
every transaction from etcd; each refused check used to log "checking transactions failed"
at ERROR with a full Python traceback, every ``check_interval_ms`` for as long as the refusal
lasted; the groups' offset retention check likewise ("offset retention check failed"). Now
each run is one WARNING (then a summary now and then: ``retry_log``), and once etcd lets the
broker read again the checks go on: a transaction that timed out meanwhile is aborted, and a
new one commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.s3 import S3Endpoint
from harness.tls_etcd import AuthEtcd, brokers_on_auth_etcd
from harness.topics import create_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_DEADLINE_S = 90.0  # generous: several engineers and a CI run share two cores
_REFUSED_CHECKS_S = 1.0
"""How long the refusal outlasts its first logged check: the time is the point (a run of
refused checks, five at the 200-ms interval), not a wait for something to happen."""


@pytest.fixture
def auth_cluster(
    auth_etcd: AuthEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    checks_often = {
        "KAFSCALE_TRANSACTIONS__CHECK_INTERVAL_MS": "200",
        "KAFSCALE_GROUPS__OFFSETS_RETENTION_CHECK_INTERVAL_MS": "200",
    }
    with brokers_on_auth_etcd(auth_etcd, s3_server, cluster_name, tmp_path, **checks_often) as b:
        yield b


def wait_for(condition: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + _DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {_DEADLINE_S:g} s: {what}\n{log()}")
        time.sleep(0.2)


def transactional_producer(bootstrap: str, transactional_id: str, timeout_ms: int) -> Producer:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": timeout_ms,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    return producer


def refused_runs(log: str, what: str) -> list[str]:
    """The WARNING lines of ``what``'s runs of failures (``retry_log``)."""
    return [line for line in log.splitlines() if "WARNING" in line and f"{what}: " in line]


def test_checks_etcd_refuses_are_logged_once_without_a_traceback_and_recover(
    auth_etcd: AuthEtcd, auth_cluster: BrokerCluster
) -> None:
    broker = auth_cluster.start()
    create_topic(broker.bootstrap, "refused-checks", 1)
    # A transaction left open, whose timeout passes while etcd refuses: aborting it is the
    # check's job once etcd lets the broker read again.
    hanging = transactional_producer(broker.bootstrap, "left-open", 3_000)
    hanging.begin_transaction()
    hanging.produce("refused-checks", b"never committed", partition=0)
    assert hanging.flush(30) == 0

    def text() -> str:
        return broker.log_path.read_text()

    auth_etcd.refuse_brokers()
    wait_for(
        lambda: "permission denied" in text() and "transactions" in text(),
        "etcd refuses the transaction check",
        broker.tail,
    )
    wait_for(
        lambda: text().count("permission denied") >= 2 and "retention" in text(),
        "etcd refuses the offset retention check",
        broker.tail,
    )
    time.sleep(_REFUSED_CHECKS_S)
    auth_etcd.allow_brokers()
    wait_for(
        lambda: "transaction left-open timed out: aborting" in text(),
        "the check aborts the transaction that timed out meanwhile",
        broker.tail,
    )
    fresh = transactional_producer(broker.bootstrap, "after-refusal", 30_000)
    fresh.begin_transaction()
    fresh.produce("refused-checks", b"committed", partition=0)
    fresh.commit_transaction(30)
    assert "Traceback" not in text(), text()
    wait_for(
        lambda: "offset retention check: recovered after" in text(),
        "the offset retention check recovers",
        broker.tail,
    )
    log = text()
    for what in ("cannot check transactions", "offset retention check"):
        refused = refused_runs(log, what)
        assert len(refused) == 1 and "permission denied" in refused[0], refused
        assert f"{what}: recovered after" in log
    assert broker.alive
