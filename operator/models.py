"""Pydantic models of the custom resources: the single source of the CRDs.

``KafScaleCluster``, ``KafScaleTopic`` and ``KafScaleUser`` (group ``kafscale.io``, version
``v1alpha1``). Field names are camelCase on the wire (Kubernetes convention) and snake_case in
Python. The CRD schemas in ``crds/`` and ``charts/kafscale/crds/`` are generated from these
classes by ``python -m kafscale.operator.crd_gen``; a test fails when they drift.

Validation lives here (ranges, enums, patterns, required fields) so that the API server rejects
a bad resource at ``kubectl apply`` time and the handlers can parse specs without surprises.

This module holds each resource's root (API identity, spec and status as the CRDs see them,
parsing); their sections live beside it, one concern each: ``model_base`` (the base model,
quantities, conditions), ``model_workloads`` (brokers, proxy, autoscaling), ``model_stores``
(etcd, object storage), ``model_listeners``, ``model_cluster_status`` and
``model_user_access`` (a user's credential and ACLs).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from kafscale.operator.model_base import ApiModel, Condition
from kafscale.operator.model_cluster_status import BrokerStatus, LeaseStatus, ListenerStatus
from kafscale.operator.model_listeners import ListenerSpec
from kafscale.operator.model_stores import EtcdMode, EtcdSpec, StorageSpec
from kafscale.operator.model_user_access import UserAuthentication, UserAuthorization
from kafscale.operator.model_workloads import AutoscalingSpec, BrokerSpec, ProxySpec, PullPolicy

GROUP = "kafscale.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CLUSTER_KIND = "KafScaleCluster"
CLUSTER_PLURAL = "kafscaleclusters"
TOPIC_KIND = "KafScaleTopic"
TOPIC_PLURAL = "kafscaletopics"
USER_KIND = "KafScaleUser"
USER_PLURAL = "kafscaleusers"

DEFAULT_IMAGE = "ghcr.io/kafscale/kafscale:0.1.0"

# Kafka topic names: ASCII letters, digits, '.', '_', '-', at most 249 characters.
TOPIC_NAME_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
# Cluster names become etcd key and object-key prefixes: keep them DNS-like.
CLUSTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
# Free-form broker configuration keys are dotted paths into the broker's settings model.
CONFIG_KEY_PATTERN = r"^[a-z][a-z0-9_]*([.][a-z][a-z0-9_]*)*$"

# Spellings of true pydantic accepts for a boolean setting (brokers.config values are strings).
TRUE_WORDS = frozenset({"true", "1", "yes", "on", "t", "y"})


class DeletionPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


class DelegationTokenSpec(ApiModel):
    """Kafka delegation tokens (KIP-48) for the cluster's users."""

    enabled: bool = Field(
        default=False,
        description="Turn delegation tokens on: the operator makes the Secret "
        "`<name>-delegation-token` (key `secret-key`, random, made once and never rotated by "
        "the operator; a Secret of that name not owned by the cluster is used as it is) and "
        "gives it to every broker and proxy as `delegation_token.secret_key`.",
    )


