"""DescribeConfigs through the proxy (``broker/proxy/configs.py``): which broker answers each
resource, and how a broker's description of itself becomes the proxy's."""

from __future__ import annotations

from typing import Any

import pytest

from kafscale.broker.api.features import SHARE_CONSUMER_KEYS
from kafscale.broker.api.served import api_versions_body
from kafscale.broker.api.table import API_TABLE
from kafscale.broker.protocol import codec
from kafscale.broker.proxy import answers
from kafscale.broker.proxy.answers import PROXY_TABLE
from kafscale.broker.proxy.configs import ANY, BROKER_RESOURCE, Target, as_broker, as_proxy, plan
from kafscale.broker.proxy.handlers import HANDLERS

pytestmark = pytest.mark.unit

TOPIC_RESOURCE = 2
REQUEST_V4 = codec.request_schema(32, 4)
RESPONSE_V4 = codec.response_schema(32, 4)


def request(*resources: tuple[int, str]) -> Any:
    return codec.build_entity(
        REQUEST_V4,
        {
            "resources": [
                {"resource_type": kind, "resource_name": name, "configuration_keys": None}
                for kind, name in resources
            ],
            "include_synonyms": False,
            "include_documentation": False,
        },
    )


def test_each_resource_goes_where_it_can_be_answered() -> None:
    body = request(
        (TOPIC_RESOURCE, "orders"),
        (BROKER_RESOURCE, "1000"),  # the proxy itself
        (BROKER_RESOURCE, "2"),  # a live broker (clients see its id with expose_owners)
        (BROKER_RESOURCE, ""),  # the cluster default
        (BROKER_RESOURCE, "7"),  # no such broker: any broker refuses it alike
    )
    assert plan(body.resources, 1000, live={1, 2, 3}) == [
        Target(ANY),
        Target(ANY, as_proxy=True),
        Target(2),
        Target(ANY),
        Target(ANY),
    ]


def test_the_proxys_resource_is_asked_under_the_answering_brokers_id() -> None:
    (resource,) = request((BROKER_RESOURCE, "1000")).resources
    assert as_broker(resource, 3).resource_name == "3"


def test_a_brokers_description_of_itself_becomes_the_proxys() -> None:
    response = codec.build_entity(
        RESPONSE_V4,
        {
            "throttle_time": 0,
            "results": [
                {
                    "error_code": 0,
                    "resource_type": BROKER_RESOURCE,
                    "resource_name": "3",
                    "configs": [
                        {"name": name, "value": value, "config_source": 4, "synonyms": []}
                        for name, value in [
                            ("broker.id", "3"),
                            ("node.id", "3"),
                            ("advertised.listeners", "INTERNAL://10.0.0.3:9093"),
                            ("listener.security.protocol.map", "INTERNAL:PLAINTEXT"),
                            ("num.partitions", "6"),
                        ]
                    ],
                }
            ],
        },
    )
    own = {
        "advertised.listeners": "EXTERNAL://proxy.example:9092",
        "listener.security.protocol.map": "EXTERNAL:SASL_SSL",
    }
    result = as_proxy(response.results[0], 1000, own)
    assert result.resource_name == "1000"
    assert {c.name: c.value for c in result.configs} == {
        "broker.id": "1000",
        "node.id": "1000",
        "advertised.listeners": "EXTERNAL://proxy.example:9092",
        "listener.security.protocol.map": "EXTERNAL:SASL_SSL",
        "num.partitions": "6",
    }


def test_the_proxy_handles_every_api_it_advertises() -> None:
    """The proxy advertises the brokers' API table, a share consumer's APIs and
    ``share.version`` included, exactly as a broker does; an API in it without a proxy handler
    is one the proxy closes the connection on (AlterConfigs was, for aiokafka's
    alter_configs)."""
    assert sorted(set(PROXY_TABLE) - set(HANDLERS)) == []
    advertised = {k["api_key"] for k in answers.api_versions(2)["api_keys"]}
    assert advertised == set(PROXY_TABLE) == set(API_TABLE)
    assert SHARE_CONSUMER_KEYS | {77, 90, 91, 92} <= advertised
    proxy = answers.api_versions(2)
    broker = api_versions_body(API_TABLE, transaction_version=2)
    assert proxy["finalized_features"] == broker["finalized_features"]
    assert proxy["supported_features"] == broker["supported_features"]
    assert {"name": "share.version", "max_version_level": 1, "min_version_level": 1} in [
        dict(f) for f in proxy["finalized_features"]
    ]


def test_the_proxys_own_values_replace_the_brokers_in_synonyms_too() -> None:
    """With include_synonyms, a tool shows the synonyms' values: the answering broker's id
    there would contradict the proxy's id in the entry."""
    response = codec.build_entity(
        RESPONSE_V4,
        {
            "throttle_time": 0,
            "results": [
                {
                    "error_code": 0,
                    "resource_type": BROKER_RESOURCE,
                    "resource_name": "3",
                    "configs": [
                        {
                            "name": "broker.id",
                            "value": "3",
                            "config_source": 4,
                            "synonyms": [{"name": "broker.id", "value": "3", "source": 4}],
                        },
                        {
                            "name": "num.partitions",
                            "value": "6",
                            "config_source": 4,
                            "synonyms": [
                                {"name": "num.partitions", "value": "6", "source": 4},
                                {"name": "num.partitions", "value": "3", "source": 5},
                            ],
                        },
                    ],
                }
            ],
        },
    )
    configs = {c.name: c for c in as_proxy(response.results[0], 1000, {}).configs}
    assert [(s.value, s.source) for s in configs["broker.id"].synonyms] == [("1000", 4)]
    assert [(s.value, s.source) for s in configs["num.partitions"].synonyms] == [
        ("6", 4),
        ("3", 5),
    ]
