"""Command-line flags and the configuration reference, both derived from a settings model
(``BrokerSettings`` for brokers and ``kafscale local``, ``ProxySettings`` for the proxy).

Every field of the settings model becomes a flag (``listener.port`` → ``--listener-port``) and
an environment variable (``KAFSCALE_LISTENER__PORT``), so the two can never drift apart.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any, TypeVar, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from kafscale.broker.config import BrokerSettings
from kafscale.broker.settings_names import env_name as env_name
from kafscale.broker.settings_names import flag_name as flag_name
from kafscale.broker.store_settings import ENV_PREFIX as ENV_PREFIX

S = TypeVar("S", bound=BaseSettings)


def iter_fields(
    model: type[BaseModel], path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from iter_fields(annotation, (*path, name))
        else:
            yield (*path, name), info


def add_settings_flags(
    parser: argparse.ArgumentParser, model: type[BaseSettings] = BrokerSettings
) -> None:
    group = parser.add_argument_group("settings (also KAFSCALE_* environment variables)")
    for path, info in iter_fields(model):
        group.add_argument(
            flag_name(path),
            dest="setting:" + ".".join(path),
            default=None,
            metavar="VALUE",
            help=f"{info.description or ''} [env {env_name(path)}]",
        )


def overrides_from_args(
    args: argparse.Namespace, model: type[BaseSettings] = BrokerSettings
) -> dict[str, Any]:
    """Nested keyword arguments for the settings model from the flags that were given."""
    lists = list_fields(model)
    overrides: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith("setting:") or value is None:
            continue
        path = dest.removeprefix("setting:").split(".")
        target = overrides
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = parse_flag_value(value, is_list=tuple(path) in lists)
    return overrides


def list_fields(model: type[BaseModel] = BrokerSettings) -> set[tuple[str, ...]]:
    """Paths of the settings that hold several values (etcd endpoints)."""
    return {
        path for path, info in iter_fields(model) if get_origin(info.annotation) in (list, tuple)
    }


def parse_flag_value(raw: str, *, is_list: bool) -> Any:
    """JSON for lists and objects; a list may also be given comma-separated, as people type
    ``--etcd-endpoints http://a:2379,http://b:2379`` (Kafka's and etcd's own style)."""
    if raw.startswith(("[", "{")):
        return json.loads(raw)
    if is_list:
        return [item.strip() for item in raw.split(",") if item.strip()]
    return raw


def build_settings(overrides: dict[str, Any]) -> BrokerSettings:
    """Flags win over the environment, which wins over defaults (sections merge)."""
    return build_model(BrokerSettings, overrides)


def build_model(model: type[S], overrides: dict[str, Any]) -> S:
    """``model`` from the environment with ``overrides`` (from flags) on top. Only the values
    given are merged, so the result still knows which settings were set (``model_fields_set``:
    DescribeConfigs tells a broker setting given at start-up from a default)."""
    merged = model().model_dump(exclude_unset=True)
    _deep_merge(merged, overrides)
    return model.model_validate(merged)


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value


def config_reference_markdown(model: type[BaseSettings] = BrokerSettings) -> str:
    lines = [
        "| environment variable | flag | default | meaning |",
        "|---|---|---|---|",
    ]
    for path, info in iter_fields(model):
        default = info.default
        shown = getattr(default, "value", default)
        if isinstance(shown, tuple):
            shown = json.dumps(list(shown))
        if shown == "":
            shown = '""'
        lines.append(
            f"| `{env_name(path)}` | `{flag_name(path)}` | `{shown}` | {info.description or ''} |"
        )
    return "\n".join(lines)


def full_reference_markdown() -> str:
    """The README's reference: the broker's settings, then the proxy's."""
    from kafscale.broker.proxy.config import ProxySettings

    return (
        f"{config_reference_markdown()}\n\n"
        "`kafscale proxy` reads these (same variables and flags, its own defaults):\n\n"
        f"{config_reference_markdown(ProxySettings)}"
    )


README_START = "<!-- config-reference:start -->"
README_END = "<!-- config-reference:end -->"


def update_readme(text: str) -> str:
    """``text`` with the part between the config-reference markers regenerated."""
    start = text.index(README_START) + len(README_START)
    end = text.index(README_END)
    return f"{text[:start]}\n{full_reference_markdown()}\n{text[end:]}"
