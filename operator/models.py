"""Pydantic models of the custom resources: the single source of the CRDs.

``KafScaleCluster``, ``KafScaleTopic`` and ``KafScaleUser`` (group ``kafscale.io``, version
``v1alpha1``). Field names are camelCase on the wire (Kubernetes convention) and snake_case in
Python. The CRD schemas in ``crds/`` and ``charts/kafscale/crds/`` are generated from these
classes by ``python -m kafscale.operator.crd_gen``; a test fails when they drift.

Validation lives here (ranges, enums, patterns, required fields) so that the API server rejects
a bad resource at ``kubectl apply`` time and the handlers can parse specs without surprises.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

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
DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"

# Kafka topic names: ASCII letters, digits, '.', '_', '-', at most 249 characters.
TOPIC_NAME_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
# Cluster names become etcd key and object-key prefixes: keep them DNS-like.
CLUSTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
# Free-form broker configuration keys are dotted paths into the broker's settings model.
CONFIG_KEY_PATTERN = r"^[a-z][a-z0-9_]*([.][a-z][a-z0-9_]*)*$"

# A Kubernetes resource quantity ("500m", "1Gi", 2): int-or-string in the schema.
Quantity = Annotated[int | str, Field(json_schema_extra={"x-kubernetes-int-or-string": True})]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=True,
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ResourceRequirements(_Model):
    """CPU and memory requests and limits, as in a Pod's container."""

    requests: dict[str, Quantity] | None = Field(default=None, description="Minimum resources.")
    limits: dict[str, Quantity] | None = Field(default=None, description="Maximum resources.")


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class BrokerSpec(_Model):
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


class ServiceType(StrEnum):
    CLUSTER_IP = "ClusterIP"
    NODE_PORT = "NodePort"
    LOAD_BALANCER = "LoadBalancer"


class ProxySpec(_Model):
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


class EtcdMode(StrEnum):
    MANAGED = "Managed"
    EXTERNAL = "External"


class EtcdSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "self.mode != 'External' || "
                        "(has(self.endpoints) && size(self.endpoints) > 0)"
                    ),
                    "message": "mode External needs at least one endpoint",
                }
            ]
        }
    )

    mode: EtcdMode = Field(
        default=EtcdMode.MANAGED,
        description="Managed: the operator runs an etcd StatefulSet; External: use `endpoints`.",
    )
    endpoints: list[str] = Field(
        default_factory=list,
        description="Client URLs of an external etcd (mode External).",
        json_schema_extra={"items": {"type": "string", "pattern": r"^https?://.+"}},
    )
    replicas: int = Field(
        default=3,
        ge=1,
        le=7,
        description="Members of the managed etcd (odd numbers: 1, 3, 5, 7). Fixed once the "
        "cluster exists: every member starts with the initial member list, so a change would "
        "need etcd membership changes, which the operator does not make.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self % 2 == 1", "message": "etcd replicas must be odd (1, 3, 5, 7)"},
                {
                    "rule": "self == oldSelf",
                    "message": "etcd replicas cannot change after creation: members start "
                    "from a fixed initial cluster (back up, recreate, restore to resize)",
                },
            ]
        },
    )
    image: str = Field(
        default=DEFAULT_ETCD_IMAGE, min_length=1, description="Image of the managed etcd."
    )
    storage_size: Quantity = Field(
        default="1Gi", description="Volume size of each managed etcd member."
    )
    storage_class_name: str | None = Field(
        default=None, description="StorageClass of the etcd volumes."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="etcd container resources."
    )
    network_policy: bool = Field(
        default=True,
        description="Managed etcd only: a NetworkPolicy admits to etcd's client port only this "
        'cluster\'s pods, the operator and pods labelled `kafscale.io/etcd-client: "true"` in '
        "the cluster's namespace (e.g. Spark jobs reading topics from object storage).",
    )
    tls: bool = Field(
        default=False,
        description="Managed etcd only: serve clients and peers over TLS with certificates "
        "the operator makes (or cert-manager, when installed), accept only clients holding the "
        "cluster's etcd client certificate, and allow only this cluster's pods and the operator "
        "to its client port (a NetworkPolicy). Fixed once the cluster exists (members store "
        "their peer URLs).",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "etcd tls cannot change after creation: members store their "
                    "peer URLs (back up, recreate, restore to switch)",
                }
            ]
        },
    )

    @model_validator(mode="after")
    def _external_needs_endpoints(self) -> EtcdSpec:
        if self.mode == EtcdMode.EXTERNAL and not self.endpoints:
            raise ValueError("mode External needs at least one endpoint")
        return self


