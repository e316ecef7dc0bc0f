"""``settings_from_environment``: the settings a process would parse from variables that are not
this process's own (the operator checks the pods' variables with it)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.settings_check import unparsable_variables
from kafscale.broker.settings_environment import settings_from_environment

pytestmark = pytest.mark.unit


def test_the_variables_given_are_parsed_as_a_process_parses_its_own() -> None:
    settings = settings_from_environment(
        BrokerSettings,
        {
            "KAFSCALE_ETCD__ENDPOINTS": '["http://etcd-0:2379", "http://etcd-1:2379"]',
            "kafscale_log__segment_bytes": "2048",
        },
    )
    assert settings.etcd.endpoints == ("http://etcd-0:2379", "http://etcd-1:2379")
    assert settings.log.segment_bytes == 2048
    assert settings.model_fields_set == {"etcd", "log"}
    assert settings.etcd.model_fields_set == {"endpoints"}


def test_this_processs_own_environment_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFSCALE_CLUSTER", "from-the-operators-environment")
    monkeypatch.setenv("KAFSCALE_LOG__SEGMENT_BYTES", "12")
    assert settings_from_environment(BrokerSettings, {}).cluster == "default"
    assert settings_from_environment(ProxySettings, {"KAFSCALE_CLUSTER": "c"}).cluster == "c"


def test_a_value_the_model_refuses_raises_its_validation_error() -> None:
    with pytest.raises(ValidationError) as raised:
        settings_from_environment(BrokerSettings, {"KAFSCALE_LOG__SEGMENT_BYTES": "12"})
    assert [error["loc"] for error in raised.value.errors()] == [("log", "segment_bytes")]


def test_a_list_variable_that_is_not_json_is_named() -> None:
    environ = {
        "KAFSCALE_AUTHORIZER__SUPER_USERS": "User:a",
        "KAFSCALE_ETCD__ENDPOINTS": '["http://etcd:2379"]',
        "KAFSCALE_LOG__SEGMENT_BYTES": "not json, not a list setting",
    }
    assert unparsable_variables(environ, BrokerSettings) == [
        "authorizer.super_users (KAFSCALE_AUTHORIZER__SUPER_USERS): 'User:a' is not JSON; give "
        'a JSON list, e.g. \'["a", "b"]\' (the flag --authorizer-super-users also takes a,b)'
    ]
