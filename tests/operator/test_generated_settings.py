"""What the operator and the Helm chart tell brokers and proxies passes the start-up checks:
no misspelt variable, no refused combination of settings, and no warning either (a warning on
every pod of every cluster would teach users to ignore warnings)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.cluster_specs import (
    AUTHORIZER_CONFIG,
    THREE_LISTENERS,
    cluster_spec,
    container_of,
    objects_of,
)
from harness.k8s_tools import run_helm

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.settings_check import misspelt_variables
from kafscale.broker.settings_combinations import (
    Combinations,
    broker_combinations,
    proxy_combinations,
)

pytestmark = pytest.mark.operator

CHART = Path(__file__).resolve().parents[2] / "charts" / "kafscale"

S3 = {
    "bucket": "bucket-1",
    "endpoint": "http://s3.example:9000",
    "region": "eu-west-1",
    "prefix": "p/q",
    "credentialsSecret": {"name": "s3", "accessKeyIdKey": "id", "secretAccessKeyKey": "k"},
}

SPECS: dict[str, dict[str, Any]] = {
    "defaults": cluster_spec(),
    "proxy": cluster_spec(proxy={"enabled": True}),
    "listeners and proxy, no authorizer": cluster_spec(
        listeners=THREE_LISTENERS, proxy={"enabled": True}
    ),
    "s3 with endpoint and credentials": {**cluster_spec(), "storage": S3},
    "secured, proxy, etcd tls": cluster_spec(
        listeners=THREE_LISTENERS, proxy={"enabled": True}, etcd={"tls": True}, authorizer=True
    ),
    "external etcd, rack, tokens": {
        **cluster_spec(
            etcd={"mode": "External", "endpoints": ["https://etcd.example:2379"]},
            brokers={"rack": "zone-a", "config": {**AUTHORIZER_CONFIG, "etcd.ca_file": "/ca"}},
        ),
        "delegationTokens": {"enabled": True},
    },
}

PLACEHOLDERS = {"metadata.name": "demo-broker-0", "status.podIP": "10.0.0.7"}


def pod_variables(objects: list[dict[str, Any]], workload: dict[str, Any]) -> dict[str, str]:
    """The KAFSCALE_* variables a pod of ``workload`` starts with: its ConfigMaps' data, then
    its own ``env`` (which wins), Secrets and the downward API given stand-in values."""
    container = container_of(workload)
    maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        field_ref = item.get("valueFrom", {}).get("fieldRef")
        value = PLACEHOLDERS[field_ref["fieldPath"]] if field_ref else item.get("value", "secret")
        env[item["name"]] = value
    return {k: v for k, v in env.items() if k.startswith("KAFSCALE_")}


def workloads(objects: list[dict[str, Any]], command: str) -> list[dict[str, Any]]:
    """The Deployments and StatefulSets whose container runs ``kafscale COMMAND``."""
    found = []
    for item in objects:
        if item["kind"] not in ("Deployment", "StatefulSet"):
            continue
        container = container_of(item)
        words = [*container.get("command", []), *container.get("args", [])]
        if command in words or any(f"kafscale {command}" in word for word in words):
            found.append(item)
    return found


def checked(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], command: str) -> Combinations:
    """The settings a process of ``command`` parses from ``env``, through the same checks as
    ``kafscale broker`` / ``proxy`` (a misspelling fails here too)."""
    for key in list(os.environ):
        if key.upper().startswith("KAFSCALE_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert misspelt_variables(os.environ, [BrokerSettings, ProxySettings]) == []
    if command == "broker":
        return broker_combinations(BrokerSettings())
    return proxy_combinations(ProxySettings())


@pytest.mark.parametrize("name", SPECS)
def test_the_operators_broker_and_proxy_variables_pass_the_checks(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = objects_of(SPECS[name])
    brokers = workloads(objects, "broker")
    proxies = workloads(objects, "proxy")
    assert brokers, "no broker workload found"
    if SPECS[name].get("proxy", {}).get("enabled"):
        assert proxies, "no proxy workload found"
    for workload, command in [(w, "broker") for w in brokers] + [(w, "proxy") for w in proxies]:
        env = pod_variables(objects, workload)
        assert env["KAFSCALE_STORAGE__KIND"] == "s3"
        assert checked(monkeypatch, env, command) == Combinations(), (name, command)


def test_the_charts_variables_pass_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart runs the operator only: its KAFSCALE_OPERATOR_* variables are not broker or
    proxy settings, so a broker or proxy started with them (one shared shell, or an image
    started by hand with the operator's environment) neither refuses nor warns."""
    result = run_helm("template", "kafscale", str(CHART), "--namespace", "kafscale-system")
    assert result.returncode == 0, result.stderr
    env: dict[str, str] = {}
    for doc in yaml.safe_load_all(result.stdout):
        if doc and doc.get("kind") == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for item in container.get("env", []):
                    env[item["name"]] = str(item.get("value", "x"))
    assert any(name.startswith("KAFSCALE_OPERATOR_") for name in env), env
    for command in ("broker", "proxy"):
        assert checked(monkeypatch, env, command) == Combinations()
