"""How the adapter reaches one etcd member: endpoint parsing, TLS files, the gRPC channel.

``http(s)://host:port`` endpoints (``BadEndpoint`` for one that can never work, so start-up
fails with a clear message), the CA, client certificate and key of ``https://`` endpoints, and
an aetcd client per member with our channel options (fast reconnects, keepalive pings, large
reads). aetcd 1.0 only opens plaintext channels; ``_Client`` adds TLS.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc

from kafscale.broker.metadata.etcd_watcher import MatchedWatcher

# gRPC channel options: reconnect within ~1 s after an etcd restart (the default backoff grows
# to two minutes), detect a dead peer on an idle watch stream (etcd allows pings every >= 5 s),
# and accept large prefix reads (the default limit is 4 MiB).
#
# Despite its name, gRPC reads ``min_reconnect_backoff_ms`` as the least time one connection
# attempt (TCP and the HTTP/2 handshake) may take: it is gRPC's default of 20 s, not the 50 ms
# this once was. At 50 ms (gRPC makes that 100 ms) an etcd or a client that was slow to send its
# SETTINGS frame on a loaded node failed the attempt, and with it every call waiting on the
# channel at once, well inside ``timeout_s`` ("connection attempt timed out before receiving
# SETTINGS frame"): a CLI command, a start-up or a test set-up failed on a pause of 0.1 s.
# The calls' own deadline (``timeout_s``) bounds how long anyone waits for a connection.
_CHANNEL_OPTIONS: dict[str, int] = {
    "grpc.initial_reconnect_backoff_ms": 50,
    "grpc.min_reconnect_backoff_ms": 20_000,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_receive_message_length": 256 * 1024 * 1024,
}


# Watch streams ask for a member that has a leader (etcd's "require leader" metadata, as
# Kubernetes' apiserver sends): a member cut off from its peers then refuses the watch, or ends
# it once it has lost its leader, instead of keeping it open and silent. It cannot help with a
# frozen member (that answers nothing); ``watch_progress`` finds those.
_REQUIRE_LEADER = ("hasleader", "true")


class BadEndpoint(ValueError):
    """An endpoint that is not ``http(s)://host:port``, or ``https`` without what TLS needs."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    url: str
    host: str
    port: int
    secure: bool


def parse_endpoint(endpoint: str) -> Endpoint:
    """``http://host:port``, ``https://host:port`` or ``host:port`` (http); port 2379 if none."""
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    try:
        port = parts.port or 2379
    except ValueError as exc:
        raise BadEndpoint(f"etcd endpoint {endpoint!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadEndpoint(f"etcd endpoint {endpoint!r} is not http(s)://host:port")
    return Endpoint(endpoint, parts.hostname, port, parts.scheme == "https")


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    parsed = parse_endpoint(endpoint)
    return parsed.host, parsed.port


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """Files for ``https://`` endpoints: the CA that signed the members' certificates (None:
    the system's), and a client certificate and key where etcd asks for one."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        def read(path: Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        if (self.cert_file is None) != (self.key_file is None):
            raise BadEndpoint("etcd TLS: give both a client certificate and its key, or neither")
        try:
            return grpc.ssl_channel_credentials(
                read(self.ca_file), read(self.key_file), read(self.cert_file)
            )
        except OSError as exc:
            raise BadEndpoint(f"etcd TLS: cannot read {exc.filename}: {exc.strerror}") from exc


class _Client(aetcd.Client):  # type: ignore[misc]
    """aetcd's client with a TLS channel where the endpoint is ``https`` (aetcd 1.0 only opens
    plaintext channels) and our ``MatchedWatcher`` (aetcd's own hands a timed-out watch
    creation's late answer to the next creation: ``etcd_watcher``), whose stream requires a
    leader. ``connect`` follows
    aetcd's own, with those two swapped."""

    def __init__(self, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True  # type: ignore[has-type]
            target = f"{self._host}:{self._port}"
            options = self._options.items()
            if self._credentials is None:
                self.channel = rpc.insecure_channel(target, options=options)
            else:
                self.channel = rpc.secure_channel(target, self._credentials, options=options)
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", response.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = MatchedWatcher(
                rpc.WatchStub(self.channel),
                timeout=self._timeout,
                metadata=(*(self.metadata or ()), _REQUIRE_LEADER),
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def make_client(
    endpoint: Endpoint,
    timeout_s: float,
    username: str | None,
    password: str | None,
    tls: EtcdTls | None,
) -> aetcd.Client:
    credentials = (tls or EtcdTls()).credentials() if endpoint.secure else None
    return _Client(
        credentials,
        host=endpoint.host,
        port=endpoint.port,
        username=username,
        password=password,
        timeout=timeout_s,
        options=_CHANNEL_OPTIONS,
    )
