"""Broker configuration: one frozen pydantic-settings model, parsed once at start-up.

Apart from the pod name (``KAFSCALE_POD_NAME``, set by the Kubernetes manifests from the pod's
own metadata and reported in ``/status``) and glibc's ``MALLOC_*`` variables (see ``memory``),
nothing else in the broker reads ``os.environ``. Every field can be set from the environment
with the ``KAFSCALE_`` prefix and ``__`` between nested names, for example
``KAFSCALE_ETCD__ENDPOINTS='["http://etcd:2379"]'`` or ``KAFSCALE_STORAGE__BUCKET=kafscale``.
The configuration reference in the README is generated from this model
(``kafscale config-reference``).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from kafscale.broker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    ClientAuth,
    Listener,
    SecurityProtocol,
    advertised_host,
    check_listener_tls,
    configured_listeners,
    internal_listener,
)
from kafscale.broker.security.tokens import TokenPolicy

# The sections shared with the proxy and the Spark source live in ``store_settings``; this
# module keeps them importable from here, where they were first.
from kafscale.broker.store_settings import DEFAULT_CLUSTER, ENV_PREFIX
from kafscale.broker.store_settings import EtcdConnectionSettings as EtcdConnectionSettings
from kafscale.broker.store_settings import EtcdSettings as EtcdSettings
from kafscale.broker.store_settings import Section as _Section
from kafscale.broker.store_settings import StorageKind as StorageKind
from kafscale.broker.store_settings import StorageSettings as StorageSettings


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def known_log_level(value: str) -> str:
    """``value`` upper-cased if Python's logging knows it (DEBUG, INFO, WARNING, ...): a
    misspelt level is an invalid setting named in one line, where logging's own check raised
    a traceback at start-up."""
    level = value.upper()
    if level not in logging.getLevelNamesMapping():
        raise PydanticCustomError(
            "log_level", "not a logging level: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return level


LogLevel = Annotated[str, AfterValidator(known_log_level)]


class ListenerSettings(_Section):
    """Where the Kafka listener binds and what it tells clients to connect to."""

    host: str = Field("0.0.0.0", description="Address the Kafka listener binds to.")
    port: int = Field(9092, ge=0, le=65535, description="Kafka listener port (0 picks a free one).")
    advertised_host: str | None = Field(
        None,
        description="Host given to clients in Metadata; defaults to the bind host or, when "
        "binding all interfaces, this machine's fully qualified host name (as Kafka does).",
    )
    advertised_port: int | None = Field(
        None, ge=1, le=65535, description="Port given to clients; defaults to the bound port."
    )
    admin_port: int = Field(
        8080,
        ge=0,
        le=65535,
        description="HTTP port for /healthz, /readyz, GET /metrics, GET /status and POST /drain.",
    )
    rack: str | None = Field(None, description="Rack id reported in Metadata.")

    def advertised(self, host_name: Callable[[], str] = socket.getfqdn) -> str:
        """The host clients are told to connect to. A broker bound to every interface must not
        advertise loopback: clients on other machines would be sent to themselves."""
        return advertised_host(self.host, self.advertised_host, host_name)


class IsolationLevel(StrEnum):
    READ_COMMITTED = "read_committed"
    READ_UNCOMMITTED = "read_uncommitted"


class LogSettings(_Section):
    segment_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Buffered bytes per partition that force a flush."
    )
    flush_interval_ms: int = Field(
        100,
        ge=1,
        description="Longest a produced batch waits for its flush round to start (rounds "
        "otherwise start as soon as there is data: group commit).",
    )
    flush_min_interval_ms: int | None = Field(
        None,
        ge=0,
        description="Shortest time between the starts of two flush rounds: bounds the PUTs per "
        "second per partition (1000 / this, plus one per filled segment), at the cost of up to "
        "this much ack latency. None: by store, 0 for `local`, 20 for `s3` (at most 50 PUTs/s "
        "per busy partition); capped by flush_interval_ms.",
    )
    flush_coalesce_ms: int = Field(
        0,
        ge=0,
        description="How long the first batch of a flush round waits for others to join it "
        "(more batches per PUT and etcd commit, for that much ack latency).",
    )
    cache_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="In-memory cache of recent segments, in bytes of memory held (segments "
        "being flushed count too).",
    )
    index_interval_bytes: int = Field(
        4096, ge=1, description="Bytes between index entries inside a segment."
    )
    index_min_segment_bytes: int = Field(
        8 * 1024 * 1024,
        ge=0,
        description="Segments smaller than this get no index object: readers GET segments up "
        "to 8 MiB whole, so only larger ones are read by ranges. 0 indexes every segment.",
    )
    aborted_txns_in_state: int = Field(
        512,
        ge=2,
        description="Aborted transactions a partition's etcd state keeps; beyond this, the "
        "flush moves all but the newest half to an aborted-transaction index object in the "
        "store, which read_committed readers of older offsets GET once (then cached).",
    )
    retention_check_interval_s: float = Field(
        30.0, gt=0, description="How often retention by time and size is applied."
    )
    cleaner_enable: bool = Field(
        True,
        description="Run the log cleaner: compact the partitions this broker owns of topics "
        "whose cleanup.policy includes compact (see docs/compaction.md).",
    )
    cleaner_interval_s: float = Field(
        15.0, gt=0, description="How often the log cleaner looks for a partition to clean."
    )
    cleaner_max_keys: int = Field(
        1_000_000,
        ge=1,
        description="Keys one compaction pass holds in its offset map (about 150 bytes of memory "
        "each); a pass whose dirty data has more ends at the last segment that fit.",
    )
    cleaner_delete_delay_s: float = Field(
        60.0,
        ge=0,
        description="How long objects superseded by a compaction pass stay readable before they "
        "are deleted (readers that listed them before the pass finish their reads).",
    )
    purge_interval_s: float = Field(
        60.0,
        gt=0,
        description="How often the lowest-numbered broker deletes the objects of deleted topics "
        "that are still there (the store was unreachable, or the deleting broker stopped).",
    )


class LimitSettings(_Section):
    max_frame_bytes: int = Field(
        100 * 1024 * 1024, ge=1024, description="Largest request frame accepted."
    )
    max_in_flight_per_connection: int = Field(
        1024, ge=1, description="Requests processed at once on one connection."
    )
    max_in_flight_bytes_per_connection: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="Request bytes processed at once on one connection (one larger request "
        "may still run alone).",
    )
    max_connections: int = Field(4096, ge=1, description="Open client connections per listener.")
    max_connections_per_address: int = Field(
        1000,
        ge=1,
        description="Open client connections from one client address (Kafka's "
        "max.connections.per.ip); more are closed at once.",
    )
    queued_max_request_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Request bytes held in memory across all connections (Kafka's "
        "queued.max.request.bytes); when spent, connections with large requests stop being "
        "read until memory is freed. Frames up to 16 KiB are not counted.",
    )
    max_buffered_produce_bytes: int = Field(
        128 * 1024 * 1024,
        ge=1024 * 1024,
        description="Produced bytes a broker holds until they are durable, acks=0 and acks=1/all "
        "alike; past it, produce requests wait (acks=1/all up to their timeout, then "
        "REQUEST_TIMED_OUT) and producing connections stop being read.",
    )
    connections_max_idle_ms: int = Field(
        600_000,
        ge=100,
        description="A connection with nothing received, sent or in flight for this long is "
        "closed (Kafka's connections.max.idle.ms).",
    )
    fetch_sessions: int = Field(
        1000,
        ge=0,
        description="Incremental fetch sessions (KIP-227) kept, the least recently used evicted "
        "beyond (0: none; Kafka's max.incremental.fetch.session.cache.slots).",
    )
    shutdown_grace_s: float = Field(
        20.0, gt=0, description="Deadline for finishing in-flight work on shutdown."
    )


class TopicDefaults(_Section):
    num_partitions: int = Field(3, ge=1, description="Partitions of auto-created topics.")
    auto_create_topics: bool = Field(
        True,
        description="Create unknown topics a client's Metadata request names (Kafka's "
        "auto.create.topics.enable); a Produce to an unknown topic gets "
        "UNKNOWN_TOPIC_OR_PARTITION, as from Kafka.",
    )
    retention_ms: int = Field(7 * 24 * 3600 * 1000, description="Default retention.ms (-1: none).")
    retention_bytes: int = Field(-1, description="Default retention.bytes (-1: none).")
    max_message_bytes: int = Field(
        1048588,
        ge=0,
        description="Default max.message.bytes: the largest record batch a produce may carry "
        "(as stored, compressed); larger ones get MESSAGE_TOO_LARGE.",
    )

    def as_topic_configs(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "max.message.bytes": str(self.max_message_bytes),
        }


class AssignmentSettings(_Section):
    self_assign: bool = Field(
        True,
        description="Brokers elect one of themselves to write the partition assignment "
        "(needed outside Kubernetes; harmless beside the operator, which writes the same).",
    )


class MetadataSettings(_Section):
    """What Metadata answers beyond etcd's registry."""

    departed_broker_grace_s: float = Field(
        30.0,
        ge=0,
        description="Metadata and DescribeCluster keep listing a broker this long after its "
        "registration went (never as leader, coordinator or controller): librdkafka destroys "
        "a broker missing from one Metadata answer, and a transaction waiting on that broker "
        "as its group coordinator then hangs (librdkafka #5511). 30 s outlasts librdkafka's "
        "10-s maximum reconnect backoff and its 1-s coordinator re-query; 0: list only "
        "registered brokers.",
    )


