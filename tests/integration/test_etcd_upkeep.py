"""etcd upkeep: the brokers compact etcd's history, so a busy cluster's etcd stays inside its
space quota."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from harness import children
from harness.batches import make_batch
from harness.brokers import new_cluster
from harness.etcd import harness_etcd_binary
from harness.kafka_wire import (
    FETCH,
    PRODUCE,
    KafkaWire,
    batches_in,
    fetch_body,
    fetch_partition,
    produce_body,
    produce_partition,
)
from harness.log_cleaner import eventually
from harness.s3 import S3Endpoint
from harness.topics import create_topics

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, find_etcd_binary

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
REQUEST_TIMED_OUT = 7


def etcdctl(server: EmbeddedEtcd, *args: str) -> subprocess.CompletedProcess[str]:
    binary = find_etcd_binary().with_name("etcdctl")
    return children.run(
        [str(binary), f"--endpoints={server.client_url}", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def fill_until_nospace(server: EmbeddedEtcd) -> bool:
    """Rewrite three keys with 60 KB values until etcd refuses for lack of space."""
    filler = "a" * 60_000
    for i in range(300):
        put = etcdctl(server, "put", f"/filler/k{i % 3}", filler)
        if put.returncode != 0:
            return "database space exceeded" in put.stderr
    return False


def status(server: EmbeddedEtcd) -> dict[str, int]:
    result = etcdctl(server, "endpoint", "status", "-w", "json")
    entry = json.loads(result.stdout)[0]["Status"]
    return {"revision": int(entry["header"]["revision"]), "in_use": int(entry["dbSizeInUse"])}


def test_the_lowest_broker_compacts_etcd_history_as_commits_go_on(
    etcd_server_private: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    """Commits go on until the history at the start is compacted away, however many that
    takes. Before, the test committed for 6 s and asserted more than 50 revisions: at load
    ~40 on 2 cores 6 s gave 9 (``assert (15 - 6) > 50``), what the machine did, not the broker."""
    cluster = new_cluster(etcd_server_private.client_url, s3_server, tmp_path, "upkeep")
    try:
        broker = cluster.start(KAFSCALE_ETCD__COMPACTION_INTERVAL_S="1")
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        start = status(etcd_server_private)["revision"]

        def commit_then_read_the_start() -> bool:
            """One more commit; whether reading at the start revision is refused as compacted
            (the early history is gone)."""
            producer.produce("upkeep", value=b"v")
            assert producer.flush(30) == 0
            old = etcdctl(etcd_server_private, "get", "/kafscale", "--prefix", f"--rev={start}")
            return "compacted" in old.stderr

        eventually(commit_then_read_the_start, "the start revision compacted", timeout_s=180)
        assert status(etcd_server_private)["revision"] > start + 1  # commits went on
        assert "etcd history compacted to revision" in broker.tail(200)
    finally:
        cluster.stop_all()


def test_an_etcd_out_of_space_fails_produces_clearly_and_recovers(
    s3_server: S3Endpoint, tmp_path: Path
) -> None:
    """etcd with a 2 MiB quota is filled by someone else until it raises NOSPACE: produces get
    an error (never an ack for data that is not committed); the broker's compactor compacts,
    defragments and disarms, and produces go through again."""
    server = EmbeddedEtcd(
        tmp_path / "etcd",
        fast=True,
        no_fsync=True,
        die_with_parent=True,
        extra_args=(f"--quota-backend-bytes={2 * MiB}",),
        binary=harness_etcd_binary(),
    ).start()
    cluster = new_cluster(server.client_url, s3_server, tmp_path, "nospace")
    try:
        broker = cluster.start(KAFSCALE_ETCD__COMPACTION_INTERVAL_S="10")
        create_topics(broker.bootstrap, ["roomy"], partitions=1)
        with KafkaWire(broker.bootstrap, timeout_s=30) as wire:
            code, first = produce_partition(
                wire.request(PRODUCE, 9, produce_body("roomy", 0, make_batch(0, [b"before"])))
            )
            assert code == 0
            # Fill etcd until it refuses a write, then produce at once. The compactor may clear
            # the alarm before that produce (it runs every 10 s): then fill again.
            refused = []
            for _ in range(3):
                assert fill_until_nospace(server)
                code, _ = produce_partition(
                    wire.request(PRODUCE, 9, produce_body("roomy", 0, make_batch(0, [b"no"])))
                )
                if "NOSPACE" in etcdctl(server, "alarm", "list").stdout:
                    refused.append(code)
                    break
            assert refused == [REQUEST_TIMED_OUT]
            deadline = time.monotonic() + 30
            while True:
                code, offset = produce_partition(
                    wire.request(PRODUCE, 9, produce_body("roomy", 0, make_batch(0, [b"after"])))
                )
                if code == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert code == 0, broker.tail(60)
            assert "NOSPACE" not in etcdctl(server, "alarm", "list").stdout
            partition = fetch_partition(wire.request(FETCH, 12, fetch_body("roomy", 0, first)))
            values = [b.base_offset for b in batches_in(partition.records)]
            assert values[0] == first and offset in values
        assert "etcd is out of space (NOSPACE alarm)" in broker.tail(300)
    finally:
        cluster.stop_all()
        server.stop()
