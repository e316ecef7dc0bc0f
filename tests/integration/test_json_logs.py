"""``--log-format json``: a broker's log is one JSON object a line, with its node id, and the
lines about a partition name its topic and partition."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer
from harness.brokers import BrokerCluster

from kafscale.broker.cli import _load_settings, _parser

pytestmark = pytest.mark.integration


def test_json_log_lines_name_broker_topic_and_partition(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start(KAFSCALE_LOG_FORMAT="json")
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("logged", value=b"v", partition=0)
    assert producer.flush(30) == 0
    deadline = time.monotonic() + 10
    acquired: list[dict[str, object]] = []
    while not acquired and time.monotonic() < deadline:
        lines = [json.loads(line) for line in broker.log_path.read_text().splitlines() if line]
        acquired = [
            line
            for line in lines
            if str(line["message"]).startswith("acquired logged") and line.get("partition") == 0
        ]
        time.sleep(0.1)
    # The broker claims every partition of the auto-created topic; partition 0's line names it.
    assert acquired, broker.tail()
    assert all(line["node_id"] == broker.node_id for line in lines if "node_id" in line)
    assert acquired[0]["topic"] == "logged"
    assert str(acquired[0]["message"]).startswith("acquired logged-0 ")  # fields match the text
    assert acquired[0]["node_id"] == broker.node_id
    assert any(line["message"].startswith("broker ") for line in lines)


def test_log_format_flag_and_text_default() -> None:
    parser = _parser()
    settings = _load_settings(parser.parse_args(["broker", "--log-format", "json"]))
    assert settings is not None and settings.log_format == "json"
    default = _load_settings(parser.parse_args(["broker"]))
    assert default is not None and default.log_format == "text"