class KafScaleClusterSpec(ApiModel):
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="The KafScale image.")
    image_pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT, description="Pull policy."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Names of Secrets used to pull the image."
    )
    cluster_name: str | None = Field(
        default=None,
        pattern=CLUSTER_NAME_PATTERN,
        description=(
            "Name of the cluster in etcd and object storage; defaults to `<namespace>.<name>`. "
            "Must be unique per etcd and bucket."
        ),
    )
    brokers: BrokerSpec = Field(default_factory=BrokerSpec, description="Broker pods.")
    listeners: list[ListenerSpec] = Field(
        default_factory=list,
        max_length=8,
        description="Kafka listeners of every broker. Empty: one PLAINTEXT listener on 9092 "
        "(as before). Set: these, plus an internal listener on 9091 that only this cluster's "
        "pods and the operator may reach (the proxy's way in; mTLS with the proxy's "
        "certificate when the proxy and the authorizer are on). With the proxy enabled, the "
        "proxy's Service serves these listeners too, and status names it.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    proxy: ProxySpec = Field(default_factory=ProxySpec, description="Lease-aware proxy.")
    etcd: EtcdSpec = Field(default_factory=EtcdSpec, description="Metadata store.")
    storage: StorageSpec = Field(description="Object storage for record batches.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Horizontal autoscaling of the brokers."
    )
    delegation_tokens: DelegationTokenSpec = Field(
        default_factory=DelegationTokenSpec, description="Delegation tokens (KIP-48)."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        description="On delete, Retain keeps etcd data and objects; Delete removes both.",
    )

    @model_validator(mode="after")
    def _check_listeners(self) -> KafScaleClusterSpec:
        names = [listener.name for listener in self.listeners]
        ports = [listener.port for listener in self.listeners]
        if len(set(names)) != len(names):
            raise ValueError("listener names must be unique")
        if len(set(ports)) != len(ports):
            raise ValueError("listener ports must be unique")
        if self.etcd.tls and self.etcd.mode == EtcdMode.EXTERNAL:
            raise ValueError("etcd.tls is for the managed etcd (External: https:// endpoints)")
        return self

    @property
    def tls_listeners(self) -> bool:
        """Whether any listener serves TLS."""
        return any(listener.tls for listener in self.listeners)

    @property
    def authorizer_enabled(self) -> bool:
        """Whether ``spec.brokers.config`` turns the brokers' ACL authorizer on."""
        value = self.brokers.config.get("authorizer.enabled", "")
        return value.strip().lower() in TRUE_WORDS

    @property
    def proxy_internal_tls(self) -> bool:
        """Whether the proxy reaches the brokers' internal listener over mTLS: with listeners,
        the proxy and the authorizer on, the brokers must know the proxy (its certificate) to
        trust the client principals it forwards; a PLAINTEXT proxy would be anonymous."""
        return bool(self.listeners) and self.proxy.enabled and self.authorizer_enabled

    @property
    def needs_broker_certificate(self) -> bool:
        """Whether the brokers serve TLS anywhere (a TLS listener or the mTLS internal one)."""
        return self.tls_listeners or self.proxy_internal_tls


class ClusterPhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    DEGRADED = "Degraded"
    TERMINATING = "Terminating"


class KafScaleClusterStatus(ApiModel):
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    phase: ClusterPhase | None = Field(default=None, description="Summary of the conditions.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, Progressing and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    brokers: BrokerStatus = Field(default_factory=BrokerStatus, description="Broker pods.")
    bootstrap: str | None = Field(default=None, description="Bootstrap address for Kafka clients.")
    cluster_name: str | None = Field(default=None, description="Name in etcd and object storage.")
    leases: LeaseStatus | None = Field(default=None, description="Partition lease distribution.")
    listeners: list[ListenerStatus] | None = Field(
        default=None, description="Where clients connect to each of spec.listeners."
    )


class KafScaleTopicSpec(ApiModel):
    cluster_ref: str = Field(
        min_length=1, max_length=253, description="Name of the KafScaleCluster (same namespace)."
    )
    topic_name: str | None = Field(
        default=None,
        pattern=TOPIC_NAME_PATTERN,
        description="Kafka topic name; defaults to metadata.name.",
    )
    partitions: int = Field(
        default=3, ge=1, le=10000, description="Number of partitions (may grow, never shrink)."
    )
    configs: dict[str, str] = Field(
        default_factory=dict, description="Topic configs, e.g. retention.ms."
    )


class TopicPhase(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    DEGRADED = "Degraded"


class KafScaleTopicStatus(ApiModel):
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    phase: TopicPhase | None = Field(default=None, description="Summary of the conditions.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    topic_id: str | None = Field(default=None, description="Topic id in etcd.")
    partitions: int | None = Field(default=None, description="Partitions the topic has in etcd.")


class KafScaleUserSpec(ApiModel):
    cluster: str = Field(
        min_length=1, max_length=253, description="Name of the KafScaleCluster (same namespace)."
    )
    authentication: UserAuthentication = Field(
        default_factory=UserAuthentication,
        description="SCRAM credential; its password lands in a Secret named after the user.",
    )
    authorization: UserAuthorization = Field(
        default_factory=UserAuthorization, description="ACLs of principal User:<name>."
    )


class UserPhase(StrEnum):
    PENDING = "Pending"
    READY = "Ready"


class KafScaleUserStatus(ApiModel):
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    phase: UserPhase | None = Field(default=None, description="Summary of the conditions.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    username: str | None = Field(default=None, description="SASL user name (metadata.name).")
    secret: str | None = Field(
        default=None, description="Secret holding `password` and `sasl.jaas.config`."
    )
    acls: int | None = Field(default=None, description="ACL bindings of the user in etcd.")


class ClusterRef(ApiModel):
    """What a builder needs of the resource's identity (owner references, names)."""

    name: str
    namespace: str
    uid: str
    generation: int = 1

    @classmethod
    def from_body(cls, body: Any) -> ClusterRef:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta.get("namespace") or "default",
            uid=meta.get("uid") or "",
            generation=int(meta.get("generation") or 1),
        )


def parse_cluster_spec(spec: Any) -> KafScaleClusterSpec:
    return KafScaleClusterSpec.model_validate(dict(spec))


def parse_topic_spec(spec: Any) -> KafScaleTopicSpec:
    return KafScaleTopicSpec.model_validate(dict(spec))


def parse_user_spec(spec: Any) -> KafScaleUserSpec:
    return KafScaleUserSpec.model_validate(dict(spec))
