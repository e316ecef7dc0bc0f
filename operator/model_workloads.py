"""``spec.brokers``, ``spec.proxy`` and ``spec.autoscaling`` of a KafScaleCluster.

The pods the operator runs for Kafka clients (broker and proxy Deployments), the image pull
policy they share, and the HPA that may own the broker replicas. A section of the cluster's
spec (:mod:`models` assembles it); the builders in ``manifest_brokers`` and ``manifest_proxy``
read it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from kafscale.operator.model_base import ApiModel, ResourceRequirements


def _service_account_field(pods: str) -> Any:
    """``serviceAccountName`` of the broker or proxy pods (the same rule and words for both)."""
    return Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=f"ServiceAccount the {pods} pods run as, e.g. one annotated for IRSA or "
        "workload identity so they reach S3 by the pod's identity. Unset: the namespace's "
        "default ServiceAccount with no API token mounted (the pods never call the Kubernetes "
        "API); set: that ServiceAccount's automountServiceAccountToken decides.",
    )


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class BrokerSpec(ApiModel):
    replicas: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="Number of broker pods (the scale subresource's spec path; an HPA may own it).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Broker container resources."
    )
    config: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Free-form broker settings as dotted paths into the broker configuration "
            '(e.g. `log.flush_interval_ms: "50"`), passed as KAFSCALE_* environment variables; '
            "the operator rejects unknown keys and keys it manages itself."
        ),
    )
    rack: str | None = Field(
        default=None, max_length=253, description="Rack id reported to clients."
    )
    session_ttl_seconds: int = Field(
        default=10, ge=2, le=300, description="TTL of each broker's etcd session lease."
    )
    termination_grace_period_seconds: int = Field(
        default=30,
        ge=5,
        le=3600,
        description="Time a broker pod gets to drain before it is killed.",
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels for broker pods."
    )
    priority_class_name: str | None = Field(
        default=None, description="PriorityClass of broker pods."
    )
    service_account_name: str | None = _service_account_field("broker")


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class ProxySpec(ApiModel):
    enabled: bool = Field(
        default=False, description="Run the lease-aware proxy as the bootstrap endpoint."
    )
    replicas: int = Field(default=2, ge=1, le=100, description="Number of proxy pods.")
    autoscaled: bool = Field(
        default=False,
        description="A HorizontalPodAutoscaler of yours owns the proxy Deployment's replicas "
        "(see deploy/proxy-hpa.yaml): the operator then never writes them.",
    )
    service_type: ServiceType = Field(
        default=ServiceType.CLUSTER_IP, description="Service type of the proxy's client endpoint."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="Proxy container resources."
    )
    service_account_name: str | None = _service_account_field("proxy")


class AutoscalingSpec(ApiModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "minReplicas must not exceed maxReplicas",
                }
            ]
        }
    )

    enabled: bool = Field(
        default=False,
        description="Create an HPA for the brokers; it then owns the broker replicas.",
    )
    min_replicas: int = Field(
        default=1, ge=1, le=1000, description="Lower bound of broker replicas."
    )
    max_replicas: int = Field(
        default=10, ge=1, le=1000, description="Upper bound of broker replicas."
    )
    target_cpu_utilization_percentage: int = Field(
        default=70, ge=1, le=100, description="Average CPU utilisation the HPA aims for."
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        return self
