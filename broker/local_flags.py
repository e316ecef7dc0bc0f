"""Flags ``kafscale local`` would take and then ignore: refused before anything starts.

``kafscale local`` takes every broker flag, but sets some settings itself (the brokers' address
and ports, the etcd endpoints) and keeps objects in ``<data-dir>/objects`` unless it has an S3
endpoint. A flag for one of those was accepted and dropped without a word: ``--bucket b``
without ``--s3-endpoint`` (the README even said "``--bucket`` alone is ignored") left the
data on the local disk of a user who thought it in S3; ``--etcd-endpoints`` started a cluster
of its own beside the user's etcd; ``--brokers 0`` ended in a traceback. Each is now one line
saying what to give instead, and exit status 2, like any other configuration mistake.

Only flags are checked: they were typed for this command. ``KAFSCALE_*`` variables are shared
with ``kafscale broker``, ``proxy`` and ``status`` run from the same shell, so a variable
``local`` overrides stays allowed (the README lists what it sets itself).

Pure: the flags given (as ``overrides_from_args`` nests them) and the settings in effect in,
the problems out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.settings_cli import flag_name
from kafscale.broker.store_settings import StorageKind, StorageSettings

MAX_PORT = 65535

S3_ONLY = ("bucket", "region", "access_key_id", "secret_access_key", "endpoint")
"""Storage settings that matter only for an S3 store."""

SET_BY_LOCAL: dict[tuple[str, ...], str] = {
    ("listener", "port"): "the first broker (or, with --proxy, the proxy) listens on --port "
    "and the brokers on the ports after it: give --port",
    ("listener", "host"): "the brokers (and the proxy) bind to --host: give --host",
    ("etcd", "endpoints"): "it runs an etcd of its own (the banner prints its address); to "
    "join an existing etcd run `kafscale broker` (and `kafscale proxy`) instead",
}
"""Broker settings ``kafscale local`` sets itself, and what to give instead."""


@dataclass(frozen=True, slots=True)
class LocalFlags:
    """What was typed after ``kafscale local``."""

    given: Mapping[str, Any]
    """The settings flags given, nested (``{"storage": {"bucket": "b"}}``)."""
    bucket: str | None = None
    s3_endpoint: str | None = None
    brokers: int = 1
    port: int = 9092
    proxy: bool = False
    host: str = "127.0.0.1"
    port_given: bool = False
    """``--port`` was typed (not its default)."""
    host_given: bool = False


def ignored_flags(flags: LocalFlags, storage: StorageSettings) -> list[str]:
    """One line per flag ``kafscale local`` would ignore or cannot honour; ``storage`` is the
    storage section in effect (variables and flags)."""
    return [
        *_cluster_shape(flags),
        *_set_by_local(flags.given),
        *_storage_flags(flags, storage),
    ]


ALL_INTERFACES = frozenset({"0.0.0.0", "::", ""})


def listener_flag_clashes(
    flags: LocalFlags, listeners: Sequence[tuple[str, int]]
) -> tuple[list[str], list[str]]:
    """(refused, warned) for ``--port`` and ``--host`` beside ``--listeners`` (``listeners``:
    their (host, port), none without them). The listeners replace the one listener those
    two place: the broker (with ``--proxy``, the proxy) listens on the listeners' ports only,
    and without ``--proxy`` the broker binds their hosts, ``--host`` only its admin port.
    A value the listeners do not have is refused (the user's address stays closed); one they
    have is a warning without ``--proxy`` (with it ``--port`` places the brokers after it and
    ``--host`` binds them: both are used)."""
    if not listeners:
        return [], []
    refused, warned = [], []
    ports = sorted({port for _, port in listeners})
    who = "the proxy listens" if flags.proxy else "the broker listens"
    if flags.port_given and flags.port not in ports:
        refused.append(
            f"--port {flags.port} is not used with --listeners: {who} on their ports "
            f"({', '.join(map(str, ports))}) (give the port there, or leave --port out)"
        )
    elif flags.port_given and not flags.proxy:
        warned.append(f"--port {flags.port} is not needed with --listeners, which open it")
    if not flags.host_given or flags.proxy:
        return refused, warned
    hosts = sorted({_bind_host(host) for host, _ in listeners})
    if _bind_host(flags.host) not in hosts:
        refused.append(
            f"--host {flags.host} is not used with --listeners: the broker binds their hosts "
            f"({', '.join(hosts)}), --host only its admin port (give the host there, or "
            "leave --host out)"
        )
    else:
        warned.append(f"--host {flags.host} is not needed with --listeners, which bind it")
    return refused, warned


def _bind_host(host: str) -> str:
    return "0.0.0.0" if host in ALL_INTERFACES else host


def _cluster_shape(flags: LocalFlags) -> list[str]:
    problems = []
    if flags.brokers < 1:
        problems.append(f"--brokers must be at least 1 (given {flags.brokers})")
    last_port = flags.port + max(flags.brokers, 1) - 1 + (1 if flags.proxy else 0)
    if flags.port < 1 or last_port > MAX_PORT:
        problems.append(
            f"--port {flags.port}: the {'proxy and ' if flags.proxy else ''}brokers listen on "
            f"--port and the ports after it, which must lie within 1-{MAX_PORT}"
        )
    return problems


def _set_by_local(given: Mapping[str, Any]) -> list[str]:
    return [
        f"{flag_name(path)} is not used by kafscale local: {instead}"
        for path, instead in SET_BY_LOCAL.items()
        if _was_given(given, path)
    ]


def _storage_flags(flags: LocalFlags, storage: StorageSettings) -> list[str]:
    """Flags for the other kind of store than the one ``kafscale local`` will use: S3 flags
    without an S3 endpoint (the store is then ``<data-dir>/objects``, or the local directory
    asked for), a local directory with an S3 store."""
    uses_s3 = storage.kind is StorageKind.S3 and storage.endpoint is not None
    if uses_s3:
        if _was_given(flags.given, ("storage", "local_dir")):
            return ["--storage-local-dir is not used with an S3 store (--s3-endpoint)"]
        return []
    where = (
        "in a directory (--storage-kind local)"
        if storage.kind is StorageKind.LOCAL
        else "in a directory (<data-dir>/objects)"
    )
    problems = []
    if flags.bucket is not None and flags.s3_endpoint is None:
        problems.append(
            f"--bucket needs --s3-endpoint: without one kafscale local keeps its data {where}, "
            "not in a bucket (give the S3 endpoint URL too, or leave --bucket out)"
        )
    s3_flags = [("storage", name) for name in S3_ONLY]
    if storage.kind is StorageKind.S3:
        s3_flags.append(("storage", "kind"))  # --storage-kind s3 without an endpoint
    for path in s3_flags:
        if _was_given(flags.given, path):
            problems.append(
                f"{flag_name(path)} is for an S3 store, and kafscale local keeps its data "
                f"{where}: give --s3-endpoint (and --bucket) for S3, or leave it out"
            )
    if storage.kind is StorageKind.S3 and _was_given(flags.given, ("storage", "local_dir")):
        problems.append(
            "--storage-local-dir is used with --storage-kind local; otherwise kafscale local "
            "keeps its data in <data-dir>/objects (give --data-dir)"
        )
    return problems


def _was_given(given: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = given
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True
