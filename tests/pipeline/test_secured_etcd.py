"""The Spark source on a secured etcd. With TLS and client certificates required, the
``etcd.ca_file``/``etcd.cert_file``/``etcd.key_file`` options (named like the broker's
``KAFSCALE_ETCD__*`` settings) let the driver plan; without a certificate, or with files that
do not load, the query fails on the driver with a message saying what to check. With
authentication on, ``etcd.username``/``etcd.password`` do the same; a wrong password fails
on the driver."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster
from harness.s3 import S3Endpoint, unique_bucket
from harness.spark import plan_as_spark_does, run_as_executors_do, source_options
from harness.tls_etcd import AUTH_PASSWORD, AUTH_USER, TlsEtcd, running_auth_etcd, running_tls_etcd
from harness.topics import create_topic
from pyspark.sql.datasource import CaseInsensitiveDict

from kafscale.pipeline.source import KafScaleDataSource

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


@pytest.fixture
def secured(
    tmp_path: Path, s3_server: S3Endpoint, cluster_name: str
) -> Iterator[tuple[BrokerCluster, TlsEtcd]]:
    with running_tls_etcd(tmp_path / "etcd-tls") as etcd:
        bucket = unique_bucket("b")
        s3_server.client().create_bucket(Bucket=bucket)
        cluster = BrokerCluster(
            etcd.url, s3_server, bucket, cluster_name, tmp_path, extra_env=etcd.broker_env()
        )
        try:
            yield cluster, etcd
        finally:
            cluster.stop_all()


@pytest.fixture
def authenticated(
    tmp_path: Path, s3_server: S3Endpoint, cluster_name: str
) -> Iterator[BrokerCluster]:
    with running_auth_etcd(tmp_path / "etcd-auth") as url:
        bucket = unique_bucket("b")
        s3_server.client().create_bucket(Bucket=bucket)
        env = {"KAFSCALE_ETCD__USERNAME": AUTH_USER, "KAFSCALE_ETCD__PASSWORD": AUTH_PASSWORD}
        cluster = BrokerCluster(url, s3_server, bucket, cluster_name, tmp_path, extra_env=env)
        try:
            yield cluster
        finally:
            cluster.stop_all()


def load(spark: Any, options: dict[str, str]) -> Any:
    return spark.read.format("kafscale").options(**options).load()


def test_a_batch_read_plans_from_an_etcd_with_client_certificates(
    spark: Any, secured: tuple[BrokerCluster, TlsEtcd]
) -> None:
    cluster, etcd = secured
    broker = cluster.start()
    create_topic(broker.bootstrap, "secure", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(40):
        producer.produce("secure", f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    options = {
        **source_options(cluster),
        "subscribe": "secure",
        "etcd.ca_file": str(etcd.pki.ca.cert_path),
        "etcd.cert_file": str(etcd.pki.alice.cert),
        "etcd.key_file": str(etcd.pki.alice.key),
    }
    rows = load(spark, options).collect()
    assert sorted(bytes(r.value).decode() for r in rows) == sorted(f"v{i}" for i in range(40))
    assert {r.partition for r in rows} == {0, 1}


def test_a_read_without_a_usable_client_certificate_is_a_clear_driver_error(
    spark: Any, secured: tuple[BrokerCluster, TlsEtcd]
) -> None:
    cluster, etcd = secured
    base = {
        **source_options(cluster),
        "subscribe": "secure",
        "etcd.timeout_s": "2",
        "etcd.ca_file": str(etcd.pki.ca.cert_path),
    }
    with pytest.raises(Exception, match=r"cannot be reached.*without etcd\.cert_file"):
        load(spark, base).collect()
    stranger = {
        **base,
        "etcd.cert_file": str(etcd.pki.stranger.cert),
        "etcd.key_file": str(etcd.pki.stranger.key),
    }
    with pytest.raises(Exception, match=r"cannot be reached.*etcd trusts etcd\.cert_file"):
        load(spark, stranger).collect()
    missing = {**stranger, "etcd.cert_file": str(etcd.pki.ca.cert_path.with_name("nope.crt"))}
    with pytest.raises(Exception, match=r"etcd TLS: cannot read .*nope\.crt"):
        load(spark, missing).collect()


def test_a_batch_read_logs_in_to_an_etcd_with_authentication(
    spark: Any, authenticated: BrokerCluster
) -> None:
    broker = authenticated.start()
    create_topic(broker.bootstrap, "logged-in", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(10):
        producer.produce("logged-in", f"a{i}".encode())
    assert producer.flush(30) == 0
    options = {**source_options(authenticated), "subscribe": "logged-in", "etcd.timeout_s": "2"}
    with pytest.raises(Exception, match=r"etcd at http://127.0.0.1:.* cannot be reached"):
        load(spark, {**options, "etcd.username": AUTH_USER, "etcd.password": "wrong"}).collect()
    rows = load(
        spark, {**options, "etcd.username": AUTH_USER, "etcd.password": AUTH_PASSWORD}
    ).collect()
    assert [bytes(r.value) for r in sorted(rows, key=lambda r: r.offset)] == [
        f"a{i}".encode() for i in range(10)
    ]


def test_the_etcd_password_stays_on_the_driver(authenticated: BrokerCluster) -> None:
    """pyspark's planner, run here as Spark runs it, plans from the etcd that needs the password;
    the bytes it gives every task (read function, reader, partitions) do not contain it, and
    the tasks read every row from them."""
    broker = authenticated.start()
    create_topic(broker.bootstrap, "kept-secret", 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(20):
        producer.produce("kept-secret", f"s{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    options = {
        **source_options(authenticated),
        "subscribe": "kept-secret",
        "etcd.username": AUTH_USER,
        "etcd.password": AUTH_PASSWORD,
    }
    payload = plan_as_spark_does(KafScaleDataSource(CaseInsensitiveDict(options)), streaming=False)
    assert AUTH_PASSWORD.encode() not in payload
    assert authenticated.etcd_url.encode() not in payload
    rows = [row for batch in run_as_executors_do(payload) for row in batch.to_pylist()]
    assert sorted(row["value"] for row in rows) == sorted(f"s{i}".encode() for i in range(20))
