"""Would the pods start? The broker's and the proxy's start-up checks, run on what they are told.

``brokerconfig`` refuses a ``brokers.config`` key that names no setting, but a value the broker
refuses (``log.segment_bytes: "12"``, a number that is not one), half of a pair (an etcd user
without its password) or a combination ``settings_combinations`` refuses was rendered anyway:
every broker pod then exited 2 and crash-looped, and the cluster's status only said that the
rollout did not progress. Here the operator parses the variables a broker pod (and a proxy pod)
would start with through the same pydantic models and the same combination check, and refuses
the spec (``InvalidBrokerConfig``, reported as ``InvalidSpec``) naming the keys, before it
applies a thing; the running pods stay as they are.

Values only a pod knows (its name and IP from the downward API, Secrets) get stand-ins: every
such variable is an operator-set one whose value is well-formed, and only its presence matters
to the checks. Warnings (harmless redundancies) are not the operator's to report: the pods log
them. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.settings_check import unparsable_settings
from kafscale.broker.settings_combinations import (
    broker_combinations,
    proxy_combinations,
    renamed,
)
from kafscale.broker.settings_environment import settings_from_environment
from kafscale.broker.settings_names import env_name
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.manifest_brokers import build_broker_deployment
from kafscale.operator.manifest_config import broker_environment
from kafscale.operator.manifest_proxy import build_proxy_deployment
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec

STAND_INS = {"metadata.name": "<pod name>", "status.podIP": "<pod IP>"}
"""Downward-API fields of broker and proxy pods, with values of the same form."""

SECRET_STAND_IN = "stand-in"


def broker_pod_variables(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The ``KAFSCALE_*`` variables a broker container starts with (ConfigMap, then ``env``)."""
    return _container_variables(ref, spec, build_broker_deployment(ref, spec))


def proxy_pod_variables(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The ``KAFSCALE_*`` variables a proxy container starts with (ConfigMap, then ``env``)."""
    return _container_variables(ref, spec, build_proxy_deployment(ref, spec))


def _container_variables(
    ref: ClusterRef, spec: KafScaleClusterSpec, deployment: dict[str, Any]
) -> dict[str, str]:
    """Its container's ``envFrom`` (the one ConfigMap, ``broker_environment``) under its
    ``env``, as the kubelet merges them: read from the Deployment the operator would apply."""
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {**broker_environment(ref, spec), **_resolved(container.get("env", []))}


def settings_problems(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[str]:
    """One line per reason a broker (or, when enabled, proxy) pod would refuse to start, in
    the terms of the spec (``brokers.config['etcd.username']``); empty when they would start."""
    config = spec.brokers.config
    lines = _refusals(BrokerSettings, broker_pod_variables(ref, spec), config)
    if spec.proxy.enabled:
        lines += _refusals(ProxySettings, proxy_pod_variables(ref, spec), config)
    return list(dict.fromkeys(lines))


def check_pod_settings(ref: ClusterRef, spec: KafScaleClusterSpec) -> None:
    """Raise ``InvalidBrokerConfig`` naming every problem ``settings_problems`` finds."""
    problems = settings_problems(ref, spec)
    if problems:
        raise InvalidBrokerConfig(
            f"the brokers would refuse their settings and not start: {'; '.join(problems)}"
        )


def _refusals(
    model: type[BrokerSettings] | type[ProxySettings],
    variables: Mapping[str, str],
    config: Mapping[str, str],
) -> list[str]:
    unparsable = unparsable_settings(variables, model)
    if unparsable:  # pydantic-settings raises on the first without naming it
        return [_not_json(".".join(path), variables[name], config) for path, name in unparsable]
    try:
        settings = settings_from_environment(model, variables)
    except ValidationError as exc:
        return [_describe(error, config) for error in exc.errors()]
    if isinstance(settings, BrokerSettings):
        refused = broker_combinations(settings).refused
    else:
        refused = proxy_combinations(settings).refused
    return [_in_spec_terms(line, config, variables) for line in refused]


def _describe(error: Any, config: Mapping[str, str]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"])
    if not key:  # a check across settings: its message names them
        return message
    if key in config:
        return f"{_config_key(key)}: {message} (given {config[key]!r})"
    return f"{key} (set by the operator): {message}"


def _not_json(key: str, value: str, config: Mapping[str, str]) -> str:
    where = _config_key(key) if key in config else f"{key} (set by the operator)"
    return f"{where}: {value!r} is not a JSON list"


def _in_spec_terms(line: str, config: Mapping[str, str], variables: Mapping[str, str]) -> str:
    """``KAFSCALE_ETCD__USERNAME (--etcd-username)`` → ``brokers.config['etcd.username']``,
    or ``etcd.username (set by the operator)`` for a variable the operator set itself."""

    def name_of(path: tuple[str, ...]) -> str:
        key = ".".join(path)
        if key not in config and env_name(path) in variables:
            return f"{key} (set by the operator)"
        return _config_key(key)

    return renamed(line, name_of)


def _config_key(key: str) -> str:
    return f"brokers.config[{key!r}]"


def _resolved(env: Iterable[dict[str, Any]]) -> dict[str, str]:
    """A container's ``env`` list as values: downward-API fields and Secrets as stand-ins."""
    values = {}
    for item in env:
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            values[item["name"]] = STAND_INS[source["fieldRef"]["fieldPath"]]
        elif source:
            values[item["name"]] = SECRET_STAND_IN
        else:
            values[item["name"]] = str(item.get("value", ""))
    return values