GROUP_SIZE_UNBOUNDED = 2**31 - 1
"""Kafka's default ``group.max.size`` and ``group.consumer.max.size``: Integer.MAX_VALUE."""


class GroupSettings(_Section):
    """Consumer group coordination (Kafka's ``group.*`` broker configs)."""

    initial_rebalance_delay_ms: int = Field(
        3000, ge=0, description="group.initial.rebalance.delay.ms: wait for more members first."
    )
    min_session_timeout_ms: int = Field(
        6000, ge=1, description="group.min.session.timeout.ms: shortest session a member may ask."
    )
    max_session_timeout_ms: int = Field(
        1_800_000, ge=1, description="group.max.session.timeout.ms: longest session allowed."
    )
    max_size: int = Field(
        GROUP_SIZE_UNBOUNDED,
        ge=1,
        le=GROUP_SIZE_UNBOUNDED,
        examples=[100],
        description="group.max.size (KIP-389): members a classic group may have; a JoinGroup "
        "past it gets GROUP_MAX_SIZE_REACHED (a static member back with its group.instance.id "
        "is not new). A group found over it (the limit lowered) rebalances and sheds the "
        "members that rejoin last. Kafka's default: unbounded (2147483647).",
    )
    consumer_max_size: int = Field(
        GROUP_SIZE_UNBOUNDED,
        ge=1,
        le=GROUP_SIZE_UNBOUNDED,
        examples=[100],
        description="group.consumer.max.size: members a consumer-protocol (KIP-848) group may "
        "have, classic members inside it counted; a ConsumerGroupHeartbeat (or a classic "
        "JoinGroup) of a new member past it gets GROUP_MAX_SIZE_REACHED. Kafka's default: "
        "unbounded (2147483647).",
    )
    consumer_session_timeout_ms: int = Field(
        45_000,
        ge=1,
        description="group.consumer.session.timeout.ms: session of consumer-protocol (KIP-848) "
        "members.",
    )
    consumer_heartbeat_interval_ms: int = Field(
        5_000,
        ge=1,
        description="group.consumer.heartbeat.interval.ms: how often consumer-protocol members "
        "heartbeat.",
    )
    consumer_min_session_timeout_ms: int = Field(
        45_000,
        ge=1,
        description="group.consumer.min.session.timeout.ms: the shortest "
        "consumer.session.timeout.ms a group's own config may set.",
    )
    consumer_max_session_timeout_ms: int = Field(
        60_000,
        ge=1,
        description="group.consumer.max.session.timeout.ms: the longest "
        "consumer.session.timeout.ms a group's own config may set.",
    )
    consumer_min_heartbeat_interval_ms: int = Field(
        5_000,
        ge=1,
        description="group.consumer.min.heartbeat.interval.ms: the shortest "
        "consumer.heartbeat.interval.ms a group's own config may set.",
    )
    consumer_max_heartbeat_interval_ms: int = Field(
        15_000,
        ge=1,
        description="group.consumer.max.heartbeat.interval.ms: the longest "
        "consumer.heartbeat.interval.ms a group's own config may set.",
    )
    share_session_timeout_ms: int = Field(
        45_000, ge=1, description="group.share.session.timeout.ms: share group members' session."
    )
    share_heartbeat_interval_ms: int = Field(
        5_000,
        ge=1,
        description="group.share.heartbeat.interval.ms: how often share group members heartbeat.",
    )
    share_record_lock_duration_ms: int = Field(
        30_000,
        ge=100,
        description="group.share.record.lock.duration.ms: how long a share group member holds "
        "the records it acquired before they are available again.",
    )
    share_delivery_count_limit: int = Field(
        5,
        ge=2,
        le=10,
        description="group.share.delivery.count.limit: deliveries of a record before it is "
        "archived.",
    )
    share_isolation_level: IsolationLevel = Field(
        IsolationLevel.READ_UNCOMMITTED,
        description="share.isolation.level for share groups without their own, Kafka's default: "
        "read_uncommitted hands out every record (never a transaction marker); read_committed "
        "never delivers aborted records or an open transaction's.",
    )
    share_max_groups: int = Field(
        1000,
        ge=1,
        description="Share groups the cluster keeps at most, empty ones included (a bound on "
        "the coordinators' memory and etcd that ShareGroupHeartbeat with invented group ids "
        "could otherwise grow without end): a join that would create one more is answered "
        "GROUP_MAX_SIZE_REACHED. Delete unused share groups to make room.",
    )
    share_partition_max_record_locks: int = Field(
        2000,
        ge=100,
        le=10_000,
        description="group.share.partition.max.record.locks: in-flight records per "
        "share-partition (bounds the memory a share group takes on a partition's owner).",
    )
    offsets_retention_minutes: float = Field(
        10080,
        gt=0,
        description="offsets.retention.minutes (KIP-211): committed offsets of a group that has "
        "been Empty this long expire (counted from when it became Empty), those committed "
        "outside group management this long after their commit; an Empty group left without "
        "offsets is deleted. Fractions are allowed (0.05 = 3 s, for tests).",
    )
    offsets_retention_check_interval_ms: int = Field(
        600_000,
        ge=1,
        description="offsets.retention.check.interval.ms: how often each coordinator looks for "
        "expired offsets.",
    )
    idle_release_ms: int = Field(
        300_000,
        ge=1,
        description="How long a group without members that keeps committed offsets stays "
        "coordinated (a runtime and a lease) after the last request that named it; then it is "
        "let go and reloaded from etcd when asked for again (no client sees a difference). Keep "
        "it below offsets_retention_check_interval_ms: groups a retention check takes on go "
        "before the next check.",
    )
    lag_refresh_interval_ms: int = Field(
        30_000,
        ge=100,
        description="How often each broker reads from etcd the committed offsets of the groups "
        "whose consumer lag it reports without coordinating them (consumers gone, let go when "
        "idle, not asked for since a restart): their kafscale_consumer_group_lag is at most "
        "this old (plus the extra refreshes lag_refresh_max_groups may take).",
    )
    lag_refresh_max_groups: int = Field(
        10_000,
        ge=1,
        description="Stored groups one lag refresh reads at most (their keys, a page of 500 "
        "keys per etcd read): a cluster storing more is gone through over several refreshes, "
        "each counted in kafscale_consumer_group_lag_refreshes_capped_total.",
    )
    vacant_release_ms: int = Field(
        5_000,
        ge=1,
        le=86_400_000,
        description="How long a group that holds nothing (no members, no committed offsets: "
        "one that a DescribeGroups, OffsetFetch or Heartbeat named but nobody created) stays "
        "coordinated (a runtime and a lease) after the last request that named it. Every name "
        "asked for costs a runtime and a lease until then; a longer time only spares the "
        "reload of a name asked for again and again. At most one day.",
    )


