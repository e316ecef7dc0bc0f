"""Flags, environment variables and the configuration reference, all derived from the one
settings model (``broker/settings_cli.py``, STYLE "Configuration")."""

from __future__ import annotations

import argparse
import json
from enum import Enum
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, get_args, get_origin

import pytest
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from kafscale.broker.config import BrokerSettings
from kafscale.broker.settings_cli import (
    ENV_PREFIX,
    add_settings_flags,
    build_settings,
    config_reference_markdown,
    env_name,
    flag_name,
    iter_fields,
    overrides_from_args,
)

pytestmark = pytest.mark.unit

FIELDS = list(iter_fields(BrokerSettings))
PATHS = [path for path, _ in FIELDS]
IDS = [".".join(path) for path in PATHS]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray .env file


def _base_type(annotation: Any) -> Any:
    if get_origin(annotation) is UnionType:
        return next(a for a in get_args(annotation) if a is not NoneType)
    return annotation


def other_value(info: FieldInfo) -> tuple[str, Any]:
    """A valid non-default value for the field: (raw text as typed, expected plain value)."""
    kind = _base_type(info.annotation)
    default = info.default
    if info.examples:  # a field with a syntax of its own (listeners) names a valid value
        example = info.examples[0]
        return str(example), example
    if kind is bool:
        return ("false", False) if default else ("true", True)
    if isinstance(kind, type) and issubclass(kind, Enum):
        member = next(m for m in kind if m != default)
        return str(member.value), member.value
    if kind is int:
        value = 1234 if default is None else default + 1
        return str(value), value
    if kind is float:
        return str(default * 2), default * 2
    if get_origin(kind) is tuple:
        value = ["http://etcd-a:2379", "http://etcd-b:2379"]
        return json.dumps(value), value
    if kind is Path:
        return "/srv/kafscale/objects", "/srv/kafscale/objects"
    if kind is SecretStr:
        return "s3cr3t", "s3cr3t"
    assert kind is str, f"no test value for {info.annotation}"
    return "some-value", "some-value"


def plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def lookup(settings: BrokerSettings, path: tuple[str, ...]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return plain(value)


def parse_flags(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    return overrides_from_args(parser.parse_args(argv))


def test_names_follow_the_model() -> None:
    assert ("listener", "port") in PATHS
    assert flag_name(("listener", "port")) == "--listener-port"
    assert env_name(("listener", "port")) == "KAFSCALE_LISTENER__PORT"
    assert flag_name(("log_level",)) == "--log-level"
    assert env_name(("log_level",)) == "KAFSCALE_LOG_LEVEL"
    assert flag_name(("limits", "max_in_flight_per_connection")) == (
        "--limits-max-in-flight-per-connection"
    )
    flags = [flag_name(p) for p in PATHS]
    envs = [env_name(p) for p in PATHS]
    assert len(set(flags)) == len(flags) == len(set(envs))


@pytest.mark.parametrize(("path", "info"), FIELDS, ids=IDS)
def test_every_field_is_read_from_its_environment_variable(
    monkeypatch: pytest.MonkeyPatch, path: tuple[str, ...], info: FieldInfo
) -> None:
    raw, expected = other_value(info)
    assert lookup(BrokerSettings(), path) != expected
    monkeypatch.setenv(env_name(path), raw)
    assert lookup(BrokerSettings(), path) == expected


@pytest.mark.parametrize(("path", "info"), FIELDS, ids=IDS)
def test_every_field_has_a_flag(path: tuple[str, ...], info: FieldInfo) -> None:
    raw, expected = other_value(info)
    settings = build_settings(parse_flags([flag_name(path), raw]))
    assert lookup(settings, path) == expected


def test_no_flags_means_no_overrides() -> None:
    assert parse_flags([]) == {}
    assert build_settings({}) == BrokerSettings()


def test_flags_override_the_environment_and_sections_merge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFSCALE_LISTENER__PORT", "1111")
    monkeypatch.setenv("KAFSCALE_LISTENER__HOST", "10.1.2.3")
    monkeypatch.setenv("KAFSCALE_CLUSTER", "from-env")
    overrides = parse_flags(["--listener-port", "2222", "--etcd-endpoints", '["http://x:1"]'])
    assert overrides == {"listener": {"port": "2222"}, "etcd": {"endpoints": ["http://x:1"]}}
    settings = build_settings(overrides)
    assert settings.listener.port == 2222  # flag wins
    assert settings.listener.host == "10.1.2.3"  # env kept for the rest of the section
    assert settings.cluster == "from-env"
    assert settings.etcd.endpoints == ("http://x:1",)


def test_invalid_flag_values_are_rejected() -> None:
    with pytest.raises(ValueError):
        build_settings(parse_flags(["--listener-port", "70000"]))
    with pytest.raises(SystemExit):  # argparse: unknown flag
        parse_flags(["--no-such-section-x", "1"])


def test_help_names_the_environment_variable() -> None:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    text = parser.format_help()
    for path in PATHS:
        assert flag_name(path) in text
        assert env_name(path) in text


def test_config_reference_lists_every_field_once() -> None:
    lines = config_reference_markdown().splitlines()
    assert lines[0].startswith("| environment variable | flag | default |")
    rows = lines[2:]
    assert len(rows) == len(FIELDS)
    for row, (path, info) in zip(rows, FIELDS, strict=True):
        assert row.startswith(f"| `{env_name(path)}` | `{flag_name(path)}` |")
        assert row.endswith(f"| {info.description or ''} |")
    by_env = {row.split("`")[1]: row for row in rows}
    assert "`9092`" in by_env["KAFSCALE_LISTENER__PORT"]
    assert '`["http://127.0.0.1:2379"]`' in by_env["KAFSCALE_ETCD__ENDPOINTS"]
    assert "`s3`" in by_env["KAFSCALE_STORAGE__KIND"]


def test_list_flags_take_comma_separated_values_as_well_as_json() -> None:
    endpoints = ["http://etcd-a:2379", "http://etcd-b:2379"]
    typed = build_settings(
        parse_flags(["--etcd-endpoints", "http://etcd-a:2379, http://etcd-b:2379"])
    )
    assert list(typed.etcd.endpoints) == endpoints
    as_json = build_settings(parse_flags(["--etcd-endpoints", json.dumps(endpoints)]))
    assert list(as_json.etcd.endpoints) == endpoints
    one = build_settings(parse_flags(["--etcd-endpoints", "http://etcd-a:2379"]))
    assert list(one.etcd.endpoints) == endpoints[:1]
    # a plain text setting keeps its commas
    named = build_settings(parse_flags(["--cluster", "a,b"]))
    assert named.cluster == "a,b"


@pytest.mark.parametrize(
    ("bind", "advertised", "expected"),
    [
        ("0.0.0.0", None, "broker-3.example.net"),  # every interface: the machine's name
        ("::", None, "broker-3.example.net"),
        ("10.1.2.3", None, "10.1.2.3"),  # one address: that address
        ("0.0.0.0", "kafka.example.net", "kafka.example.net"),  # set: always that
    ],
)
def test_the_advertised_host_is_never_loopback_for_a_broker_bound_to_every_interface(
    bind: str, advertised: str | None, expected: str
) -> None:
    listener = BrokerSettings().listener.model_copy(
        update={"host": bind, "advertised_host": advertised}
    )
    assert listener.advertised(lambda: "broker-3.example.net") == expected
