"""The pipeline suite shares one SparkSession (``harness.spark``).

``shared_cluster`` is one cluster with one running broker for a whole module: a broker start
costs ~1.6 s of CPU on cores Spark already saturates, and most pipeline tests only need
somewhere to produce to. Tests that share it use topics of their own; a test that restarts,
stops or reconfigures brokers keeps the per-test ``broker_cluster``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.brokers import BrokerCluster, new_cluster
from harness.s3 import S3Endpoint
from harness.spark import spark

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

__all__ = ["shared_cluster", "spark"]

SHARED_BROKER_ENV: dict[str, str] = {}
"""What a module's shared broker is started with; a module overrides it with a module-level
``SHARED_BROKER_ENV`` (the compaction tests' short cleaner intervals)."""


@pytest.fixture(scope="module")
def shared_cluster(
    request: pytest.FixtureRequest,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[BrokerCluster]:
    env = getattr(request.module, "SHARED_BROKER_ENV", SHARED_BROKER_ENV)
    workdir = tmp_path_factory.mktemp("shared-cluster")
    cluster = new_cluster(etcd_server.client_url, s3_server, workdir, "p")
    try:
        cluster.start(**env)
        yield cluster
    finally:
        cluster.stop_all()
