"""Free-form broker settings from a KafScaleCluster → KAFSCALE_* environment variables.

``spec.brokers.config`` keys are dotted paths into the broker's settings model
(:class:`kafscale.broker.config.BrokerSettings`), e.g. ``log.flush_interval_ms`` →
``KAFSCALE_LOG__FLUSH_INTERVAL_MS``. Unknown keys and keys the operator sets itself are
rejected, so a typo surfaces as a Degraded condition instead of a crash-looping broker.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kafscale.broker.config import BrokerSettings

ENV_PREFIX = "KAFSCALE_"
NESTED_DELIMITER = "__"

# Set from the resource's own fields (or the pod), never from free-form config.
MANAGED_KEYS = frozenset(
    {
        "cluster",
        "etcd.endpoints",
        "etcd.session_ttl_s",
        "storage",
        "storage.kind",
        "storage.bucket",
        "storage.prefix",
        "storage.endpoint",
        "storage.region",
        "storage.access_key_id",
        "storage.secret_access_key",
        "storage.local_dir",
        "listener",
        "listener.host",
        "listener.port",
        "listener.admin_port",
        "listener.advertised_host",
        "listener.advertised_port",
        "listener.rack",
        "delegation_token.secret_key",  # a Secret (spec.delegationTokens), never the ConfigMap
    }
)


class InvalidBrokerConfig(ValueError):
    """A config key is unknown or managed by the operator."""


def _resolve(model: type[BaseModel], path: list[str]) -> Any:
    field = model.model_fields.get(path[0])
    if field is None:
        return None
    annotation = field.annotation
    if len(path) == 1:
        return field
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _resolve(annotation, path[1:])
    return None


def env_name(key: str) -> str:
    return ENV_PREFIX + NESTED_DELIMITER.join(part.upper() for part in key.split("."))


def broker_config_env(config: dict[str, str]) -> dict[str, str]:
    """Validate ``config`` and map it to environment variables (sorted by key)."""
    env: dict[str, str] = {}
    for key in sorted(config):
        if key in MANAGED_KEYS:
            raise InvalidBrokerConfig(f"brokers.config[{key!r}] is set by the operator")
        field = _resolve(BrokerSettings, key.split("."))
        if field is None:
            raise InvalidBrokerConfig(f"brokers.config[{key!r}] is not a broker setting")
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            raise InvalidBrokerConfig(f"brokers.config[{key!r}] names a section, not a setting")
        env[env_name(key)] = config[key]
    return env
