"""The pure builders: every object valid (kubernetes-validate --strict), owned, labelled, safe."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from harness.cluster_specs import REF, THREE_LISTENERS, cluster_spec, external_etcd

from kafscale.operator import (
    immutable,
    manifest_brokers,
    manifest_config,
    manifest_etcd,
    manifests,
    naming,
)
from kafscale.operator.brokerconfig import InvalidBrokerConfig, broker_config_env
from kafscale.operator.models import KafScaleClusterSpec, parse_cluster_spec

pytestmark = pytest.mark.operator

K8S_VERSION = "1.32.0"
SPECS: dict[str, dict[str, Any]] = {
    "defaults": cluster_spec(),
    "external-etcd": external_etcd("http://etcd:2379"),
    "everything": {
        "image": "registry.example.com/kafscale:dev",
        "imagePullPolicy": "Always",
        "imagePullSecrets": ["regcred"],
        "clusterName": "prod-eu",
        "brokers": {
            "replicas": 5,
            "resources": {"requests": {"cpu": 1, "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
            "config": {"log.flush_interval_ms": "50", "limits.max_connections": "100"},
            "rack": "eu-west-1a",
            "sessionTtlSeconds": 6,
            "terminationGracePeriodSeconds": 45,
            "nodeSelector": {"kubernetes.io/arch": "amd64"},
            "priorityClassName": "high",
            "serviceAccountName": "kafscale-s3",
        },
        "proxy": {
            "enabled": True,
            "replicas": 3,
            "serviceType": "LoadBalancer",
            "serviceAccountName": "kafscale-proxy",
        },
        "etcd": {"replicas": 5, "storageSize": "10Gi", "storageClassName": "fast"},
        "storage": {
            "bucket": "bucket-1",
            "prefix": "p/q",
            "endpoint": "http://minio:9000",
            "region": "eu-west-1",
            "credentialsSecret": {"name": "s3", "accessKeyIdKey": "id", "secretAccessKeyKey": "k"},
        },
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 8},
        "deletionPolicy": "Delete",
    },
    "single-etcd": cluster_spec(etcd={"replicas": 1}),
    "secured": cluster_spec(proxy={"enabled": True}, etcd={"tls": True}, listeners=THREE_LISTENERS),
    "zero-brokers": cluster_spec(brokers={"replicas": 0}),
}


def spec_of(name: str) -> KafScaleClusterSpec:
    return parse_cluster_spec(SPECS[name])


def by_kind(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{kind} {name}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")
    ]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_validates_strictly(name: str) -> None:
    for obj in manifests.build_cluster_objects(REF, spec_of(name)):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_validation_is_strict() -> None:
    deployment = manifest_brokers.build_broker_deployment(REF, spec_of("defaults"))
    deployment["spec"]["replicaz"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_is_owned_and_labelled(name: str) -> None:
    for obj in manifests.build_cluster_objects(REF, spec_of(name)):
        meta = obj["metadata"]
        assert meta["namespace"] == "kafka"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "kafscale.io/v1alpha1",
                "kind": "KafScaleCluster",
                "name": "demo",
                "uid": REF.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        labels = meta["labels"]
        assert labels[naming.LABEL_NAME] == "kafscale"
        assert labels[naming.LABEL_INSTANCE] == "demo"
        assert labels[naming.LABEL_MANAGED_BY] == "kafscale-operator"
        assert labels[naming.LABEL_PART_OF] == "kafscale"
        selector = (obj.get("spec") or {}).get("selector")
        if isinstance(selector, dict) and "matchLabels" in selector:
            assert naming.LABEL_VERSION not in selector["matchLabels"]
            template = obj["spec"].get("template")
            if template:
                assert selector["matchLabels"].items() <= template["metadata"]["labels"].items()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_pods_meet_pod_security_restricted(name: str) -> None:
    for pod in pod_specs(manifests.build_cluster_objects(REF, spec_of(name))):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "hostNetwork" not in pod and "hostPID" not in pod
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"] == {"drop": ["ALL"]}
            assert ctx["runAsNonRoot"] is True
            assert ctx["readOnlyRootFilesystem"] is True
            assert "privileged" not in ctx
        for volume in pod.get("volumes", []):
            assert set(volume) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"}


def test_broker_deployment_probes_drain_and_grace() -> None:
    deployment = manifest_brokers.build_broker_deployment(REF, spec_of("defaults"))
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"] == ["broker"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "python",
        "-m",
        "kafscale.broker.drain_hook",
        "--admin-url",
        "http://127.0.0.1:8080",
        "--timeout-s",
        "25",
    ]
    assert pod["terminationGracePeriodSeconds"] == 30
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"kafka": 9092, "admin": 8080}
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"


def test_broker_environment() -> None:
    objects = manifests.build_cluster_objects(REF, spec_of("everything"))
    config = by_kind(objects, "ConfigMap")["data"]
    assert config["KAFSCALE_CLUSTER"] == "prod-eu"
    assert config["KAFSCALE_STORAGE__BUCKET"] == "bucket-1"
    assert config["KAFSCALE_STORAGE__PREFIX"] == "p/q"
    assert config["KAFSCALE_STORAGE__ENDPOINT"] == "http://minio:9000"
    assert config["KAFSCALE_STORAGE__REGION"] == "eu-west-1"
    assert config["KAFSCALE_STORAGE__KIND"] == "s3"
    assert config["KAFSCALE_ETCD__SESSION_TTL_S"] == "6"
    assert config["KAFSCALE_LISTENER__RACK"] == "eu-west-1a"
    assert config["KAFSCALE_LOG__FLUSH_INTERVAL_MS"] == "50"
    assert config["KAFSCALE_LIMITS__MAX_CONNECTIONS"] == "100"
    endpoints = json.loads(config["KAFSCALE_ETCD__ENDPOINTS"])
    assert endpoints == ["http://demo-etcd-client.kafka.svc:2379"]
    assert all(isinstance(v, str) for v in config.values())

    container = by_kind(objects, "Deployment", "demo-broker")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["envFrom"] == [{"configMapRef": {"name": "demo-config"}}]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["KAFSCALE_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["KAFSCALE_LISTENER__ADVERTISED_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KAFSCALE_STORAGE__ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "s3", "key": "id"}}
    assert env["KAFSCALE_STORAGE__SECRET_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "s3", "key": "k"}
    }
    assert not any("SECRET" in key for key in config)


def test_default_cluster_name_and_external_endpoints() -> None:
    config = manifest_config.build_config_map(REF, spec_of("external-etcd"))["data"]
    assert config["KAFSCALE_CLUSTER"] == "kafka.demo"
    assert json.loads(config["KAFSCALE_ETCD__ENDPOINTS"]) == ["http://etcd:2379"]
    objects = manifests.build_cluster_objects(REF, spec_of("external-etcd"))
    assert not [o for o in objects if o["kind"] == "StatefulSet"]


def test_config_changes_roll_the_pods() -> None:
    def template_hash(config: dict[str, str]) -> str:
        spec = parse_cluster_spec(cluster_spec(brokers={"config": config}))
        deployment = manifest_brokers.build_broker_deployment(REF, spec)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        return str(annotations[naming.ANNOTATION_CONFIG_HASH])

    assert template_hash({}) == template_hash({})
    assert template_hash({}) != template_hash({"log.flush_interval_ms": "10"})


def test_hpa_owns_replicas() -> None:
    objects = manifests.build_cluster_objects(REF, spec_of("everything"))
    deployment = by_kind(objects, "Deployment", "demo-broker")
    assert "replicas" not in deployment["spec"]
    hpa = by_kind(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "demo-broker",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    defaults = manifests.build_cluster_objects(REF, spec_of("defaults"))
    assert not [o for o in defaults if o["kind"] == "HorizontalPodAutoscaler"]


def test_proxy_objects() -> None:
    objects = manifests.build_cluster_objects(REF, spec_of("everything"))
    proxy = by_kind(objects, "Deployment", "demo-proxy")
    assert proxy["spec"]["replicas"] == 3
    assert proxy["spec"]["template"]["spec"]["containers"][0]["args"] == ["proxy"]
    assert by_kind(objects, "Service", "demo-proxy")["spec"]["type"] == "LoadBalancer"
    assert naming.bootstrap_address(REF, spec_of("everything")) == "demo-proxy.kafka.svc:9092"
    assert naming.bootstrap_address(REF, spec_of("defaults")) == "demo-brokers.kafka.svc:9092"
    defaults = manifests.build_cluster_objects(REF, spec_of("defaults"))
    assert not [o for o in defaults if o["metadata"]["name"] == "demo-proxy"]


def test_managed_etcd() -> None:
    objects = manifests.build_cluster_objects(REF, spec_of("defaults"))
    statefulset = by_kind(objects, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    assert statefulset["spec"]["serviceName"] == "demo-etcd"
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    args = statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
    initial = next(a for a in args if a.startswith("--initial-cluster="))
    assert initial == (
        "--initial-cluster="
        "demo-etcd-0=http://demo-etcd-0.demo-etcd.kafka.svc:2380,"
        "demo-etcd-1=http://demo-etcd-1.demo-etcd.kafka.svc:2380,"
        "demo-etcd-2=http://demo-etcd-2.demo-etcd.kafka.svc:2380"
    )
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"
    headless = by_kind(objects, "Service", "demo-etcd")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert by_kind(objects, "PodDisruptionBudget", "demo-etcd")["spec"]["minAvailable"] == 2
    assert by_kind(objects, "PodDisruptionBudget", "demo-broker")["spec"]["maxUnavailable"] == 1
    single = manifest_etcd.build_etcd_pdb(REF, spec_of("single-etcd"))
    assert single["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": naming.selector_labels("demo", naming.ETCD)},
    }
    delete = manifest_etcd.build_etcd_statefulset(REF, spec_of("everything"))
    assert delete["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert delete["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"


def test_obsolete_objects_follow_the_spec() -> None:
    obsolete = manifests.obsolete_object_ids(REF, spec_of("defaults"))
    assert ("apps/v1", "Deployment", "demo-proxy") in obsolete
    assert ("autoscaling/v2", "HorizontalPodAutoscaler", "demo-broker") in obsolete
    assert ("apps/v1", "StatefulSet", "demo-etcd") not in obsolete
    external = manifests.obsolete_object_ids(REF, spec_of("external-etcd"))
    assert ("apps/v1", "StatefulSet", "demo-etcd") in external
    everything = manifests.obsolete_object_ids(REF, spec_of("everything"))
    # No listeners, no TLS: only the broker NetworkPolicy and cert-manager objects are unwanted.
    assert {kind for _, kind, _ in everything} == {"NetworkPolicy", "Certificate", "Issuer"}
    assert ("networking.k8s.io/v1", "NetworkPolicy", "demo-etcd") not in everything
    secured = manifests.obsolete_object_ids(REF, spec_of("secured"), cert_manager=True)
    assert ("cert-manager.io/v1", "Certificate", "demo-broker-tls") not in secured
    assert ("networking.k8s.io/v1", "NetworkPolicy", "demo-broker") not in secured


@pytest.mark.parametrize(
    "key",
    ["cluster", "etcd.endpoints", "storage.bucket", "listener.port", "storage.secret_access_key"],
)
def test_managed_config_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidBrokerConfig, match="set by the operator"):
        broker_config_env({key: "x"})


@pytest.mark.parametrize("key", ["log.nope", "nope", "log", "log.flush_interval_ms.x"])
def test_unknown_config_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidBrokerConfig):
        broker_config_env({key: "1"})


def test_unknown_config_key_fails_the_build() -> None:
    spec = parse_cluster_spec(cluster_spec(brokers={"config": {"log.typo": "1"}}))
    with pytest.raises(InvalidBrokerConfig):
        manifests.build_cluster_objects(REF, spec)


def test_proxy_pods_probe_readiness_and_advertise_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The proxy Deployment is ready only when ``/readyz`` says so (routes loaded), has a PDB,
    and its pods' configuration (the brokers' ConfigMap plus their own variables) is one the
    proxy accepts, advertising the proxy's Service."""
    from kafscale.broker.proxy.config import ProxySettings

    spec = spec_of("everything")
    objects = manifests.build_cluster_objects(REF, spec)
    container = by_kind(objects, "Deployment", "demo-proxy")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert {"name": "admin", "containerPort": naming.ADMIN_PORT, "protocol": "TCP"} in container[
        "ports"
    ]
    pdb = by_kind(objects, "PodDisruptionBudget", "demo-proxy")
    assert pdb["spec"]["selector"]["matchLabels"] == naming.selector_labels("demo", naming.PROXY)
    env = {**manifest_config.broker_environment(REF, spec)}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = ProxySettings()
    assert settings.listener.advertised() == "demo-proxy.kafka.svc"
    assert settings.listener.advertised_port == naming.KAFKA_PORT
    assert settings.listener.admin_port == naming.ADMIN_PORT
    assert list(settings.etcd.endpoints) == naming.etcd_endpoints(REF, spec)
    assert settings.cluster == naming.kafscale_cluster_name(REF, spec)


