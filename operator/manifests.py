"""Pure builders: a KafScaleCluster's spec → the Kubernetes objects it should have.

Nothing here does I/O. Every builder takes the resource's identity (:class:`ClusterRef`) and its
parsed spec and returns plain dicts ready for server-side apply: owner references, recommended
labels, PSA-"restricted" security contexts. ``replicas`` is left out of the broker Deployment
when the cluster's HPA owns it. Every object validates with ``kubernetes-validate --strict``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kafscale.operator import certificates, etcd_security, listeners, naming, proxy_listeners
from kafscale.operator.brokerconfig import InvalidBrokerConfig, broker_config_env
from kafscale.operator.model_base import ResourceRequirements
from kafscale.operator.model_stores import EtcdMode
from kafscale.operator.models import ClusterRef, DeletionPolicy, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

Manifest = dict[str, Any]

RUN_AS_USER = 10001
DEFAULT_BROKER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}}
DEFAULT_PROXY_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}}
DEFAULT_ETCD_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}}
DRAIN_SHUTDOWN_MARGIN_S = 5  # of the grace period, left for the broker's own shutdown


def drain_command(termination_grace_period_seconds: int) -> list[str]:
    """The preStop hook: the light drain module (not the ``kafscale`` command, which imports
    the whole broker), with a timeout that ends inside the pod's termination grace period."""
    timeout_s = max(1, termination_grace_period_seconds - DRAIN_SHUTDOWN_MARGIN_S)
    return [
        "python",
        "-m",
        "kafscale.broker.drain_hook",
        "--admin-url",
        f"http://127.0.0.1:{naming.ADMIN_PORT}",
        "--timeout-s",
        str(timeout_s),
    ]


def _metadata(ref: ClusterRef, name: str, component: str) -> dict[str, Any]:
    return object_metadata(ref, name, component)


def _resources(value: ResourceRequirements | None, default: dict[str, Any]) -> dict[str, Any]:
    return default if value is None else value.to_api()


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _spread(ref: ClusterRef, component: str) -> dict[str, Any]:
    """Anti-affinity over nodes and a soft spread over zones."""
    selector = {"matchLabels": naming.selector_labels(ref.name, component)}
    return {
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": selector,
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": selector,
            }
        ],
    }


# --- configuration --------------------------------------------------------------------------


def broker_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> dict[str, str]:
    """The non-secret KAFSCALE_* variables every broker (and proxy) pod gets."""
    storage = spec.storage
    env = {
        "KAFSCALE_CLUSTER": naming.kafscale_cluster_name(ref, spec),
        "KAFSCALE_ETCD__ENDPOINTS": json.dumps(naming.etcd_endpoints(ref, spec)),
        "KAFSCALE_ETCD__SESSION_TTL_S": str(spec.brokers.session_ttl_seconds),
        "KAFSCALE_STORAGE__KIND": "s3",
        "KAFSCALE_STORAGE__BUCKET": storage.bucket,
        "KAFSCALE_STORAGE__PREFIX": storage.prefix,
        "KAFSCALE_STORAGE__REGION": storage.region,
        "KAFSCALE_LISTENER__PORT": str(naming.KAFKA_PORT),
        "KAFSCALE_LISTENER__ADMIN_PORT": str(naming.ADMIN_PORT),
    }
    if storage.endpoint:
        env["KAFSCALE_STORAGE__ENDPOINT"] = storage.endpoint
    if spec.brokers.rack:
        env["KAFSCALE_LISTENER__RACK"] = spec.brokers.rack
    env.update(broker_config_env(spec.brokers.config))
    managed = listeners.managed_config_keys(spec) | etcd_security.managed_config_keys(spec)
    clash = sorted(set(spec.brokers.config) & managed)
    if clash:
        raise InvalidBrokerConfig(
            f"brokers.config[{clash[0]!r}] is set by the operator (spec.listeners, etcd.tls)"
        )
    if spec.proxy.enabled and spec.authorizer_enabled and not spec.listeners:
        raise InvalidBrokerConfig(
            "authorizer.enabled with the proxy needs spec.listeners: the proxy proves who it "
            "is on the brokers' internal listener, which only exists with listeners"
        )
    env.update(listeners.listener_environment(ref, spec))
    env.update(etcd_security.etcd_client_environment(spec))
    return dict(sorted(env.items()))


def config_hash(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def build_config_map(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(ref, naming.config_map_name(ref.name), naming.CONFIG),
        "data": broker_environment(ref, spec),
    }


def _pod_env(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "KAFSCALE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "KAFSCALE_LISTENER__ADVERTISED_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        },
    ]
    secret = spec.storage.credentials_secret
    if secret is not None:
        for var, key in (
            ("KAFSCALE_STORAGE__ACCESS_KEY_ID", secret.access_key_id_key),
            ("KAFSCALE_STORAGE__SECRET_ACCESS_KEY", secret.secret_access_key_key),
        ):
            env.append(
                {"name": var, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key}}}
            )
    return env


