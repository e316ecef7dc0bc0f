"""Bad input is a clear error on the driver, raised before any task runs: never a hang."""

from __future__ import annotations

from typing import Any

import pytest
from harness.brokers import BrokerCluster
from harness.ports import closed_port
from harness.spark import source_options

# A SparkSession on two loaded cores: queries can take minutes.
pytestmark = [pytest.mark.pipeline, pytest.mark.timeout(900)]


def load(spark: Any, options: dict[str, str]) -> Any:
    return spark.read.format("kafscale").options(**options).load()


def test_missing_or_malformed_options_name_the_option(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    """A read's and a write's option error, each as Spark reports it. Every other option's
    message comes from the same parser on the same path (``parse_read_options`` in the reader's
    planning): ``tests/unit/test_pipeline_planning.py::test_bad_options_are_named`` names each
    one without a Spark planner process per case (seconds each on loaded cores)."""
    base = source_options(broker_cluster)
    with pytest.raises(Exception, match=r"subscribe, subscribePattern, assign"):
        load(spark, base).collect()
    with pytest.raises(Exception, match=r"kafka.bootstrap.servers"):
        spark.createDataFrame([("v",)], "value string").write.format("kafscale").option(
            "topic", "t"
        ).mode("append").save()


def test_options_that_cannot_apply_together_are_refused_as_the_broker_refuses_them(
    spark: Any, broker_cluster: BrokerCluster
) -> None:
    """A bucket beside ``storage.kind=local`` read the local directory (empty: no rows, no
    error) of a user who thought the query read the bucket; the same rules as the broker's."""
    options = {
        **source_options(broker_cluster),
        "subscribe": "t",
        "storage.kind": "local",
        "storage.local_dir": "/nonexistent",
    }
    options.pop("storage.endpoint")
    with pytest.raises(
        Exception,
        match=r"option storage.bucket is for an S3 store, but option "
        r"storage.kind is local",
    ):
        load(spark, options).collect()


def test_an_unknown_topic_is_named(spark: Any, broker_cluster: BrokerCluster) -> None:
    options = {**source_options(broker_cluster), "subscribe": "nowhere"}
    with pytest.raises(Exception, match=r"unknown topic.*nowhere"):
        load(spark, options).collect()


def test_an_unreachable_etcd_fails_fast(spark: Any, broker_cluster: BrokerCluster) -> None:
    options = {
        **source_options(broker_cluster),
        "subscribe": "t",
        "etcd.endpoints": f"http://127.0.0.1:{closed_port()}",  # on purpose: nothing listens
        "etcd.timeout_s": "2",
    }
    with pytest.raises(Exception, match=r"etcd at http://127.0.0.1:.* cannot be reached"):
        load(spark, options).collect()


def test_a_missing_bucket_is_named(spark: Any, broker_cluster: BrokerCluster) -> None:
    from confluent_kafka import Producer
    from harness.topics import create_topic

    broker = broker_cluster.start()
    create_topic(broker.bootstrap, "t", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("t", b"v")
    assert producer.flush(10) == 0
    options = {**source_options(broker_cluster), "subscribe": "t", "storage.bucket": "no-such"}
    with pytest.raises(Exception, match=r"object store not usable.*no-such"):
        load(spark, options).collect()
