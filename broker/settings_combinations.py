"""Settings that mean something only beside another's value: refused, or warned about, at start.

Each setting is valid alone, so the settings models take them; but some apply only when another
setting has a given value, and were otherwise dropped without a word. ``KAFSCALE_STORAGE__KIND=
local`` with ``KAFSCALE_STORAGE__BUCKET`` kept the data in a directory of a user who thought it
in the bucket (in a Kubernetes manifest nobody reads the broker's first log lines); S3
credentials or an endpoint with a local store, a local directory with an S3 store, likewise.

Refused (one line naming both settings, exit status 2) where the ignored setting says where the
data goes or who the process is: the user's picture of the system is wrong. Warned about (one
WARNING line at start) where ignoring it changes nothing the user relies on: a CA file for an
etcd reached over http:// only, SASL credentials for a protocol without SASL, super users with
no authorizer, a remote-access switch beside a token that overrides it.

The one listener's port and advertised address beside ``listeners`` (which replace it) are
refused when the listeners do not open or advertise that value, and warned about when they do.
The Spark source runs the store and etcd rules on its options (``store_combinations``), naming
settings its way (``renamed``); the operator runs all of them on the variables it renders.

Only settings given (a variable or a flag: pydantic's ``model_fields_set``) count: a default
never clashes. The operator's and the chart's generated variables pass (a test holds them to
it). ``kafscale local`` has its own check of its flags (``local_flags``).

Pure: the parsed settings in, the lines out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from kafscale.broker.settings_names import env_name, flag_name
from kafscale.broker.store_settings import (
    EtcdConnectionSettings,
    StorageKind,
    StorageSettings,
)

if TYPE_CHECKING:
    from kafscale.broker.config import AdminSettings, AuthorizerSettings, BrokerSettings
    from kafscale.broker.proxy.config import ProxySettings, UpstreamSettings
    from kafscale.broker.security.listeners import Listener

S3_ONLY = ("bucket", "endpoint", "region", "access_key_id", "secret_access_key")
"""Storage settings an S3 store uses and a local directory ignores."""

ETCD_TLS_FILES = ("ca_file", "cert_file", "key_file")


@dataclass(frozen=True, slots=True)
class Combinations:
    """What a process's settings get at start: ``refused`` stops it (status 2), ``warned``
    is logged once and it goes on."""

    refused: tuple[str, ...] = ()
    warned: tuple[str, ...] = ()


def broker_combinations(settings: BrokerSettings) -> Combinations:
    """The clashes among a broker's settings."""
    listener_refused, listener_warned = listener_clashes(settings)
    return Combinations(
        refused=(
            *storage_refusals(settings.storage),
            *etcd_refusals(settings.etcd),
            *listener_refused,
        ),
        warned=(
            *listener_warned,
            *etcd_warnings(settings.etcd),
            *sasl_warnings(
                ("inter_broker",),
                settings.inter_broker,
                settings.inter_broker_protocol().uses_sasl,
            ),
            *authorizer_warnings(settings.authorizer),
            *admin_warnings(settings.admin),
        ),
    )


def proxy_combinations(settings: ProxySettings) -> Combinations:
    """The clashes among a proxy's settings (it has no store of its own)."""
    upstream: UpstreamSettings = settings.upstream
    listener_refused, listener_warned = listener_clashes(settings)
    return Combinations(
        refused=(*etcd_refusals(settings.etcd), *listener_refused),
        warned=(
            *listener_warned,
            *etcd_warnings(settings.etcd),
            *sasl_warnings(("upstream",), upstream, upstream.security_protocol.uses_sasl),
            *authorizer_warnings(settings.authorizer),
        ),
    )


def store_combinations(storage: StorageSettings, etcd: EtcdConnectionSettings) -> Combinations:
    """The clashes among the settings of a process that reads the store and etcd only (the
    Spark source's connection options)."""
    return Combinations(
        refused=(*storage_refusals(storage), *etcd_refusals(etcd)),
        warned=tuple(etcd_warnings(etcd)),
    )


class _ListenerSettings(Protocol):
    """What the broker's and the proxy's settings share of their listeners."""

    @property
    def listener(self) -> BaseModel: ...

    @property
    def listeners(self) -> str | None: ...

    def listener_plan(self) -> list[Listener]: ...


def listener_clashes(settings: _ListenerSettings) -> tuple[list[str], list[str]]:
    """(refused, warned): ``listener.port``, ``listener.advertised_host`` and
    ``listener.advertised_port`` beside ``listeners``, which replace that one listener: they
    are not used (``listener.host`` is: the admin port binds to it). Refused when the value is
    not what the listeners open or advertise (clients were told another address than the one
    the user gave, or the port given stayed closed); a warning when it is (a redundancy)."""
    if not settings.listeners:
        return [], []
    section = settings.listener
    plan = settings.listener_plan()
    in_use: dict[str, set[object]] = {
        "port": {item.port for item in plan},
        "advertised_port": {item.advertised_port or item.port for item in plan},
        "advertised_host": {item.advertised_host for item in plan if item.advertised_host},
    }
    instead = {
        "port": "the ports of listeners",
        "advertised_port": "the ports of advertised_listeners (or those of listeners)",
        "advertised_host": "the hosts of advertised_listeners (or each listener's bind "
        "address, this machine's name for all interfaces)",
    }
    refused, warned = [], []
    listeners = _named(("listeners",))
    for name, values in in_use.items():
        if name not in section.model_fields_set:
            continue
        value = getattr(section, name)
        setting = _named(("listener", name))
        if value in values:
            warned.append(
                f"{setting} is not used beside {listeners}, which give {value} already: "
                "leave it out"
            )
        else:
            refused.append(
                f"{setting} is not used beside {listeners}: {value} is not among "
                f"{instead[name]} (give it there, or leave it out)"
            )
    return refused, warned