class TransactionSettings(_Section):
    """The transaction coordinator (Kafka's ``transaction.*`` broker configs)."""

    max_timeout_ms: int = Field(
        900_000,
        ge=1,
        description="transaction.max.timeout.ms: the longest transaction.timeout.ms allowed.",
    )
    check_interval_ms: int = Field(
        5_000,
        ge=10,
        description=(
            "How often a broker aborts timed-out transactions and takes over prepared ones whose"
            " coordinator is gone (Kafka's transaction.abort.timed.out.transaction.cleanup"
            ".interval.ms)."
        ),
    )
    id_expiration_ms: int = Field(
        7 * 24 * 3600 * 1000,
        ge=1,
        description="transactional.id.expiration.ms: a transactional id with no transaction "
        "in flight and unused this long loses its record (its producer's next "
        "InitProducerId gets a new producer id); checked every check_interval_ms.",
    )
    protocol_version: int = Field(
        2,
        ge=0,
        le=2,
        examples=[1],
        description="The finalized transaction.version ApiVersions reports (KIP-890): 2 lets "
        "clients that know it (the Java client from 4.0) run transaction protocol v2 (an epoch "
        "bump at every commit and abort); 0 or 1 keeps every client on v1. Set 1 on every "
        "broker and proxy while a rolling upgrade from a release without v2 is under way.",
    )
    partition_verification: bool = Field(
        True,
        description="transaction.partition.verification.enable (KIP-890): a partition's owner "
        "asks the transaction coordinator before a transactional batch opens a transaction on "
        "the partition, and refuses it (INVALID_TXN_STATE) unless the partition is in the "
        "producer's ongoing transaction: no hanging transaction holds read_committed "
        "consumers back.",
    )


