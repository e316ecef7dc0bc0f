"""etcd upkeep: the brokers compact etcd's history, so a busy cluster's etcd stays inside its
space quota."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster, _create_bucket
from harness.s3 import S3Endpoint, unique_bucket

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, find_etcd_binary

pytestmark = pytest.mark.integration


def etcdctl(server: EmbeddedEtcd, *args: str) -> subprocess.CompletedProcess[str]:
    binary = find_etcd_binary().with_name("etcdctl")
    return subprocess.run(
        [str(binary), f"--endpoints={server.client_url}", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def status(server: EmbeddedEtcd) -> dict[str, int]:
    result = etcdctl(server, "endpoint", "status", "-w", "json")
    entry = json.loads(result.stdout)[0]["Status"]
    return {"revision": int(entry["header"]["revision"]), "in_use": int(entry["dbSizeInUse"])}


def test_the_lowest_broker_compacts_etcd_history_as_commits_go_on(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    bucket = unique_bucket("upkeep")
    _create_bucket(s3_server, bucket)
    cluster = BrokerCluster(etcd_server_private.client_url, s3_server, bucket, "upkeep", tmp_path)
    try:
        broker = cluster.start(KAFSCALE_ETCD__COMPACTION_INTERVAL_S="1")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        start = status(etcd_server_private)["revision"]
        deadline = time.monotonic() + 6
        i = 0
        while time.monotonic() < deadline:  # a commit per flush tick (50 ms)
            producer.produce("upkeep", value=b"v%d" % i)
            producer.flush(10)
            i += 1
        end = status(etcd_server_private)["revision"]
        assert end - start > 50  # many commits happened
        # the early history is gone: reading at the start revision is refused as compacted
        old = etcdctl(etcd_server_private, "get", "/kafscale", "--prefix", f"--rev={start}")
        assert "compacted" in old.stderr, (old.stdout, old.stderr)
        assert "etcd history compacted to revision" in broker.tail(200)
    finally:
        cluster.stop_all()