class SecretKeys(_Model):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    access_key_id_key: str = Field(
        default="AWS_ACCESS_KEY_ID", description="Key of the access key id."
    )
    secret_access_key_key: str = Field(
        default="AWS_SECRET_ACCESS_KEY", description="Key of the secret access key."
    )


class StorageSpec(_Model):
    bucket: str = Field(min_length=3, max_length=63, description="S3 bucket.")
    prefix: str = Field(default="", max_length=512, description="Key prefix inside the bucket.")
    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        description="S3 endpoint URL (path-style); unset for AWS.",
    )
    region: str = Field(default="us-east-1", description="S3 region.")
    credentials_secret: SecretKeys | None = Field(
        default=None, description="Secret with S3 credentials; unset to use the pod's identity."
    )


class AutoscalingSpec(_Model):
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


class ListenerAuthenticationType(StrEnum):
    NONE = "none"
    SCRAM_SHA_512 = "scram-sha-512"
    SCRAM_SHA_256 = "scram-sha-256"
    PLAIN = "plain"
    TLS = "tls"


class ListenerAuthentication(_Model):
    type: ListenerAuthenticationType = Field(
        default=ListenerAuthenticationType.NONE,
        description="none; scram-sha-512, scram-sha-256 or plain (SASL, users as KafScaleUser "
        "resources); tls (client certificates signed by the cluster CA, needs tls: true).",
    )


# Names the operator uses itself: the internal listener and the admin port.
RESERVED_LISTENER_NAMES = frozenset({"internal", "admin", "kafka", "metrics"})
INTERNAL_LISTENER_PORT = 9091
RESERVED_LISTENER_PORTS = frozenset({INTERNAL_LISTENER_PORT, 8080})


class ListenerSpec(_Model):
    """One Kafka listener of every broker (Strimzi's ``spec.kafka.listeners`` shape)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.authentication) || self.authentication.type != 'tls' "
                    "|| self.tls",
                    "message": "authentication tls needs tls: true",
                }
            ]
        }
    )

    name: str = Field(
        pattern=r"^[a-z][a-z0-9]{0,10}$",
        description="Listener name (lower case; Kafka's listener name is its upper case); also "
        "the port's name on the brokers' Service. `internal`, `admin`, `kafka` and `metrics` "
        "are the operator's.",
    )
    port: int = Field(
        ge=1024,
        le=65535,
        description="Port of the listener on every broker and on the brokers' Service (9091 and "
        "8080 are the internal listener's and the admin port's).",
    )
    tls: bool = Field(default=False, description="Serve TLS with the cluster's broker certificate.")
    authentication: ListenerAuthentication = Field(
        default_factory=ListenerAuthentication, description="How clients prove who they are."
    )

    @model_validator(mode="after")
    def _check(self) -> ListenerSpec:
        if self.name in RESERVED_LISTENER_NAMES:
            raise ValueError(f"listener name {self.name} is reserved")
        if self.port in RESERVED_LISTENER_PORTS:
            raise ValueError(f"listener port {self.port} is reserved")
        if self.authentication.type == ListenerAuthenticationType.TLS and not self.tls:
            raise ValueError("authentication tls needs tls: true")
        return self

    @property
    def security_protocol(self) -> str:
        """Kafka's security protocol for this listener."""
        sasl = self.authentication.type not in (
            ListenerAuthenticationType.NONE,
            ListenerAuthenticationType.TLS,
        )
        if sasl:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"


# Spellings of true pydantic accepts for a boolean setting (brokers.config values are strings).
TRUE_WORDS = frozenset({"true", "1", "yes", "on", "t", "y"})


class DeletionPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


class KafScaleClusterSpec(_Model):
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


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    type: str = Field(description="Ready, Progressing, Degraded or FeaturesSupported.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When the status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="Generation this was computed for."
    )


