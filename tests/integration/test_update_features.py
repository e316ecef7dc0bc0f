"""UpdateFeatures (API 57) end to end: what ``kafka-features.sh upgrade|downgrade|--dry-run`` and
the Java Admin's ``updateFeatures``/``describeFeatures`` get from brokers and the proxy.

The finalized levels are fixed (``share.version`` 1, ``transaction.version`` the setting, 2 by
default): the level a feature has succeeds, anything else is INVALID_UPDATE_VERSION with Kafka's
message, the first refused update failing the whole request; ALTER on CLUSTER is asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.brokers import BrokerCluster, BrokerProcess
from harness.children import run
from harness.java_client import java_program
from harness.kafka_wire import KafkaWire
from harness.proxy import brokers_behind_a_proxy
from harness.s3 import S3Endpoint
from harness.secured import authorizing_cluster, grant_cluster

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = pytest.mark.integration

UPDATE_FEATURES = 57
NONE, CLUSTER_AUTHORIZATION_FAILED, INVALID_UPDATE_VERSION = 0, 31, 95
JAVA_SOURCE = Path(__file__).with_name("java") / "FeaturesAdmin.java"
FAILED = "The update failed for all features since the following feature had an error: "


@pytest.fixture(scope="module")
def cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerCluster]:
    workdir = tmp_path_factory.mktemp("features")
    with brokers_behind_a_proxy(etcd_server.client_url, s3_server, workdir, "features") as cluster:
        yield cluster


@pytest.fixture(scope="module", params=["broker", "proxy"])
def endpoint(cluster: BrokerCluster, request: pytest.FixtureRequest) -> BrokerProcess:
    return cluster.brokers[0 if request.param == "broker" else 1]


def features_admin(bootstrap: str, *steps: str) -> list[list[str]]:
    """``FeaturesAdmin``'s output lines for each step, all run by one JVM on one Admin
    (compiled on first use): a JVM start costs ~2.5 s of CPU, so a test's steps share one."""
    done = run(
        [*java_program(JAVA_SOURCE, "FeaturesAdmin"), bootstrap, *steps],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    outputs: list[list[str]] = [[]]
    for line in done.stdout.splitlines():
        if line == "end":
            outputs.append([])
        else:
            outputs[-1].append(line)
    assert outputs.pop() == [] and len(outputs) == len(steps), done.stdout
    return outputs


def update(feature: str, level: int, kind: str = "UPGRADE", dry: bool = False) -> str:
    """The ``FeaturesAdmin`` step of ``kafka-features.sh upgrade|downgrade [--dry-run]``."""
    return f"update {feature} {level} {kind} {'dry' if dry else 'apply'}"


DESCRIBE = "describe"


def test_describe_features_reports_the_finalized_levels(endpoint: BrokerProcess) -> None:
    (described,) = features_admin(endpoint.bootstrap, DESCRIBE)
    lines = set(described)
    assert {"finalized share.version 1 1", "finalized transaction.version 2 2"} <= lines
    assert {"supported share.version 0 1", "supported transaction.version 0 2"} <= lines


@pytest.mark.parametrize("dry", [False, True], ids=["apply", "dry-run"])
def test_setting_the_level_a_feature_has_succeeds(endpoint: BrokerProcess, dry: bool) -> None:
    """``kafka-features.sh upgrade --feature share.version=1`` on a cluster that has it."""
    share, transaction, lines = features_admin(
        endpoint.bootstrap,
        update("share.version", 1, dry=dry),
        update("transaction.version", 2, dry=dry),
        DESCRIBE,
    )
    assert share == ["ok"]
    assert transaction == ["ok"]
    assert "finalized share.version 1 1" in lines


@pytest.mark.parametrize("dry", [False, True], ids=["apply", "dry-run"])
def test_another_level_is_invalid_update_version_with_kafkas_message(
    endpoint: BrokerProcess, dry: bool
) -> None:
    prefix = "error InvalidUpdateVersionException " + FAILED
    (beyond,), (unknown,), (unsafe,), (fixed,), (downgrade,), lines = features_admin(
        endpoint.bootstrap,
        update("share.version", 2, dry=dry),
        update("no.such.version", 1, dry=dry),
        update("transaction.version", 1, dry=dry),
        update("share.version", 0, "SAFE_DOWNGRADE", dry=dry),
        update("transaction.version", 1, "SAFE_DOWNGRADE", dry=dry),
        DESCRIBE,
    )
    assert beyond.startswith(prefix + "Invalid update version 2 for feature share.version. ")
    assert beyond.endswith(" only supports versions 0-1")
    assert unknown.startswith(prefix + "Invalid update version 1 for feature no.such.version. ")
    assert unknown.endswith(" does not support this feature.")
    assert unsafe == (
        prefix + "Invalid update version 1 for feature transaction.version. Can't downgrade the "
        "version of this feature without setting the upgrade type to either safe or unsafe "
        "downgrade."
    )
    assert fixed.startswith(prefix + "Invalid update version 0 for feature share.version. ")
    assert "cannot be changed at run time" in fixed
    assert "transactions.protocol_version" in downgrade
    assert {"finalized share.version 1 1", "finalized transaction.version 2 2"} <= set(lines)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_version_answers_in_its_layout(endpoint: BrokerProcess, version: int) -> None:
    """v0/v1 carry one result per feature on success and none on failure; v2 only the
    top-level error. One refused feature fails the whole request."""
    key = {"allow_downgrade": False} if version == 0 else {"upgrade_type": 1}
    ok = {"feature": "share.version", "max_version_level": 1, **key}
    bad = {"feature": "share.version", "max_version_level": 5, **key}
    with KafkaWire(endpoint.bootstrap) as wire:
        done = wire.request(UPDATE_FEATURES, version, {"feature_updates": [ok]})
        failed = wire.request(UPDATE_FEATURES, version, {"feature_updates": [ok, bad]})
    assert int(done.error_code) == NONE and done.error_message is None
    assert int(failed.error_code) == INVALID_UPDATE_VERSION
    assert str(failed.error_message).startswith(FAILED + "Invalid update version 5 ")
    if version < 2:
        assert [(r.feature, int(r.error_code)) for r in done.results] == [("share.version", 0)]
        assert list(failed.results) == []


def test_updating_features_needs_alter_on_the_cluster(
    etcd_server: EmbeddedEtcd, s3_server: S3Endpoint, tmp_path: Path
) -> None:
    with authorizing_cluster(etcd_server.client_url, s3_server, tmp_path, "featacl") as cluster:
        bootstrap = cluster.brokers[0].bootstrap
        ((denied,),) = features_admin(bootstrap, update("share.version", 1))
        assert denied.startswith("error ClusterAuthorizationException")
        grant_cluster(cluster, "ALTER")
        assert features_admin(bootstrap, update("share.version", 1)) == [["ok"]]
