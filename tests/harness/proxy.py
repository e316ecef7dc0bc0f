"""A ``kafscale proxy`` process in front of a test cluster's brokers, on free loopback ports.

Configured through environment variables like the brokers (the way the Kubernetes manifests
configure it), started after the brokers: it is ready once its routing tables are loaded and
some broker is registered.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from harness.brokers import BrokerCluster, new_cluster
from harness.children import settings_free_env
from harness.s3 import S3Endpoint
from kafscale.broker.child_process import KAFSCALE, BrokerProcess, free_port_run


def proxy_env(
    cluster: BrokerCluster, port: int, admin_port: int, **overrides: str
) -> dict[str, str]:
    env = settings_free_env()
    env.update(
        {
            "KAFSCALE_CLUSTER": cluster.cluster,
            "KAFSCALE_ETCD__ENDPOINTS": json.dumps([cluster.etcd_url]),
            "KAFSCALE_LISTENER__HOST": "127.0.0.1",
            "KAFSCALE_LISTENER__PORT": str(port),
            "KAFSCALE_LISTENER__ADMIN_PORT": str(admin_port),
            "KAFSCALE_LIMITS__SHUTDOWN_GRACE_S": "5",
            "KAFSCALE_LOG_LEVEL": "INFO",
        }
    )
    env.update(overrides)
    if env.get("KAFSCALE_LISTENERS"):  # they replace the one listener (a warning beside them)
        env.pop("KAFSCALE_LISTENER__PORT")
    return env


def add_proxy(
    cluster: BrokerCluster, port: int | None = None, log_name: str | None = None, **overrides: str
) -> BrokerProcess:
    """A proxy for ``cluster`` on ``port`` (free if None), not started yet; killed with the
    cluster's brokers at teardown."""
    port = port or free_port_run()
    admin_port = free_port_run(avoid=[port])  # two probes could return one port
    proxy = BrokerProcess(
        env=proxy_env(cluster, port, admin_port, **overrides),
        log_path=cluster.workdir / (log_name or f"proxy-{port}.log"),
        port=port,
        admin_port=admin_port,
        command=[KAFSCALE, "proxy"],
    )
    cluster.brokers.append(proxy)  # stop_all() kills it too
    return proxy


def start_proxy(cluster: BrokerCluster, **overrides: str) -> BrokerProcess:
    """A running proxy for ``cluster`` (killed with the cluster's brokers at teardown)."""
    return add_proxy(cluster, **overrides).start()


@contextlib.contextmanager
def brokers_behind_a_proxy(
    etcd_url: str, s3: S3Endpoint, workdir: Path, label: str, brokers: int = 1
) -> Iterator[BrokerCluster]:
    """A cluster of its own (``new_cluster``) with ``brokers`` running brokers and a proxy in
    front: for tests that ask both the same question; everything is stopped at exit."""
    cluster = new_cluster(etcd_url, s3, workdir, label)
    try:
        for _ in range(brokers):
            cluster.start()
        start_proxy(cluster)
        yield cluster
    finally:
        cluster.stop_all()
