"""The managed etcd's objects: a StatefulSet, its headless and client Services and a PDB.

Built only for ``etcd.mode: Managed``. Members find each other through the headless Service
before there is a quorum, start from a fixed initial member list (so the member count cannot
change later), serve TLS when ``etcd.tls`` is set (``etcd_security``) and keep their volumes
after the cluster is deleted unless its deletion policy is Delete. Pure, like every builder.
"""

from __future__ import annotations

from typing import Any

from kafscale.operator import etcd_security, naming
from kafscale.operator.manifest_pods import (
    Manifest,
    container_resources,
    container_security_context,
    pod_common,
    pod_disruption_budget,
    pod_spread,
)
from kafscale.operator.models import ClusterRef, DeletionPolicy, KafScaleClusterSpec
from kafscale.operator.ownership import object_metadata

DEFAULT_ETCD_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}}


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
        "metadata": object_metadata(ref, naming.etcd_name(ref.name), naming.ETCD),
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
        "metadata": object_metadata(ref, naming.etcd_client_service_name(ref.name), naming.ETCD),
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
        "metadata": {"name": "data", "labels": naming.pod_labels(ref.name, naming.ETCD)},
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
        "resources": container_resources(etcd.resources, DEFAULT_ETCD_RESOURCES),
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
        "metadata": object_metadata(ref, name, naming.ETCD),
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
                "metadata": {"labels": naming.pod_labels(ref.name, naming.ETCD)},
                "spec": {
                    **pod_common(spec),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    **({"volumes": volumes} if volumes else {}),
                    **pod_spread(ref, naming.ETCD),
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
    return pod_disruption_budget(ref, naming.etcd_name(ref.name), naming.ETCD, budget)