def _pod_common(spec: KafScaleClusterSpec) -> dict[str, Any]:
    common: dict[str, Any] = {
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if spec.image_pull_secrets:
        common["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    return common


def _tls_volumes(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    """Certificate Secrets of broker and proxy pods: the listeners' and etcd's client one."""
    volumes = [listeners.broker_tls_volume(ref)] if spec.needs_broker_certificate else []
    return volumes + etcd_security.etcd_client_volumes(ref, spec)


def _tls_mounts(spec: KafScaleClusterSpec) -> list[dict[str, Any]]:
    mounts = [listeners.broker_tls_mount()] if spec.needs_broker_certificate else []
    return mounts + etcd_security.etcd_client_mounts(spec)


# --- brokers --------------------------------------------------------------------------------


def build_broker_deployment(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    name = naming.broker_deployment_name(ref.name)
    selector = naming.selector_labels(ref.name, naming.BROKER)
    brokers = spec.brokers
    admin = naming.ADMIN_PORT
    start: dict[str, Any] = (
        {"command": listeners.advertise_command(ref, spec)}
        if spec.listeners
        else {"args": ["broker"]}
    )
    container = {
        "name": naming.BROKER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        **start,
        "ports": [
            *listeners.broker_container_ports(spec),
            {"name": "admin", "containerPort": admin, "protocol": "TCP"},
        ],
        "envFrom": [{"configMapRef": {"name": naming.config_map_name(ref.name)}}],
        "env": _pod_env(spec),
        "resources": _resources(brokers.resources, DEFAULT_BROKER_RESOURCES),
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "admin"},
            "periodSeconds": 2,
            "failureThreshold": 60,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "admin"},
            "periodSeconds": 10,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "admin"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "lifecycle": {
            "preStop": {
                "exec": {"command": drain_command(brokers.termination_grace_period_seconds)}
            }
        },
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *_tls_mounts(spec)],
    }
    pod_spec: dict[str, Any] = {
        **_pod_common(spec),
        "terminationGracePeriodSeconds": brokers.termination_grace_period_seconds,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *_tls_volumes(ref, spec)],
        **_spread(ref, naming.BROKER),
    }
    if brokers.node_selector:
        pod_spec["nodeSelector"] = dict(brokers.node_selector)
    if brokers.priority_class_name:
        pod_spec["priorityClassName"] = brokers.priority_class_name
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": selector},
        "revisionHistoryLimit": 5,
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "template": {
            "metadata": {
                "labels": naming.labels(ref.name, naming.BROKER),
                "annotations": {
                    naming.ANNOTATION_CONFIG_HASH: config_hash(broker_environment(ref, spec))
                },
            },
            "spec": pod_spec,
        },
    }
    if not spec.autoscaling.enabled:  # with an HPA, the HPA owns replicas
        deployment_spec = {"replicas": brokers.replicas, **deployment_spec}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ref, name, naming.BROKER),
        "spec": deployment_spec,
    }


def build_broker_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, naming.broker_service_name(ref.name), naming.BROKER),
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector_labels(ref.name, naming.BROKER),
            "ports": listeners.broker_service_ports(spec),
        },
    }


def build_broker_pdb(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ref, naming.broker_pdb_name(ref.name), naming.BROKER),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.BROKER)},
        },
    }


def build_broker_hpa(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    auto = spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(ref, naming.broker_hpa_name(ref.name), naming.BROKER),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": naming.broker_deployment_name(ref.name),
            },
            "minReplicas": auto.min_replicas,
            "maxReplicas": auto.max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {
                            "type": "Utilization",
                            "averageUtilization": auto.target_cpu_utilization_percentage,
                        },
                    },
                }
            ],
        },
    }


# --- proxy ----------------------------------------------------------------------------------


def build_proxy_deployment(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    name = naming.proxy_name(ref.name)
    container = {
        "name": naming.PROXY,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "args": ["proxy"],
        "ports": [
            *proxy_listeners.proxy_container_ports(spec),
            {"name": "admin", "containerPort": naming.ADMIN_PORT, "protocol": "TCP"},
        ],
        # The cluster and etcd variables the brokers get (the proxy ignores the rest).
        "envFrom": [{"configMapRef": {"name": naming.config_map_name(ref.name)}}],
        "env": [
            *_pod_env(spec)[:1],  # the pod name; the proxy needs no storage credentials
            *proxy_environment(ref, spec),
        ],
        "resources": _resources(spec.proxy.resources, DEFAULT_PROXY_RESOURCES),
        # Ready once its routing tables are loaded from etcd and some broker is registered.
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "admin"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "admin"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            *_tls_mounts(spec),
            *proxy_listeners.proxy_client_mounts(spec),
        ],
    }
    volumes = [
        {"name": "tmp", "emptyDir": {}},
        *_tls_volumes(ref, spec),
        *proxy_listeners.proxy_client_volumes(ref, spec),
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(ref, name, naming.PROXY),
        "spec": {
            **({} if spec.proxy.autoscaled else {"replicas": spec.proxy.replicas}),
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.PROXY)},
            "template": {
                "metadata": {
                    "labels": naming.labels(ref.name, naming.PROXY),
                    "annotations": {
                        naming.ANNOTATION_CONFIG_HASH: config_hash(broker_environment(ref, spec))
                    },
                },
                "spec": {
                    **_pod_common(spec),
                    "containers": [container],
                    "volumes": volumes,
                    **_spread(ref, naming.PROXY),
                },
            },
        },
    }


