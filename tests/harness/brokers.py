"""Real broker processes for tests: ``kafscale broker`` started on free loopback ports.

``broker_cluster`` gives a factory bound to one etcd cluster prefix and one S3 bucket; each
``start()`` launches a broker process configured through environment variables (the way the
Kubernetes manifests configure it) and waits for its ``/readyz``. Processes are SIGKILLed at
teardown if a test left them running, so a failing test never leaks a broker.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.children import settings_free_env
from harness.etcd import harness_etcd
from harness.s3 import S3Endpoint, unique_bucket
from kafscale.broker.child_process import BrokerProcess, free_port_run
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.settings_combinations import S3_ONLY

STEADY_SESSION_TTL_S = "15"
"""An etcd session (``KAFSCALE_ETCD__SESSION_TTL_S``) that load does not end. The harness's 4 s
(a keepalive every 1.3 s) were lost to keepalives starved at load 30-60, which moved a group's
coordinator or a partition's lease in the middle of a test. Give it to the brokers of a test
that needs leases to stay put while it works and that waits for a lease's end (if it waits for
one at all) rather than timing it; a test about a failover within the TTL keeps the 4 s."""


@dataclass
class BrokerCluster:
    """Brokers sharing one etcd prefix and one bucket."""

    etcd_url: str
    s3: S3Endpoint
    bucket: str
    cluster: str
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    brokers: list[BrokerProcess] = field(default_factory=list)

    def env(self, port: int, admin_port: int, **overrides: str) -> dict[str, str]:
        env = settings_free_env()
        env.update(
            {
                "KAFSCALE_CLUSTER": self.cluster,
                "KAFSCALE_ETCD__ENDPOINTS": json.dumps([self.etcd_url]),
                "KAFSCALE_ETCD__SESSION_TTL_S": "4",
                "KAFSCALE_STORAGE__KIND": "s3",
                "KAFSCALE_STORAGE__BUCKET": self.bucket,
                "KAFSCALE_STORAGE__ENDPOINT": self.s3.url,
                "KAFSCALE_STORAGE__REGION": self.s3.region,
                "KAFSCALE_STORAGE__ACCESS_KEY_ID": self.s3.access_key_id,
                "KAFSCALE_STORAGE__SECRET_ACCESS_KEY": self.s3.secret_access_key,
                "KAFSCALE_LISTENER__HOST": "127.0.0.1",
                "KAFSCALE_LISTENER__PORT": str(port),
                "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
                "KAFSCALE_LOG__FLUSH_INTERVAL_MS": "50",
                "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
                # Kafka's 3-s default: every new group's first join waited it out (the tests
                # about the delay set their own); docs/testing.md, "Keeping the suite fast"
                "KAFSCALE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "200",
                "KAFSCALE_LOG_LEVEL": "INFO",
            }
        )
        env.update(self.extra_env)
        env.update(overrides)
        if env["KAFSCALE_STORAGE__KIND"] == "local":  # a broker refuses S3 settings beside it
            for name in S3_ONLY:
                env.pop(f"KAFSCALE_STORAGE__{name.upper()}", None)
        if env.get("KAFSCALE_LISTENERS"):  # they replace the one listener (a warning beside them)
            env.pop("KAFSCALE_LISTENER__PORT")
        return env

    def start(self, port: int | None = None, **overrides: str) -> BrokerProcess:
        """A new broker (or a restart on ``port`` to keep its address)."""
        port = port or free_port_run()
        admin_port = free_port_run(avoid=[port])  # two probes could return one port
        index = len(self.brokers)
        broker = BrokerProcess(
            env=self.env(port, admin_port, **overrides),
            log_path=self.workdir / f"broker-{index}.log",
            port=port,
            admin_port=admin_port,
        )
        self.brokers.append(broker)
        return broker.start()

    def object_keys(self, prefix: str) -> list[str]:
        """The keys in the cluster's bucket under ``prefix`` (up to 1000)."""
        listed = self.s3.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]

    def etcd_keys(self, under: str) -> list[str]:
        """The etcd keys under ``/kafscale/<cluster>/<under>``."""

        async def read() -> list[str]:
            etcd = await harness_etcd(self.etcd_url)
            try:
                entries = await etcd.get_prefix(keys.cluster_prefix(self.cluster) + under)
                return [entry.key for entry in entries]
            finally:
                await etcd.close()

        return asyncio.run(read())

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.process and b.process.poll() is None)

    def stop_all(self) -> None:
        for broker in self.brokers:
            broker.kill()


@pytest.fixture
def broker_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, cluster_name: str, tmp_path: Path
) -> Iterator[BrokerCluster]:
    cluster = new_cluster(etcd_server.client_url, s3_server, tmp_path, "b", name=cluster_name)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def new_cluster(
    etcd_url: str,
    s3: S3Endpoint,
    workdir: Path,
    label: str,
    *,
    name: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> BrokerCluster:
    """A cluster of its own (a fresh bucket and, unless ``name`` is given, a fresh name, both
    starting with ``label``), with no brokers yet; ``extra_env`` goes to every broker it
    starts. The caller stops it with ``stop_all()``."""
    bucket = unique_bucket(label)
    s3.client().create_bucket(Bucket=bucket)
    name = name or f"{label}-{uuid.uuid4().hex[:8]}"
    return BrokerCluster(etcd_url, s3, bucket, name, workdir, extra_env=dict(extra_env or {}))


@contextmanager
def running_cluster(
    etcd: EmbeddedEtcd,
    s3: S3Endpoint,
    tmp_path_factory: pytest.TempPathFactory,
    label: str,
    *,
    brokers: int = 1,
    extra_env: dict[str, str] | None = None,
) -> Iterator[BrokerCluster]:
    """A cluster of its own with ``brokers`` started, stopped at the end: a module's shared
    cluster for the tests that neither stop, add nor reconfigure brokers, each with topics and
    groups of its own (a broker start costs ~1.5 s of the suite's time)."""
    cluster = new_cluster(
        etcd.client_url, s3, tmp_path_factory.mktemp(label), label, extra_env=extra_env
    )
    try:
        for _ in range(brokers):
            cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def broker(broker_cluster: BrokerCluster) -> BrokerProcess:
    """One running broker on S3 (moto) and etcd."""
    return broker_cluster.start()


def metric_value(broker: BrokerProcess, name: str) -> float:
    """The value of the sample ``name`` on the broker's ``/metrics`` page (a counter's is
    named with its ``_total``); fails if the broker does not export it."""
    with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} is not exported")