def test_autoscaled_proxy_leaves_replicas_to_the_hpa() -> None:
    raw = {
        "storage": {"bucket": "bucket-1"},
        "proxy": {"enabled": True, "replicas": 3, "autoscaled": True},
    }
    objects = manifests.build_cluster_objects(REF, parse_cluster_spec(raw))
    assert "replicas" not in by_kind(objects, "Deployment", "demo-proxy")["spec"]


@pytest.mark.parametrize("grace_s", [5, 30, 600])
def test_the_drain_hook_ends_inside_the_grace_period(grace_s: int) -> None:
    spec = parse_cluster_spec(
        {"storage": {"bucket": "bucket-1"}, "brokers": {"terminationGracePeriodSeconds": grace_s}}
    )
    pod = manifest_brokers.build_broker_deployment(REF, spec)["spec"]["template"]["spec"]
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    timeout_s = float(command[command.index("--timeout-s") + 1])
    assert 0 < timeout_s < pod["terminationGracePeriodSeconds"] == grace_s


def _templates(objects: list[dict[str, Any]]) -> list[Any]:
    """Every pod template and claim template of a cluster's objects."""
    found: list[Any] = []
    for obj in objects:
        spec = obj.get("spec") or {}
        if "template" in spec:
            found.append(spec["template"])
        found.extend(spec.get("volumeClaimTemplates") or [])
    return found


