"""Pure builders: a KafScaleCluster's spec → the Kubernetes objects it should have.

Nothing here does I/O. Every builder takes the resource's identity (:class:`ClusterRef`) and its
parsed spec and returns plain dicts ready for server-side apply: owner references, recommended
labels, PSA-"restricted" security contexts. ``replicas`` is left out of the broker Deployment
when the cluster's HPA owns it. Every object validates with ``kubernetes-validate --strict``.

This module assembles the whole set and knows every object a cluster can have (to delete what
a spec no longer wants); one module per component builds the objects: ``manifest_etcd``,
``manifest_config`` (the ConfigMap, pod variables, certificate mounts), ``manifest_brokers``,
``manifest_proxy``, on the pod basics of ``manifest_pods``.
"""

from __future__ import annotations

from kafscale.operator import certificates, etcd_security, naming
from kafscale.operator.manifest_brokers import (
    build_broker_deployment,
    build_broker_hpa,
    build_broker_pdb,
    build_broker_service,
)
from kafscale.operator.manifest_config import build_config_map
from kafscale.operator.manifest_etcd import (
    build_etcd_client_service,
    build_etcd_headless_service,
    build_etcd_pdb,
    build_etcd_statefulset,
)
from kafscale.operator.manifest_pods import Manifest
from kafscale.operator.manifest_proxy import (
    build_proxy_deployment,
    build_proxy_pdb,
    build_proxy_service,
)
from kafscale.operator.model_stores import EtcdMode
from kafscale.operator.models import ClusterRef, KafScaleClusterSpec
from kafscale.operator.pod_settings import check_pod_settings


def build_cluster_objects(
    ref: ClusterRef, spec: KafScaleClusterSpec, *, cert_manager: bool = False
) -> list[Manifest]:
    """Every object the cluster should have, in apply order (certificates, etcd and config
    first). ``cert_manager``: the server serves cert-manager, which then makes the certificate
    Secrets (otherwise the operator writes them before applying these). Raises
    ``InvalidBrokerConfig`` when the pods would refuse the settings they are given."""
    check_pod_settings(ref, spec)
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
