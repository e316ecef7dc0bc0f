"""spec.delegationTokens: the key Secret the operator makes once, and the pods that read it."""

from __future__ import annotations

import asyncio
import base64
import os
from typing import Any

import pytest
from harness.cluster_specs import REF, cluster_spec, container_of, find, objects_of
from harness.k8s_real import CLUSTERS, DEPLOYMENTS, SECRETS, cluster_manifest, settle
from harness.kube_apiserver import KubeCluster

from kafscale.broker.config import BrokerSettings
from kafscale.operator import manifest_config
from kafscale.operator.brokerconfig import InvalidBrokerConfig
from kafscale.operator.models import parse_cluster_spec
from kafscale.operator.token_secret import build_token_secret, ensure_token_secret

pytestmark = pytest.mark.operator

KEY_VAR = "KAFSCALE_DELEGATION_TOKEN__SECRET_KEY"
FROM_SECRET = {"secretKeyRef": {"name": "demo-delegation-token", "key": "secret-key"}}


def _token_vars(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in container["env"] if e["name"] == KEY_VAR]


def test_brokers_and_proxies_read_the_key_from_its_secret_when_tokens_are_on() -> None:
    raw = cluster_spec(proxy={"enabled": True})
    raw["delegationTokens"] = {"enabled": True}
    objects = objects_of(raw)
    for name in ("demo-broker", "demo-proxy"):
        (var,) = _token_vars(container_of(find(objects, "Deployment", name)))
        assert var["valueFrom"] == FROM_SECRET, name
    config = find(objects, "ConfigMap", "demo-config")["data"]
    assert not any("DELEGATION_TOKEN" in key for key in config)  # a secret: not in a ConfigMap
    off = objects_of(cluster_spec(proxy={"enabled": True}))
    for name in ("demo-broker", "demo-proxy"):
        assert not _token_vars(container_of(find(off, "Deployment", name)))


def test_the_key_cannot_be_put_in_brokers_config() -> None:
    spec = parse_cluster_spec(
        cluster_spec(brokers={"config": {"delegation_token.secret_key": "in-plain-sight"}})
    )
    with pytest.raises(InvalidBrokerConfig, match="set by the operator"):
        manifest_config.broker_environment(REF, spec)
    lifetimes = cluster_spec(brokers={"config": {"delegation_token.max_lifetime_ms": "3600000"}})
    env = manifest_config.broker_environment(REF, parse_cluster_spec(lifetimes))
    assert env["KAFSCALE_DELEGATION_TOKEN__MAX_LIFETIME_MS"] == "3600000"


class FakeKube:
    """The two calls ``ensure_token_secret`` makes (get, create), on a dict of Secrets."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}

    async def get(self, _v: str, _k: str, _ns: str, name: str) -> dict[str, Any] | None:
        return self.secrets.get(name)

    async def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self.secrets[manifest["metadata"]["name"]] = manifest
        return manifest


def test_the_key_is_made_once_and_never_replaced() -> None:
    kube = FakeKube()
    on = parse_cluster_spec({**cluster_spec(), "delegationTokens": {"enabled": True}})
    off = parse_cluster_spec(cluster_spec())
    assert not asyncio.run(ensure_token_secret(kube, REF, off)).written  # type: ignore[arg-type]
    assert kube.secrets == {}
    assert asyncio.run(ensure_token_secret(kube, REF, on)).written  # type: ignore[arg-type]
    made = kube.secrets["demo-delegation-token"]
    key = base64.b64decode(made["data"]["secret-key"])
    assert len(key) >= 48 and made["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert not asyncio.run(ensure_token_secret(kube, REF, on)).written  # type: ignore[arg-type]
    assert kube.secrets["demo-delegation-token"] is made
    # and the brokers take it as their key
    settings = BrokerSettings(delegation_token={"secret_key": key.decode()})  # type: ignore[arg-type]
    assert settings.delegation_token.policy().enabled


def test_the_secret_is_valid_kubernetes() -> None:
    import kubernetes_validate

    kubernetes_validate.validate(build_token_secret(REF, "k"), "1.30", strict=True)


@pytest.mark.kubeapi
async def test_on_a_real_api_server_the_key_secret_is_made_once_and_mounted(
    kube_cluster: KubeCluster, real_operator: Any, kube_namespace: str
) -> None:
    ns, kube = kube_namespace, kube_cluster
    spec = cluster_spec(brokers={"replicas": 1}, proxy={"enabled": True})
    spec["delegationTokens"] = {"enabled": True}
    created = kube.create(CLUSTERS.format(ns=ns), cluster_manifest("demo", ns, spec))
    secret = await settle(
        lambda: kube.get(f"{SECRETS.format(ns=ns)}/demo-delegation-token"),
        what="the delegation-token Secret",
    )
    assert secret["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    key = secret["data"]["secret-key"]
    for name in ("demo-broker", "demo-proxy"):
        deployment = await settle(
            lambda name=name: kube.get(f"{DEPLOYMENTS.format(ns=ns)}/{name}"), what=name
        )
        (var,) = _token_vars(container_of(deployment))
        assert var["valueFrom"] == FROM_SECRET
    kube.merge_patch(f"{CLUSTERS.format(ns=ns)}/demo", {"spec": {"brokers": {"replicas": 2}}})
    await settle(
        lambda: (
            (kube.get(f"{CLUSTERS.format(ns=ns)}/demo").get("status") or {}).get(
                "observedGeneration"
            )
            == 2
        ),
        what="generation 2 reconciled",
    )
    again = kube.get(f"{SECRETS.format(ns=ns)}/demo-delegation-token")
    assert again["data"]["secret-key"] == key  # never rotated by a reconcile
    assert os.environ.get(KEY_VAR) is None  # the test process never saw it either
