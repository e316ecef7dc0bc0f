"""``spec.brokers.config`` values the brokers (or the proxy) would refuse at start are refused by
the operator, naming the keys: no pods are rolled out to crash-loop on them."""

from __future__ import annotations

from typing import Any

import pytest
from harness.cluster_specs import REF, THREE_LISTENERS, cluster_spec

from kafscale.operator import manifests
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.models import parse_cluster_spec
from kafscale.operator.pod_settings import settings_problems

pytestmark = pytest.mark.operator


def problems(config: dict[str, str], **sections: Any) -> list[str]:
    return settings_problems(
        REF, parse_cluster_spec(cluster_spec(brokers={"config": config}, **sections))
    )


@pytest.mark.parametrize(
    "sections",
    [
        {},
        {"proxy": {"enabled": True}},
        {"listeners": THREE_LISTENERS, "proxy": {"enabled": True}, "authorizer": True},
        {"etcd": {"tls": True}, "listeners": THREE_LISTENERS},
    ],
)
def test_the_operators_own_settings_pass(sections: dict[str, Any]) -> None:
    assert problems({}, **sections) == []
    assert (
        problems(
            {"log.flush_interval_ms": "50", "etcd.username": "u", "etcd.password": "p"}, **sections
        )
        == []
    )


def test_a_value_out_of_range_or_of_the_wrong_type_names_the_key_and_the_value() -> None:
    assert sorted(problems({"log.segment_bytes": "12", "limits.max_frame_bytes": "lots"})) == [
        "brokers.config['limits.max_frame_bytes']: Input should be a valid integer, unable to "
        "parse string as an integer (given 'lots')",
        "brokers.config['log.segment_bytes']: Input should be greater than or equal to 1024 "
        "(given '12')",
    ]


def test_a_list_setting_that_is_not_json_names_the_key() -> None:
    """pydantic-settings raises for it without naming the setting; the broker printed a
    traceback."""
    assert problems({"authorizer.super_users": "User:admin"}) == [
        "brokers.config['authorizer.super_users']: 'User:admin' is not a JSON list"
    ]


def test_half_a_pair_names_both_keys() -> None:
    assert problems({"etcd.username": "kafscale"}) == [
        "brokers.config['etcd.username'] is set without brokers.config['etcd.password']: "
        "give both or neither"
    ]
    assert problems({"etcd.key_file": "/k"}) == [
        "brokers.config['etcd.key_file'] is set without brokers.config['etcd.cert_file']: "
        "give both or neither"
    ]


def test_a_check_across_settings_of_the_broker_model_is_reported() -> None:
    """The broker's own cross-field checks (an SSL listener needs a certificate)."""
    [line] = problems({"listeners": "SSL://:9093", "listener_security_protocol_map": "SSL:SSL"})
    assert "SSL or SASL_SSL listener needs tls.cert_file and tls.key_file" in line


def test_with_the_proxy_a_value_both_refuse_is_named_once() -> None:
    """The proxy reads the brokers' ConfigMap too, through its own model: checked as well."""
    config = {"transactions.protocol_version": "3"}
    [line] = problems(config, proxy={"enabled": True})
    assert line.startswith("brokers.config['transactions.protocol_version']: Input should be")


def test_building_the_objects_refuses_the_spec() -> None:
    spec = parse_cluster_spec(cluster_spec(brokers={"config": {"etcd.password": "p"}}))
    with pytest.raises(InvalidBrokerConfig, match=r"brokers\.config\['etcd\.password'\]") as raised:
        manifests.build_cluster_objects(REF, spec)
    assert str(raised.value).startswith("the brokers would refuse their settings and not start:")


def test_listeners_in_brokers_config_get_no_port_or_advertised_host_beside_them() -> None:
    """The broker ignored the one listener's port and the pod IP as its advertised host beside
    ``listeners``, and refuses them now unless the listeners have them: the operator renders
    neither there (as with ``spec.listeners``), so such a spec still rolls out."""
    config = {
        "listeners": "PLAINTEXT://:9093",
        "advertised_listeners": "PLAINTEXT://kafka.example.com:9093",
    }
    assert problems(config) == []
    assert problems(config, proxy={"enabled": True}) == []
