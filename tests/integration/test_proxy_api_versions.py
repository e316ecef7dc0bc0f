"""The proxy's ApiVersions answer is a broker's, byte for byte, at every version: a client that
bootstraps through the proxy pins the same versions as one talking to a broker. Both answer
from ``broker/api/served.py`` (the proxy without loading the broker's request handlers); these
tests hold the two answers together with a real broker process and a real proxy process.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.brokers import BrokerCluster, BrokerProcess
from harness.kafka_wire import KafkaWire
from harness.proxy import brokers_behind_a_proxy
from harness.s3 import S3Endpoint

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.protocol import codec

pytestmark = pytest.mark.integration

API_VERSIONS = 18
UNSUPPORTED_VERSION = 35


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("apiv")
    with brokers_behind_a_proxy(
        etcd_server.client_url, s3_server, workdir, "apiversions"
    ) as cluster:
        yield cluster


def _answer(endpoint: BrokerProcess, version: int) -> bytes:
    """The raw ApiVersions response frame (correlation id fixed) of ``endpoint``."""
    with KafkaWire(endpoint.bootstrap) as wire:
        body = {"client_software_name": "kafscale-test", "client_software_version": "1"}
        wire.send(API_VERSIONS, version, body if version >= 3 else {}, correlation_id=7)
        return wire.recv_frame()


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_the_proxy_answers_api_versions_as_a_broker_does(
    cluster: BrokerCluster, version: int
) -> None:
    broker, proxy = cluster.brokers
    from_broker, from_proxy = _answer(broker, version), _answer(proxy, version)
    assert from_proxy == from_broker
    answer = codec.decode_response(from_proxy, API_VERSIONS, version)
    assert int(answer.error_code) == 0
    assert {int(k.api_key) for k in answer.api_keys} >= {0, 1, 3, 18}


def test_an_api_versions_version_not_served_gets_the_same_v0_list_from_both(
    cluster: BrokerCluster,
) -> None:
    """KIP-511: a newer ApiVersions than served is answered in v0 with UNSUPPORTED_VERSION and
    the served list, so that the client can pick a version it shares."""
    broker, proxy = cluster.brokers
    from_broker, from_proxy = _answer(broker, 4), _answer(proxy, 4)
    assert from_proxy == from_broker
    answer = codec.decode_response(from_proxy, API_VERSIONS, 0)
    assert int(answer.error_code) == UNSUPPORTED_VERSION
    assert {int(k.api_key) for k in answer.api_keys} >= {0, 1, 3, 18}