class BrokerStatus(_Model):
    replicas: int = Field(default=0, description="Broker pods that exist (the scale status path).")
    ready_replicas: int = Field(default=0, description="Broker pods that are ready.")
    selector: str = Field(
        default="", description="Label selector of the broker pods (for HPA/scale)."
    )
    registered: int = Field(default=0, description="Brokers registered in etcd.")


class LeaseStatus(_Model):
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


class ClusterPhase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    DEGRADED = "Degraded"
    TERMINATING = "Terminating"


class ListenerStatus(_Model):
    name: str = Field(description="Listener name (spec.listeners[].name).")
    security_protocol: str = Field(description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    bootstrap_servers: str = Field(description="host:port of the brokers' Service port.")
    ca_secret: str | None = Field(
        default=None, description="Secret whose `ca.crt` clients trust (TLS listeners)."
    )


class KafScaleClusterStatus(_Model):
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


class KafScaleTopicSpec(_Model):
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


class KafScaleTopicStatus(_Model):
    observed_generation: int | None = Field(default=None, description="Generation last reconciled.")
    phase: TopicPhase | None = Field(default=None, description="Summary of the conditions.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready and Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    topic_id: str | None = Field(default=None, description="Topic id in etcd.")
    partitions: int | None = Field(default=None, description="Partitions the topic has in etcd.")


class AuthenticationType(StrEnum):
    SCRAM_SHA_512 = "scram-sha-512"
    SCRAM_SHA_256 = "scram-sha-256"


class SecretKeySelector(_Model):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    key: str = Field(min_length=1, max_length=253, description="Key inside the Secret.")


class PasswordSource(_Model):
    secret_key_ref: SecretKeySelector = Field(description="The Secret key holding the password.")


class UserPassword(_Model):
    value_from: PasswordSource = Field(description="Where the password comes from.")


class UserAuthentication(_Model):
    type: AuthenticationType = Field(
        default=AuthenticationType.SCRAM_SHA_512,
        description="SASL mechanism whose credential is stored in etcd (as Strimzi's KafkaUser).",
    )
    password: UserPassword | None = Field(
        default=None,
        description="A password of yours (`valueFrom.secretKeyRef`, as Strimzi's KafkaUser); "
        "unset: the operator generates one into a Secret named after the user.",
    )


class AclResourceType(StrEnum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"
    TRANSACTIONAL_ID = "transactionalId"


class AclPatternType(StrEnum):
    LITERAL = "literal"
    PREFIX = "prefix"


class AclOperation(StrEnum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"
    DESCRIBE_CONFIGS = "DescribeConfigs"
    ALTER_CONFIGS = "AlterConfigs"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class AclRuleType(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class AclResource(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.type == 'cluster' || (has(self.name) && size(self.name) > 0)",
                    "message": "a topic, group or transactionalId resource needs a name",
                }
            ]
        }
    )

    type: AclResourceType = Field(description="topic, group, cluster or transactionalId.")
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=249,
        description="Resource name ('*': every resource of the type); not used for cluster.",
    )
    pattern_type: AclPatternType = Field(
        default=AclPatternType.LITERAL,
        description="literal: the name exactly (or '*'); prefix: every name starting with it.",
    )

    @model_validator(mode="after")
    def _named_unless_cluster(self) -> AclResource:
        if self.type != AclResourceType.CLUSTER and not self.name:
            raise ValueError("a topic, group or transactionalId resource needs a name")
        return self


class AclRule(_Model):
    resource: AclResource = Field(description="What the rule is about.")
    operations: list[AclOperation] = Field(
        min_length=1, description="Operations the rule allows or denies."
    )
    host: str = Field(default="*", min_length=1, description="Client address ('*': any).")
    type: AclRuleType = Field(default=AclRuleType.ALLOW, description="allow or deny.")


class AuthorizationType(StrEnum):
    SIMPLE = "simple"


class UserAuthorization(_Model):
    type: AuthorizationType = Field(
        default=AuthorizationType.SIMPLE, description="simple: ACLs in etcd (Kafka's own model)."
    )
    acls: list[AclRule] = Field(
        default_factory=list,
        description="The user's ACL rules; the operator makes the bindings in etcd exactly these.",
    )


class KafScaleUserSpec(_Model):
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


class KafScaleUserStatus(_Model):
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


class ClusterRef(_Model):
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