class TlsSettings(_Section):
    """The certificate of the SSL and SASL_SSL listeners (Kafka's ``ssl.*``)."""

    cert_file: Path | None = Field(
        None, description="PEM server certificate (chain) of TLS listeners; reloaded on change."
    )
    key_file: Path | None = Field(None, description="PEM private key of `cert_file`.")
    key_password: SecretStr | None = Field(None, description="Password of an encrypted key.")
    ca_file: Path | None = Field(
        None, description="PEM CA certificates that client certificates must chain to."
    )
    client_auth: ClientAuth = Field(
        ClientAuth.NONE,
        description="ssl.client.auth: `none`, `requested` or `required`; a verified client "
        "certificate's subject becomes the principal (User:CN=...,O=...) unless SASL names one.",
    )
    client_auth_overrides: str = Field(
        "",
        examples=["MTLS:required"],
        description="Per-listener client auth, NAME:VALUE,... (Kafka's "
        "listener.name.<name>.ssl.client.auth), e.g. `MTLS:required`.",
    )
    reload_interval_s: float = Field(
        10.0, gt=0, description="How often the certificate files are checked for changes."
    )


class SaslSettings(_Section):
    enabled_mechanisms: tuple[str, ...] = Field(
        ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"),
        description="sasl.enabled.mechanisms of SASL listeners. PLAIN checks the password "
        "against the SCRAM credentials in etcd (`kafscale users`).",
    )


