"""Sections of a KafScaleCluster's status: its broker pods, lease distribution, listeners.

The operator writes them (``status`` computes them); ``status.brokers`` is also the scale
subresource's status path, which ``kubectl scale`` and an HPA read. :mod:`models` assembles
them into the status.
"""

from __future__ import annotations

from pydantic import Field

from kafscale.operator.model_base import ApiModel


class BrokerStatus(ApiModel):
    replicas: int = Field(default=0, description="Broker pods that exist (the scale status path).")
    ready_replicas: int = Field(default=0, description="Broker pods that are ready.")
    selector: str = Field(
        default="", description="Label selector of the broker pods (for HPA/scale)."
    )
    registered: int = Field(default=0, description="Brokers registered in etcd.")
    desired: int | None = Field(
        default=None,
        description="Broker pods wanted: spec.brokers.replicas, or the HPA's choice while "
        "spec.autoscaling.enabled (kubectl get's DESIRED column).",
    )


class LeaseStatus(ApiModel):
    partitions: int = Field(default=0, description="Partitions of all topics.")
    owned: int = Field(default=0, description="Partitions whose lease is held by a broker.")
    unowned: int = Field(default=0, description="Partitions without a lease holder.")
    per_broker: dict[str, int] = Field(
        default_factory=dict, description="Owned partitions per broker id."
    )
    assignment_generation: int | None = Field(
        default=None, description="Generation of the assignment."
    )
    draining: list[int] = Field(default_factory=list, description="Brokers marked draining.")


class ListenerStatus(ApiModel):
    name: str = Field(description="Listener name (spec.listeners[].name).")
    security_protocol: str = Field(description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    bootstrap_servers: str = Field(description="host:port of the brokers' Service port.")
    ca_secret: str | None = Field(
        default=None, description="Secret whose `ca.crt` clients trust (TLS listeners)."
    )