def proxy_environment(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[dict[str, str]]:
    """The proxy's own variables over the shared ConfigMap: see :mod:`proxy_listeners`."""
    values = proxy_listeners.proxy_environment_values(ref, spec)
    return [{"name": name, "value": value} for name, value in values.items()]


def build_proxy_pdb(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ref, naming.proxy_name(ref.name), naming.PROXY),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.PROXY)},
        },
    }


def build_proxy_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, naming.proxy_name(ref.name), naming.PROXY),
        "spec": {
            "type": spec.proxy.service_type,
            "selector": naming.selector_labels(ref.name, naming.PROXY),
            "ports": proxy_listeners.proxy_service_ports(spec),
        },
    }


# --- managed etcd ---------------------------------------------------------------------------


def _etcd_ports() -> list[dict[str, Any]]:
    return [
        {
            "name": "client",
            "port": naming.ETCD_CLIENT_PORT,
            "targetPort": "client",
            "protocol": "TCP",
        },
        {"name": "peer", "port": naming.ETCD_PEER_PORT, "targetPort": "peer", "protocol": "TCP"},
    ]


def build_etcd_headless_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, naming.etcd_name(ref.name), naming.ETCD),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # members must find each other before quorum
            "selector": naming.selector_labels(ref.name, naming.ETCD),
            "ports": _etcd_ports(),
        },
    }


def build_etcd_client_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(ref, naming.etcd_client_service_name(ref.name), naming.ETCD),
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector_labels(ref.name, naming.ETCD),
            "ports": _etcd_ports()[:1],
        },
    }


def _etcd_args(ref: ClusterRef, spec: KafScaleClusterSpec) -> list[str]:
    name, ns = naming.etcd_name(ref.name), ref.namespace
    own = f"$(POD_NAME).{name}.{ns}.svc"
    scheme = naming.etcd_scheme(spec)
    members = ",".join(
        f"{name}-{i}={naming.etcd_member_url(ref.name, ns, i, naming.ETCD_PEER_PORT, scheme)}"
        for i in range(spec.etcd.replicas)
    )
    tls = etcd_security.etcd_tls_args() if spec.etcd.tls else []
    return [
        "--name=$(POD_NAME)",
        "--data-dir=/var/lib/etcd/data",
        f"--listen-client-urls={scheme}://0.0.0.0:{naming.ETCD_CLIENT_PORT}",
        f"--advertise-client-urls={scheme}://{own}:{naming.ETCD_CLIENT_PORT}",
        f"--listen-peer-urls={scheme}://0.0.0.0:{naming.ETCD_PEER_PORT}",
        f"--initial-advertise-peer-urls={scheme}://{own}:{naming.ETCD_PEER_PORT}",
        *tls,
        f"--initial-cluster={members}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={ns}.{ref.name}",
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1h",
    ]


def build_etcd_statefulset(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    etcd = spec.etcd
    name = naming.etcd_name(ref.name)
    claim: dict[str, Any] = {
        "metadata": {"name": "data", "labels": naming.labels(ref.name, naming.ETCD)},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": etcd.storage_size}},
        },
    }
    if etcd.storage_class_name:
        claim["spec"]["storageClassName"] = etcd.storage_class_name
    keep = spec.deletion_policy == DeletionPolicy.RETAIN
    # With TLS the client port asks for a client certificate: probe the plain metrics port.
    probe_port = "metrics" if etcd.tls else "client"
    metrics_port = (
        [{"name": "metrics", "containerPort": naming.ETCD_METRICS_PORT, "protocol": "TCP"}]
        if etcd.tls
        else []
    )
    mounts = [{"name": "data", "mountPath": "/var/lib/etcd"}]
    volumes = []
    if etcd.tls:
        mounts.append(etcd_security.etcd_server_mount())
        volumes.append(etcd_security.etcd_server_volume(ref))
    container = {
        "name": naming.ETCD,
        "image": etcd.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/usr/local/bin/etcd"],
        "args": _etcd_args(ref, spec),
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [
            {"name": "client", "containerPort": naming.ETCD_CLIENT_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": naming.ETCD_PEER_PORT, "protocol": "TCP"},
            *metrics_port,
        ],
        "resources": _resources(etcd.resources, DEFAULT_ETCD_RESOURCES),
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": probe_port},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/livez", "port": probe_port},
            "initialDelaySeconds": 15,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(ref, name, naming.ETCD),
        "spec": {
            "serviceName": name,
            "replicas": etcd.replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.ETCD)},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain" if keep else "Delete",
                "whenScaled": "Retain",
            },
            "template": {
                "metadata": {"labels": naming.labels(ref.name, naming.ETCD)},
                "spec": {
                    **_pod_common(spec),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    **({"volumes": volumes} if volumes else {}),
                    **_spread(ref, naming.ETCD),
                },
            },
            "volumeClaimTemplates": [claim],
        },
    }