def storage_refusals(storage: StorageSettings) -> list[str]:
    """S3 settings with a local store, a local directory with an S3 store, half a pair of S3
    credentials (boto3 refuses that at the first call, as a traceback)."""
    given = storage.model_fields_set
    kind = _named(("storage", "kind"))
    if storage.kind is StorageKind.LOCAL:
        return [
            f"{_named(('storage', name))} is for an S3 store, but {kind} is local: the store "
            "used would be the directory storage.local_dir, not S3 (set kind s3, or leave it out)"
            for name in S3_ONLY
            if name in given
        ]
    problems = []
    if "local_dir" in given:
        default = "" if "kind" in given else " (the default)"
        problems.append(
            f"{_named(('storage', 'local_dir'))} is for a local store, but {kind} is "
            f"s3{default}: the store used would be the bucket, not the directory (set kind "
            "local, or leave it out)"
        )
    problems.extend(_half_pair(("storage",), storage, "access_key_id", "secret_access_key"))
    return problems


def etcd_refusals(etcd: EtcdConnectionSettings) -> list[str]:
    """Half a login (etcd.username without the password connects without one) or half a
    client certificate (refused at the first connection, later and less clearly)."""
    return [
        *_half_pair(("etcd",), etcd, "username", "password"),
        *_half_pair(("etcd",), etcd, "cert_file", "key_file"),
    ]


def etcd_warnings(etcd: EtcdConnectionSettings) -> list[str]:
    """TLS files for an etcd reached over http:// only: never read. Harmless (an https-only
    etcd would not answer at all), but the user meant https."""
    if any(endpoint.startswith("https://") for endpoint in etcd.endpoints):
        return []
    return [
        f"{_named(('etcd', name))} is used only for https:// endpoints, and "
        f"{_named(('etcd', 'endpoints'))} are all http://: it is not read"
        for name in ETCD_TLS_FILES
        if name in etcd.model_fields_set
    ]


def sasl_warnings(section: tuple[str, ...], settings: BaseModel, uses_sasl: bool) -> list[str]:
    """SASL credentials for a connection that speaks no SASL: not sent."""
    if uses_sasl:
        return []
    protocol = _named((*section, "security_protocol"))
    return [
        f"{_named((*section, name))} is used only with a SASL protocol, and {protocol} is not "
        "one: it is not sent"
        for name in ("sasl_username", "sasl_password")
        if name in settings.model_fields_set
    ]


def authorizer_warnings(authorizer: AuthorizerSettings) -> list[str]:
    """Super users (or the no-ACL rule) with the authorizer off: everyone may do everything."""
    if authorizer.enabled:
        return []
    enabled = _named(("authorizer", "enabled"))
    return [
        f"{_named(('authorizer', name))} applies only with {enabled} true, and it is off: "
        "every client may do everything"
        for name in ("super_users", "allow_everyone_if_no_acl_found")
        if name in authorizer.model_fields_set
    ]


def admin_warnings(admin: AdminSettings) -> list[str]:
    """A remote-access switch beside a token file: the token is required anyway."""
    if admin.token_file is None or "allow_remote_without_token" not in admin.model_fields_set:
        return []
    return [
        f"{_named(('admin', 'allow_remote_without_token'))} applies only without "
        f"{_named(('admin', 'token_file'))}, which is set: the token is required"
    ]


def _half_pair(section: tuple[str, ...], settings: BaseModel, first: str, second: str) -> list[str]:
    given = settings.model_fields_set
    if (first in given) == (second in given):
        return []
    have, lack = (first, second) if first in given else (second, first)
    return [
        f"{_named((*section, have))} is set without {_named((*section, lack))}: "
        "give both or neither"
    ]


def _named(path: tuple[str, ...]) -> str:
    return f"{env_name(path)} ({flag_name(path)})"


_NAMED = re.compile(r"KAFSCALE_([A-Z0-9_]+) \(--[a-z0-9-]+\)")
"""A setting as the lines above name it (variable and flag)."""


def renamed(line: str, name_of: Callable[[tuple[str, ...]], str]) -> str:
    """``line`` with each setting named by ``name_of(path)`` instead of variable and flag: in
    the terms of where the user gave it (a Spark option, a key of ``spec.brokers.config``)."""
    return _NAMED.sub(lambda match: name_of(tuple(match[1].lower().split("__"))), line)