def test_an_operator_upgrade_changes_no_pod_or_claim_template(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's version was a label of every pod template (an operator upgrade rolled
    every broker, proxy and etcd pod of every cluster) and of the etcd claim template (which
    cannot change: the real API server refused the StatefulSet, 422, and the reconcile
    stopped). Objects' own labels still name the version."""
    spec = spec_of("secured")
    monkeypatch.setattr(naming, "__version__", "0.0.9")
    old = manifests.build_cluster_objects(REF, spec)
    monkeypatch.setattr(naming, "__version__", "9.9.9")
    new = manifests.build_cluster_objects(REF, spec)
    assert len(_templates(new)) >= 4  # brokers, proxy, etcd pods; etcd claims
    assert _templates(old) == _templates(new)
    assert (
        by_kind(new, "Deployment", "demo-broker")["metadata"]["labels"][naming.LABEL_VERSION]
        == "9.9.9"
    )


def test_the_etcd_claim_template_keeps_the_labels_it_was_made_with() -> None:
    built = by_kind(manifests.build_cluster_objects(REF, spec_of("defaults")), "StatefulSet")
    assert immutable.keep_live_claims(built, None) == built
    live = json.loads(json.dumps(built))
    old_labels = {**live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]}
    old_labels[naming.LABEL_VERSION] = "0.1.0"  # what an operator before this fix wrote
    live["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"] = old_labels
    live["spec"]["volumeClaimTemplates"][0]["status"] = {"phase": "Pending"}
    kept = immutable.keep_live_claims(built, live)
    (claim,) = kept["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["labels"] == old_labels
    assert claim["spec"] == built["spec"]["volumeClaimTemplates"][0]["spec"]  # still ours
    assert "status" not in claim
    assert kept["spec"]["template"] == built["spec"]["template"]


def _pod_spec(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = by_kind(objects, kind, name)["spec"]["template"]["spec"]
    return pod


def test_broker_and_proxy_pods_run_as_the_service_account_the_spec_names() -> None:
    """IRSA / workload identity: S3 access by the pod's ServiceAccount. Unset, every pod runs
    as the namespace's default ServiceAccount with no API token (no pod calls the API)."""
    named = manifests.build_cluster_objects(REF, spec_of("everything"))
    broker = _pod_spec(named, "Deployment", "demo-broker")
    proxy = _pod_spec(named, "Deployment", "demo-proxy")
    assert broker["serviceAccountName"] == "kafscale-s3"
    assert proxy["serviceAccountName"] == "kafscale-proxy"
    # The named ServiceAccount's own automountServiceAccountToken decides.
    assert "automountServiceAccountToken" not in broker
    assert "automountServiceAccountToken" not in proxy
    etcd = _pod_spec(named, "StatefulSet", "demo-etcd")
    assert "serviceAccountName" not in etcd and etcd["automountServiceAccountToken"] is False
    plain = manifests.build_cluster_objects(REF, spec_of("secured"))
    for kind, name in (("Deployment", "demo-broker"), ("Deployment", "demo-proxy")):
        pod = _pod_spec(plain, kind, name)
        assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize("bad", ["", "Upper", "-dash", "a" * 254])
def test_a_service_account_name_that_kubernetes_refuses_is_refused_here(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cluster_spec(cluster_spec(brokers={"serviceAccountName": bad}))
