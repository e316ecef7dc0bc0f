"""DescribeQuorum (API 55) is not served: KafScale has no KRaft controller quorum (its metadata
quorum is etcd: ``etcdctl endpoint status``, ``etcdctl member list``). A Kafka 4 broker forwards
the request to its active controller; a KafScale broker and the proxy leave it out of
ApiVersions, so the Java AdminClient's ``describeMetadataQuorum`` (``kafka-metadata-quorum.sh
--bootstrap-server``) fails at once with UnsupportedVersionException, naming the API, and the
client goes on working. A client that sends the request all the same gets UNSUPPORTED_VERSION
with its correlation id, and the connection stays open.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import children
from harness.brokers import BrokerCluster, BrokerProcess
from harness.java_client import java_program
from harness.kafka_wire import KafkaWire, sample_body
from harness.proxy import brokers_behind_a_proxy
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

DESCRIBE_QUORUM, API_VERSIONS = 55, 18
UNSUPPORTED_VERSION = 35
JAVA_SOURCE = Path(__file__).with_name("java") / "QuorumAdmin.java"


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("quorum")
    with brokers_behind_a_proxy(etcd_server.client_url, s3_server, workdir, "quorum") as cluster:
        yield cluster


@pytest.fixture(params=["broker", "proxy"])
def endpoint(request: pytest.FixtureRequest, cluster: BrokerCluster) -> BrokerProcess:
    broker, proxy = cluster.brokers
    return broker if request.param == "broker" else proxy


def test_the_java_admin_gets_unsupported_version_not_a_hang(endpoint: BrokerProcess) -> None:
    """The Admin's own timeouts are 120 s: a request left unanswered, or a closed connection
    retried, would end in a TimeoutException; the call fails with the API named instead."""
    out = children.run(
        [*java_program(JAVA_SOURCE, "QuorumAdmin"), endpoint.bootstrap],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout.splitlines()
    assert out[0].startswith("error UnsupportedVersionException "), out
    assert "DESCRIBE_QUORUM" in out[0], out
    assert out[1] == "cluster 1 nodes", out


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_describe_quorum_request_gets_unsupported_version_and_the_connection_lives(
    endpoint: BrokerProcess, version: int
) -> None:
    with KafkaWire(endpoint.bootstrap) as wire:
        body = sample_body(codec.request_schema(DESCRIBE_QUORUM, version))
        response = wire.request(DESCRIBE_QUORUM, version, body)
        assert int(response.error_code) == UNSUPPORTED_VERSION
        advertised = wire.request(API_VERSIONS, 3, {})
    assert int(advertised.error_code) == 0
    assert DESCRIBE_QUORUM not in {int(k.api_key) for k in advertised.api_keys}
