"""Proxy configuration: one frozen pydantic-settings model, parsed once at start-up.

Configured like the broker (``KAFSCALE_`` environment variables with ``__`` between nested
names, or the matching flags), so a pod template can give broker and proxy pods the same
cluster and etcd variables. The proxy needs etcd only: it keeps no data and reads no object
store. Its part of the README's configuration reference is generated from this model.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kafscale.broker.config import (
    AuthorizerSettings,
    DelegationTokenSettings,
    EtcdConnectionSettings,
    LimitSettings,
    LogFormat,
    LogLevel,
    SaslSettings,
    TlsSettings,
)
from kafscale.broker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    Listener,
    SecurityProtocol,
    advertised_host,
    check_listener_tls,
    configured_listeners,
)


class _Section(BaseModel):
    # Proxy pods read the ConfigMap the brokers get (cluster, etcd, listener ports): variables
    # only brokers know (``KAFSCALE_ETCD__SESSION_TTL_S``, ``KAFSCALE_LISTENER__RACK``...) are
    # ignored, not refused. Flags come from this model, so they cannot name unknown fields.
    model_config = ConfigDict(frozen=True, extra="ignore")


class ProxyListenerSettings(_Section):
    """Where clients connect, and the one broker the proxy tells them about."""

    host: str = Field("0.0.0.0", description="Address the proxy's Kafka listener binds to.")
    port: int = Field(9092, ge=0, le=65535, description="Kafka listener port (0 picks a free one).")
    advertised_host: str | None = Field(
        None,
        description="Host clients are told to connect to (Metadata, FindCoordinator): the "
        "proxy's Service or load balancer name; defaults as for the broker.",
    )
    advertised_port: int | None = Field(
        None, ge=1, le=65535, description="Port clients are told; defaults to the bound port."
    )
    admin_port: int = Field(
        8080,
        ge=0,
        le=65535,
        description="HTTP port for /healthz, /readyz, GET /metrics and GET /status.",
    )
    node_id: int = Field(
        1000,
        ge=0,
        description="The node id the proxy answers as (the same on every proxy replica: "
        "clients see one broker).",
    )

    def advertised(self, host_name: Callable[[], str] = socket.getfqdn) -> str:
        return advertised_host(self.host, self.advertised_host, host_name)


class ProxyEtcdSettings(EtcdConnectionSettings):
    """The brokers' way to etcd (endpoints, TLS, credentials); their other etcd settings in a
    shared ConfigMap are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")


class RoutingSettings(_Section):
    """How hard the proxy tries before a routing failure reaches the client."""

    retry_timeout_s: float = Field(
        15.0,
        gt=0,
        description="Longest a request is retried on NOT_LEADER_OR_FOLLOWER, NOT_COORDINATOR or "
        "a dropped broker connection (also bounded by the request's own timeout).",
    )
    max_attempts: int = Field(
        30, ge=1, description="Attempts per request part, the first included."
    )
    connect_timeout_s: float = Field(
        3.0, gt=0, description="Deadline for opening a connection to a broker."
    )
    stale_route_grace_s: float = Field(
        0.5,
        ge=0,
        description="How long the broker a route names may keep answering NOT_LEADER_OR_FOLLOWER "
        "(NOT_COORDINATOR for a group) before the proxy reads that lease from etcd itself and "
        "corrects its table if a watch missed the change.",
    )
    stale_route_check_interval_s: float = Field(
        1.0,
        gt=0,
        description="Least time between two such etcd reads of one lease key.",
    )
    fetch_wake_wait_ms: int = Field(
        50,
        ge=0,
        description="After a high-watermark change ends a long poll's wait, how long the owner "
        "may wait for the data it has not seen yet.",
    )
    expose_owners: bool = Field(
        False,
        description="List every live broker's id in Metadata, each at the proxy's address, and "
        "name the owner as a partition's leader: clients then send each owner's partitions in "
        "requests of their own (no ack waits for the slowest of several owners), still only "
        "to the proxy. Off: the proxy is the only broker, node listener.node_id.",
    )
    max_buffered_bytes: int = Field(
        512 * 1024 * 1024,
        ge=1024 * 1024,
        description="Request bytes in flight through the proxy as a whole (each connection is "
        "also bounded by limits.max_in_flight_bytes_per_connection).",
    )


UPSTREAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


