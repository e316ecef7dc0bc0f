"""The brokers' objects: their Deployment, Service, PodDisruptionBudget and optional HPA.

The Deployment carries the probes on the admin port, the preStop drain (leases handed over
before the pod dies) and a grace period to match; ``replicas`` is left out when the cluster's
HPA owns it. Pure, like every builder.
"""

from __future__ import annotations

from typing import Any

from kafscale.operator import listeners, naming
from kafscale.operator.manifest_config import (
    broker_environment,
    config_hash,
    pod_env,
    tls_mounts,
    tls_volumes,
    token_env,
)
from kafscale.operator.manifest_pods import (
    Manifest,
    container_resources,
    container_security_context,
    pod_common,
    pod_disruption_budget,
    pod_spread,
)
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

DEFAULT_BROKER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}}

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
        "env": [*pod_env(spec), *token_env(ref, spec)],
        "resources": container_resources(brokers.resources, DEFAULT_BROKER_RESOURCES),
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
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *tls_mounts(spec)],
    }
    pod_spec: dict[str, Any] = {
        **pod_common(spec, brokers.service_account_name),
        "terminationGracePeriodSeconds": brokers.termination_grace_period_seconds,
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}, *tls_volumes(ref, spec)],
        **pod_spread(ref, naming.BROKER),
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
                "labels": naming.pod_labels(ref.name, naming.BROKER),
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
        "metadata": object_metadata(ref, name, naming.BROKER),
        "spec": deployment_spec,
    }


def build_broker_service(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(ref, naming.broker_service_name(ref.name), naming.BROKER),
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector_labels(ref.name, naming.BROKER),
            "ports": listeners.broker_service_ports(spec),
        },
    }


def build_broker_pdb(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    name = naming.broker_pdb_name(ref.name)
    return pod_disruption_budget(ref, name, naming.BROKER, {"maxUnavailable": 1})


def build_broker_hpa(ref: ClusterRef, spec: KafScaleClusterSpec) -> Manifest:
    auto = spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_metadata(ref, naming.broker_hpa_name(ref.name), naming.BROKER),
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