class AdminSettings(_Section):
    """Who may use the admin HTTP port's ``POST /drain`` and ``GET /status``."""

    token_file: Path | None = Field(
        None,
        description="File holding the bearer token POST /drain and GET /status require "
        "(re-read on each request, so a rotated Secret applies at once). Health and metrics "
        "stay open.",
    )
    allow_remote_without_token: bool = Field(
        False,
        description="Without a token, POST /drain and GET /status answer loopback clients "
        "only; true lets any client use them (the old behaviour).",
    )


class AuthorizerSettings(_Section):
    """ACL authorization (Kafka's ``authorizer.class.name``, ``super.users``,
    ``allow.everyone.if.no.acl.found``); see docs/security.md."""

    enabled: bool = Field(
        False,
        description="Check every request against the ACLs in etcd (off: every client may do "
        "everything, and the ACL APIs answer SECURITY_DISABLED, as Kafka without an authorizer).",
    )
    super_users: tuple[str, ...] = Field(
        (),
        description='Principals allowed everything, ACLs or not, e.g. `["User:admin"]`.',
    )
    allow_everyone_if_no_acl_found: bool = Field(
        False,
        description="Allow a request on a resource no ACL names at all (Kafka's default, "
        "false: deny what no ACL allows).",
    )


class DelegationTokenSettings(_Section):
    """Delegation tokens (KIP-48; Kafka's ``delegation.token.*``); see docs/security.md."""

    secret_key: SecretStr | None = Field(
        None,
        description="delegation.token.secret.key: signs every token (HMAC-SHA512 of its id). "
        "Unset: tokens are off (DELEGATION_TOKEN_AUTH_DISABLED, token logins refused). The "
        "same on every broker and proxy of a cluster; a new key ends every earlier token.",
    )
    max_lifetime_ms: int = Field(
        7 * 24 * 3600 * 1000,
        gt=0,
        description="delegation.token.max.lifetime.ms: no renewal takes a token past this age.",
    )
    expiry_time_ms: int = Field(
        24 * 3600 * 1000,
        gt=0,
        description="delegation.token.expiry.time.ms: a token expires this long after its "
        "creation or last renewal (the default renew period).",
    )
    expiry_check_interval_ms: int = Field(
        3600 * 1000,
        gt=0,
        description="delegation.token.expiry.check.interval.ms: how often a broker deletes "
        "expired tokens from etcd (they stop authenticating at expiry either way).",
    )

    def policy(self) -> TokenPolicy:
        key = self.secret_key.get_secret_value().encode() if self.secret_key else None
        return TokenPolicy(key, self.max_lifetime_ms, self.expiry_time_ms)


