"""How a process reaches etcd and the object store: the configuration sections the broker, the
proxy, the operator and the Spark source share.

They live apart from ``config`` (the broker's whole settings model) so that a process that
needs only these imports neither pydantic-settings nor the listener, TLS and token models:
Spark starts a Python process for each query's planning and for its workers, and gives each
one 10 s to connect back; on a loaded host every import counts. ``config`` re-exports them.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ENV_PREFIX = "KAFSCALE_"
"""The prefix of the environment variables the settings models read (in any case, as
pydantic-settings matches them)."""

DEFAULT_CLUSTER = "default"
"""The cluster name when none is configured (the etcd and object key prefix)."""


class Section(BaseModel):
    """A frozen settings section: unknown fields are an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class EtcdConnectionSettings(Section):
    """How to reach etcd: shared by the broker and the proxy."""

    endpoints: tuple[str, ...] = Field(
        ("http://127.0.0.1:2379",),
        description="etcd client URLs, http:// or https://; all are used: the first that "
        "answers, then the next when a member stops answering.",
    )
    username: str | None = Field(None, description="etcd user (with `password`).")
    password: SecretStr | None = Field(None, description="etcd password.")
    ca_file: Path | None = Field(
        None, description="CA certificate for https:// endpoints (default: the system's)."
    )
    cert_file: Path | None = Field(
        None, description="Client certificate for https:// endpoints that require one."
    )
    key_file: Path | None = Field(None, description="Key of `cert_file`.")
    timeout_s: float = Field(5.0, gt=0, description="Deadline for every etcd call.")


class EtcdSettings(EtcdConnectionSettings):
    compaction_interval_s: float = Field(
        300.0,
        gt=0,
        description="How often the lowest-numbered broker compacts etcd's history (keeping "
        "one interval of it); 0 is not allowed: without it etcd fills its space quota.",
    )
    session_ttl_s: int = Field(
        10, ge=2, description="TTL of the broker's session lease; keepalive every TTL/3."
    )


class StorageKind(StrEnum):
    S3 = "s3"
    LOCAL = "local"


class StorageSettings(Section):
    kind: StorageKind = Field(StorageKind.S3, description="`s3` or `local` (a directory).")
    bucket: str = Field("kafscale", description="S3 bucket holding segments and indexes.")
    prefix: str = Field("", description="Key prefix inside the bucket (or directory).")
    endpoint: str | None = Field(None, description="S3 endpoint URL (path-style); None for AWS.")
    region: str = Field("us-east-1", description="S3 region.")
    access_key_id: SecretStr | None = Field(None, description="S3 access key id.")
    secret_access_key: SecretStr | None = Field(None, description="S3 secret access key.")
    local_dir: Path = Field(Path("data/objects"), description="Directory for kind=local.")
    timeout_s: float = Field(30.0, gt=0, description="Deadline for every object-store call.")
    max_concurrency: int = Field(16, ge=1, description="Object-store calls in flight at once.")