def build_etcd_pdb(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    replicas = spec.etcd.replicas
    budget: dict[str, Any] = (
        {"minAvailable": replicas // 2 + 1} if replicas > 1 else {"maxUnavailable": 1}
    )
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(ref, naming.etcd_name(ref.name), naming.ETCD),
        "spec": {
            **budget,
            "selector": {"matchLabels": naming.selector_labels(ref.name, naming.ETCD)},
        },
    }


# --- the whole set --------------------------------------------------------------------------


def build_cluster_objects(
    ref: ClusterRef, spec: KafScaleClusterSpec, *, cert_manager: bool = False
) -> list[Manifest]:
    """Every object the cluster should have, in apply order (certificates, etcd and config
    first). ``cert_manager``: the server serves cert-manager, which then makes the certificate
    Secrets (otherwise the operator writes them before applying these)."""
    objects: list[Manifest] = []
    if cert_manager:
        objects += certificates.build_cert_manager_objects(ref, spec)
    if spec.etcd.mode == EtcdMode.MANAGED:
        objects += [
            build_etcd_headless_service(ref, spec),
            build_etcd_client_service(ref, spec),
            build_etcd_statefulset(ref, spec),
            build_etcd_pdb(ref, spec),
        ]
        if spec.etcd.network_policy:
            objects.append(etcd_security.build_etcd_network_policy(ref, spec))
    objects += [
        build_config_map(ref, spec),
        build_broker_service(ref, spec),
        build_broker_deployment(ref, spec),
        build_broker_pdb(ref, spec),
    ]
    if spec.listeners:
        objects.append(etcd_security.build_broker_network_policy(ref, spec))
    if spec.autoscaling.enabled:
        objects.append(build_broker_hpa(ref, spec))
    if spec.proxy.enabled:
        objects += [
            build_proxy_deployment(ref, spec),
            build_proxy_service(ref, spec),
            build_proxy_pdb(ref, spec),
        ]
    return objects


ObjectId = tuple[str, str, str]  # (apiVersion, kind, name)


def all_object_ids(ref: ClusterRef) -> list[ObjectId]:
    """Every object any spec of this cluster can produce."""
    name = ref.name
    return [
        ("v1", "Service", naming.etcd_name(name)),
        ("v1", "Service", naming.etcd_client_service_name(name)),
        ("apps/v1", "StatefulSet", naming.etcd_name(name)),
        ("policy/v1", "PodDisruptionBudget", naming.etcd_name(name)),
        ("v1", "ConfigMap", naming.config_map_name(name)),
        ("v1", "Service", naming.broker_service_name(name)),
        ("apps/v1", "Deployment", naming.broker_deployment_name(name)),
        ("policy/v1", "PodDisruptionBudget", naming.broker_pdb_name(name)),
        ("autoscaling/v2", "HorizontalPodAutoscaler", naming.broker_hpa_name(name)),
        ("apps/v1", "Deployment", naming.proxy_name(name)),
        ("v1", "Service", naming.proxy_name(name)),
        ("policy/v1", "PodDisruptionBudget", naming.proxy_name(name)),
        (etcd_security.NETWORK_POLICY_API, "NetworkPolicy", naming.etcd_network_policy_name(name)),
        (
            etcd_security.NETWORK_POLICY_API,
            "NetworkPolicy",
            naming.broker_network_policy_name(name),
        ),
        *certificates.cert_manager_object_ids(ref),
    ]


def object_id(manifest: Manifest) -> ObjectId:
    return (manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"])


def obsolete_object_ids(
    ref: ClusterRef, spec: KafScaleClusterSpec, *, cert_manager: bool = False
) -> list[ObjectId]:
    """Objects a previous spec may have created that this spec no longer wants."""
    wanted = {object_id(m) for m in build_cluster_objects(ref, spec, cert_manager=cert_manager)}
    return [oid for oid in all_object_ids(ref) if oid not in wanted]
