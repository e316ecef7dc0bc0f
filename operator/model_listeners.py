"""``spec.listeners[]`` of a KafScaleCluster: the Kafka listeners every broker opens.

Name, port, TLS and how clients authenticate, plus the names and ports the operator keeps for
itself (the internal listener, the admin port). A section of the cluster's spec (:mod:`models`
assembles it); ``listeners`` and ``proxy_listeners`` turn it into settings, ports and mounts.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, model_validator

from kafscale.operator.model_base import ApiModel


class ListenerAuthenticationType(StrEnum):
    NONE = "none"
    SCRAM_SHA_512 = "scram-sha-512"
    SCRAM_SHA_256 = "scram-sha-256"
    PLAIN = "plain"
    TLS = "tls"


class ListenerAuthentication(ApiModel):
    type: ListenerAuthenticationType = Field(
        default=ListenerAuthenticationType.NONE,
        description="none; scram-sha-512, scram-sha-256 or plain (SASL, users as KafScaleUser "
        "resources); tls (client certificates signed by the cluster CA, needs tls: true).",
    )


# Names the operator uses itself: the internal listener and the admin port.
RESERVED_LISTENER_NAMES = frozenset({"internal", "admin", "kafka", "metrics"})
INTERNAL_LISTENER_PORT = 9091
RESERVED_LISTENER_PORTS = frozenset({INTERNAL_LISTENER_PORT, 8080})


class ListenerSpec(ApiModel):
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
