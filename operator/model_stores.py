"""``spec.etcd`` and ``spec.storage`` of a KafScaleCluster: where its data lives.

Metadata, offsets and leases in etcd (a managed StatefulSet or external endpoints), record
batches in an S3 bucket. Their rules that cannot change after creation (etcd mode, members and
TLS) are CEL validations here, so the API server refuses such an edit (from Kubernetes 1.25;
an older server drops them and the operator refuses the change itself: ``immutable``). A
section of the cluster's spec (:mod:`models` assembles it).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from kafscale.operator.model_base import ApiModel, Quantity, ResourceRequirements

DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"


class EtcdMode(StrEnum):
    MANAGED = "Managed"
    EXTERNAL = "External"


class EtcdSpec(ApiModel):
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
        description="Managed: the operator runs an etcd StatefulSet; External: use `endpoints`. "
        "Fixed once the cluster exists: its metadata lives in that etcd, so the operator refuses "
        "a switch (ImmutableFieldChanged); docs/operations-kubernetes.md says how to move it.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self == oldSelf",
                    "message": "etcd mode cannot change after creation: the cluster's metadata "
                    "lives in that etcd (snapshot, restore and re-create the cluster to move)",
                }
            ]
        },
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
        default="1Gi",
        description="Volume size of each managed etcd member. Fixed once the cluster exists "
        "(a StatefulSet's claim templates cannot change): the operator keeps the old size and "
        "reports ImmutableFieldChanged; docs/operations-kubernetes.md says how to grow them.",
    )
    storage_class_name: str | None = Field(
        default=None,
        description="StorageClass of the etcd volumes. Fixed once the cluster exists, like "
        "storageSize.",
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


class SecretKeys(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    access_key_id_key: str = Field(
        default="AWS_ACCESS_KEY_ID", description="Key of the access key id."
    )
    secret_access_key_key: str = Field(
        default="AWS_SECRET_ACCESS_KEY", description="Key of the secret access key."
    )


class StorageSpec(ApiModel):
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
