"""`kafscale local` prints a Spark snippet whose options the data source accepts as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kafscale.broker.config import BrokerSettings
from kafscale.broker.local import LocalOptions, local_settings, spark_snippet
from kafscale.pipeline.options import parse_read_options

pytestmark = pytest.mark.unit


def test_the_banners_spark_snippet_points_at_the_local_cluster(tmp_path: Path) -> None:
    options = LocalOptions(data_dir=tmp_path, brokers=1, port=9092, host="127.0.0.1")
    settings = local_settings(BrokerSettings(), options, "http://127.0.0.1:2379", 0)
    snippet = spark_snippet(settings, "http://127.0.0.1:2379", "orders")
    assert snippet.strip().startswith('df = (spark.read.format("kafscale")')
    given = dict(re.findall(r'\.option\("([^"]+)", "([^"]*)"\)', snippet))
    read = parse_read_options(given, streaming=False)
    assert read.connection.etcd.endpoints == ("http://127.0.0.1:2379",)
    assert read.connection.cluster == settings.cluster
    assert read.connection.storage.local_dir == (tmp_path / "objects").resolve()
    assert read.subscription.topics == ("orders",)
