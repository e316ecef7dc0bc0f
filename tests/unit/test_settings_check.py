"""Configuration mistakes as one line each, naming what the user typed and what they meant."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.settings_check import describe_errors, misspelt_variables
from kafscale.broker.settings_cli import env_name, iter_fields

pytestmark = pytest.mark.unit
MODELS = [BrokerSettings, ProxySettings]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("KAFSCALE_ETCD_ENDPOINTS", "KAFSCALE_ETCD__ENDPOINTS"),  # one underscore for two
        ("KAFSCALE_LISTENR__PORT", "KAFSCALE_LISTENER__PORT"),  # a section misspelt
        ("KAFSCALE_LOG_FORMATT", "KAFSCALE_LOG_FORMAT"),
        ("kafscale_etcd_endpoints", "KAFSCALE_ETCD__ENDPOINTS"),  # read case-insensitively
    ],
)
def test_a_near_miss_of_a_setting_is_named_with_the_setting_meant(typed: str, meant: str) -> None:
    assert misspelt_variables({typed: "x"}, MODELS) == [
        f"{typed} is not a setting; did you mean {meant}?"
    ]


def test_settings_and_variables_like_no_setting_pass() -> None:
    every_setting = {env_name(p): "x" for m in MODELS for p, _ in iter_fields(m)}
    others = {  # the operator's, the manifests', a test harness's own
        name: "x"
        for name in (
            "KAFSCALE_POD_NAME",
            "KAFSCALE_ADMIN__TOKEN_FILE",
            "KAFSCALE_OPERATOR_NAMESPACES",
            "KAFSCALE_OPERATOR_RESYNC_INTERVAL_S",
            "KAFSCALE_KUBE_BIN",
            "KAFSCALE_PORT_SLICE",
            "KAFSCALE_XDIST_GROUPS",
            "KAFSCALE_STORAGE__BUCKT",  # in a known section: the model's own check says it
            "PATH",
        )
    }
    assert misspelt_variables(every_setting | others, MODELS) == []


def errors_of(**values: object) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        BrokerSettings.model_validate(values)
    return describe_errors(raised.value, BrokerSettings)


def test_an_unknown_setting_in_a_section_is_one_line_with_the_setting_meant() -> None:
    assert errors_of(storage={"buckt": "x"}) == [
        "storage.buckt (KAFSCALE_STORAGE__BUCKT or --storage-buckt) is not a setting; "
        "did you mean KAFSCALE_STORAGE__BUCKET?"
    ]


def test_a_bad_value_is_one_line_with_the_value_given() -> None:
    (line,) = errors_of(listener={"port": "abc"})
    assert line.startswith("listener.port (KAFSCALE_LISTENER__PORT or --listener-port): ")
    assert line.endswith("(given 'abc')") and "\n" not in line


@pytest.mark.parametrize("model", MODELS)
def test_a_log_level_is_checked_and_taken_in_any_case(model: type[BrokerSettings]) -> None:
    """``logging.basicConfig`` raised on an unknown level after the settings had passed."""
    assert model(log_level="debug").log_level == "DEBUG"
    assert model(log_level="Warning").log_level == "WARNING"
    with pytest.raises(ValidationError) as raised:
        model(log_level="LOUD")
    assert describe_errors(raised.value, model) == [
        "log_level (KAFSCALE_LOG_LEVEL or --log-level): not a logging level: "
        "use DEBUG, INFO, WARNING, ERROR or CRITICAL (given 'LOUD')"
    ]