class UpstreamSettings(_Section):
    """How the proxy connects to the brokers' internal listener, and as whom."""

    security_protocol: SecurityProtocol = Field(
        SecurityProtocol.PLAINTEXT,
        description="The protocol of the brokers' listener the proxy uses (their registered "
        "main address, or `listener`). SSL with `cert_file`: the proxy's principal is its "
        "certificate's User:<subject>; SASL_PLAINTEXT/SASL_SSL: User:<sasl_username>.",
    )
    listener: str | None = Field(
        None,
        examples=["PROXY"],
        description="The brokers' listener (by name) the proxy connects to; None: the address "
        "they register as their main one (their internal listener).",
    )
    sasl_mechanism: str = Field(
        "SCRAM-SHA-512", description="SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (SASL protocols)."
    )
    sasl_username: str | None = Field(None, description="The proxy's user on the brokers.")
    sasl_password: SecretStr | None = Field(None, description="That user's password.")
    ca_file: Path | None = Field(
        None, description="PEM CAs the brokers' certificates must chain to (default: the system's)."
    )
    cert_file: Path | None = Field(
        None, description="PEM client certificate the proxy presents to the brokers (mTLS)."
    )
    key_file: Path | None = Field(None, description="PEM private key of `cert_file`.")
    check_hostname: bool = Field(
        True, description="Check that a broker's certificate names the host it registered."
    )
    forward_principals: bool = Field(
        True,
        description="Send each client request inside an Envelope (KIP-590) carrying the "
        "client's principal and address, so the brokers' ACLs apply to the client; the brokers "
        "must allow the proxy's own principal CLUSTER_ACTION (or make it a super user). Off: "
        "brokers see every client as the proxy.",
    )

    @model_validator(mode="after")
    def _check(self) -> UpstreamSettings:
        if self.security_protocol.uses_sasl and not (self.sasl_username and self.sasl_password):
            raise ValueError("a SASL upstream needs upstream.sasl_username and sasl_password")
        if self.sasl_mechanism not in UPSTREAM_MECHANISMS:
            raise ValueError(f"upstream.sasl_mechanism must be one of {UPSTREAM_MECHANISMS}")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("upstream.cert_file and upstream.key_file go together")
        if self.cert_file and not self.security_protocol.uses_tls:
            raise ValueError("upstream.cert_file needs upstream.security_protocol=SSL")
        return self


class ProxyTransactionSettings(_Section):
    """The one transaction setting clients see through the proxy: it answers ApiVersions itself."""

    protocol_version: int = Field(
        2,
        ge=0,
        le=2,
        examples=[1],
        description="The finalized transaction.version the proxy reports; keep it equal to the "
        "brokers' transactions.protocol_version.",
    )


class ProxySettings(BaseSettings):
    """Everything one proxy process needs to know."""

    model_config = SettingsConfigDict(
        env_prefix="KAFSCALE_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    cluster: str = Field("default", description="Cluster name: the etcd key prefix.")
    listener: ProxyListenerSettings = ProxyListenerSettings()
    etcd: ProxyEtcdSettings = ProxyEtcdSettings()
    limits: LimitSettings = LimitSettings()
    routing: RoutingSettings = RoutingSettings()
    listeners: str | None = Field(
        None,
        examples=["EXTERNAL://:9093"],
        description="Client listeners as the broker's `listeners`: NAME://host:port,... "
        "(e.g. `INTERNAL://:9092,EXTERNAL://:9093`); None: one PLAINTEXT listener from "
        "listener.host and listener.port.",
    )
    advertised_listeners: str | None = Field(
        None,
        examples=["EXTERNAL://kafka.example.com:9093"],
        description="NAME://host:port,... the proxy names as the broker to clients of listener "
        "NAME; a listener left out advertises its bind address.",
    )
    listener_security_protocol_map: str = Field(
        DEFAULT_PROTOCOL_MAP,
        examples=["INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL"],
        description="NAME:PROTOCOL,... with PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    )
    tls: TlsSettings = TlsSettings()
    sasl: SaslSettings = SaslSettings()
    authorizer: AuthorizerSettings = Field(
        AuthorizerSettings(),
        description="The brokers' ACL settings: the proxy filters the answers it makes itself "
        "(Metadata, FindCoordinator) by them.",
    )
    delegation_token: DelegationTokenSettings = Field(
        DelegationTokenSettings(),
        description="The brokers' token settings: with the secret key set, the proxy's SASL "
        "listeners accept delegation-token logins (tokens are read from etcd; only the key "
        "turns them on, the lifetimes matter to the brokers).",
    )
    upstream: UpstreamSettings = UpstreamSettings()
    transactions: ProxyTransactionSettings = ProxyTransactionSettings()
    log_level: LogLevel = Field(
        "INFO",
        examples=["DEBUG"],
        description="Python logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
    )
    log_format: LogFormat = Field(
        LogFormat.TEXT,
        description="text: one readable line per record; json: one JSON object per line with "
        "the broker id and, where relevant, topic, partition and group.",
    )
    metrics_enabled: bool = Field(
        True,
        description="Count requests, bytes, flushes and store/etcd calls for GET /metrics "
        "(off: those counters stay at zero; state gauges are still served).",
    )

    @model_validator(mode="after")
    def _check_listeners(self) -> ProxySettings:
        check_listener_tls(self.listener_plan(), self.tls)
        return self

    def listener_plan(self) -> list[Listener]:
        """Every client listener of the proxy, parsed from the settings."""
        return configured_listeners(self)