INTER_BROKER_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


class InterBrokerSettings(_Section):
    """How this broker connects to other brokers (a transaction coordinator writing markers),
    and as whom: Kafka's ``inter.broker.listener.name`` and ``security.inter.broker.protocol``,
    with the fields of the proxy's ``upstream.*``. Left unset, a broker speaks what its own
    internal listener speaks, with its own certificate (``tls.*``), as Kafka's brokers do."""

    listener: str | None = Field(
        None,
        examples=["PLAINTEXT"],
        description="The other brokers' listener (by name) to connect to; None: the address "
        "they register as their main one (internal_listener_name).",
    )
    security_protocol: SecurityProtocol | None = Field(
        None,
        description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; None: the protocol of that "
        "listener in this broker's own listener_security_protocol_map. The broker's principal "
        "on the others (its certificate's User:<subject>, or User:<sasl_username>) needs "
        "CLUSTER_ACTION on the cluster, or to be a super user, under the authorizer.",
    )
    sasl_mechanism: str = Field(
        "SCRAM-SHA-512",
        examples=["SCRAM-SHA-256"],
        description="SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN (SASL protocols).",
    )
    sasl_username: str | None = Field(None, description="The brokers' own user (SASL).")
    sasl_password: SecretStr | None = Field(None, description="That user's password.")
    ca_file: Path | None = Field(
        None,
        description="PEM CAs the other brokers' certificates must chain to (default: "
        "tls.ca_file, else the system's).",
    )
    cert_file: Path | None = Field(
        None,
        description="PEM client certificate presented to other brokers (default: tls.cert_file, "
        "which then needs the client-auth usage where they require client certificates).",
    )
    key_file: Path | None = Field(
        None, description="PEM private key of `cert_file` (the two go together)."
    )
    check_hostname: bool = Field(
        True, description="Check that a broker's certificate names the host it registered."
    )

    @model_validator(mode="after")
    def _check(self) -> InterBrokerSettings:
        if self.sasl_mechanism not in INTER_BROKER_MECHANISMS:
            raise ValueError(
                f"inter_broker.sasl_mechanism must be one of {INTER_BROKER_MECHANISMS}"
            )
        return self


