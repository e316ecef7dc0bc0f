"""The operator process's configuration: one frozen pydantic-settings model, parsed once.

Environment variables use the prefix ``KAFSCALE_OPERATOR_``, e.g.
``KAFSCALE_OPERATOR_NAMESPACES='["kafka","staging"]'`` or ``KAFSCALE_OPERATOR_KUBECONFIG``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="KAFSCALE_OPERATOR_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    namespaces: tuple[str, ...] = Field(
        default=(), description="Namespaces to watch; empty: every namespace (cluster-wide)."
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="kubeconfig file; unset: in-cluster service account, else ~/.kube/config.",
    )
    api_server: str | None = Field(
        default=None,
        description="Talk to this API server URL without credentials (development, tests).",
    )
    status_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="How often each cluster's status and lease distribution refresh.",
    )
    resync_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="How often each cluster's objects are re-applied (drift repair).",
    )
    rebalance_interval_s: float = Field(
        default=30.0, gt=0, description="Longest time between two assignment checks of a cluster."
    )
    discovery_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How often the operator re-reads what the API server serves (APIs, CRDs), so one "
            "installed later is used without a restart."
        ),
    )
    api_timeout_s: float = Field(
        default=10.0, gt=0, description="Deadline of every Kubernetes API call."
    )
    etcd_timeout_s: float = Field(default=3.0, gt=0, description="Deadline of every etcd call.")
    s3_timeout_s: float = Field(
        default=30.0, gt=0, description="Deadline of every object-store call."
    )
    liveness_endpoint: str | None = Field(
        default="http://0.0.0.0:8080/healthz",
        description="kopf's liveness probe endpoint (None: off).",
    )
    error_event_interval_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "A handler failing again with the same error posts its ReconcileFailed Warning "
            "Event on the resource at most this often (a new error is posted at once)."
        ),
    )
    log_level: str = Field(default="INFO", description="Python logging level.")
    metrics_port: int = Field(
        default=8081, ge=0, le=65535, description="Port of the operator's GET /metrics (0: off)."
    )