class BrokerSettings(BaseSettings):
    """Everything one broker process needs to know."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    cluster: str = Field(
        DEFAULT_CLUSTER, description="Cluster name: the etcd and object key prefix."
    )
    listener: ListenerSettings = ListenerSettings()
    etcd: EtcdSettings = EtcdSettings()
    storage: StorageSettings = StorageSettings()
    log: LogSettings = LogSettings()
    limits: LimitSettings = LimitSettings()
    topics: TopicDefaults = TopicDefaults()
    assignment: AssignmentSettings = AssignmentSettings()
    metadata: MetadataSettings = MetadataSettings()
    groups: GroupSettings = GroupSettings()
    transactions: TransactionSettings = TransactionSettings()
    listeners: str | None = Field(
        None,
        examples=["PLAINTEXT://:9092"],
        description="Kafka's `listeners`: NAME://host:port,... (e.g. "
        "`INTERNAL://:9092,EXTERNAL://:9093`); None: one PLAINTEXT listener from "
        "listener.host and listener.port.",
    )
    advertised_listeners: str | None = Field(
        None,
        examples=["PLAINTEXT://kafka.example.com:9092"],
        description="NAME://host:port,... given to clients that connect to listener NAME; "
        "a listener left out advertises its bind address.",
    )
    listener_security_protocol_map: str = Field(
        DEFAULT_PROTOCOL_MAP,
        examples=["PLAINTEXT:PLAINTEXT,EXTERNAL:SASL_SSL"],
        description="NAME:PROTOCOL,... with PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    )
    internal_listener_name: str | None = Field(
        None,
        examples=["PLAINTEXT"],
        description="The listener registered as the broker's main address, which the proxy "
        "connects to (Kafka's inter.broker.listener.name); default: the first.",
    )
    tls: TlsSettings = TlsSettings()
    sasl: SaslSettings = SaslSettings()
    inter_broker: InterBrokerSettings = InterBrokerSettings()
    admin: AdminSettings = AdminSettings()
    authorizer: AuthorizerSettings = AuthorizerSettings()
    delegation_token: DelegationTokenSettings = DelegationTokenSettings()
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
    def _check_listeners(self) -> BrokerSettings:
        plan = self.listener_plan()
        internal_listener(plan, self.internal_listener_name)
        check_listener_tls(plan, self.tls)
        self.inter_broker_protocol()
        return self

    def inter_broker_protocol(self) -> SecurityProtocol:
        """What this broker speaks to the others: set, or that of the listener it connects to
        (by the same name in its own plan, all brokers of a cluster being configured alike)."""
        if self.inter_broker.security_protocol is not None:
            return self.inter_broker.security_protocol
        plan = self.listener_plan()
        name = self.inter_broker.listener or self.internal_listener_name
        try:
            return internal_listener(plan, name).protocol
        except ValueError as exc:
            raise ValueError(f"inter_broker.listener: {exc}") from exc

    def listener_plan(self) -> list[Listener]:
        """Every listener this broker opens, parsed from the settings."""
        return configured_listeners(self)

    def topic_defaults(self) -> dict[str, str]:
        """Topic configs a topic gets unless it sets its own (Kafka's broker-level defaults)."""
        return {**self.topics.as_topic_configs(), "segment.bytes": str(self.log.segment_bytes)}
