"""The proxy process: etcd watches, the Kafka listener, the admin endpoint, and their order.

Start-up fails closed: etcd must answer (the proxy has nothing to route by without it) and the
listener must bind. ``/readyz`` turns ready once the routing tables are loaded and some broker
is registered; ``GET /status`` shows the routes, the upstream connections and the retries.
Shutdown: report not ready, stop accepting, let requests in flight finish under the grace
period, then close upstream connections and the watches.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Any

from kafscale.broker.admin_http import AdminRoutes, AdminServer
from kafscale.broker.api.configs import listener_values
from kafscale.broker.api.fetch_sessions import FetchSessionCache
from kafscale.broker.api.sasl import token_lookup
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_connect import connect_etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.exposition import metrics_renderer
from kafscale.broker.observability.hot_path_collector import HotPathCollector
from kafscale.broker.observability.logs import set_node_id
from kafscale.broker.observability.proxy_metrics import ProxyCollector
from kafscale.broker.protocol import codec
from kafscale.broker.proxy.access import ProxyAccess
from kafscale.broker.proxy.answers import Identity
from kafscale.broker.proxy.config import ProxySettings
from kafscale.broker.proxy.dispatch import ProxyDispatcher
from kafscale.broker.proxy.forward import Forwarder
from kafscale.broker.proxy.handlers import ProxyContext
from kafscale.broker.proxy.login import SaslLogin
from kafscale.broker.proxy.routes import RoutingTable
from kafscale.broker.proxy.upstream import UpstreamLink, UpstreamPool, UpstreamStats
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.endpoints import listener_endpoints
from kafscale.broker.security.forwarding import address_bytes, peer_host
from kafscale.broker.security.listeners import advertised_address
from kafscale.broker.security.tls import (
    CertificateReloader,
    ClientCertificateReloader,
    TlsConfigError,
    client_context,
)
from kafscale.broker.security.token_store import TokenStore
from kafscale.broker.server import ByteBudget, Connection, KafkaServer, ServerEndpoint
from kafscale.broker.startup_error import StartupError
from kafscale.broker.stop_budget import left_s
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)


class ProxyServer(KafkaServer):
    """The broker's listeners and per-connection pipeline (TLS and SASL included), with an
    upstream pool per client connection (closed with it) and a proxy-wide bound on request
    bytes in flight."""

    def __init__(self, proxy: Proxy, endpoints: list[ServerEndpoint]) -> None:
        settings = proxy.settings
        self._pools: dict[int, UpstreamPool] = {}
        self._proxy = proxy
        self._budget = ByteBudget(settings.routing.max_buffered_bytes)
        dispatcher = ProxyDispatcher(lambda: proxy.context, self.pool_of)

        async def dispatch(frame: Any, connection: Connection) -> bytes | None:
            size = len(frame)
            await self._budget.take(size)
            try:
                return await dispatcher(frame, connection)
            finally:
                self._budget.give(size)

        first = endpoints[0].listener
        super().__init__(
            dispatch,
            settings.limits,
            first.host,
            first.port,
            on_closed=self._close_pool,
            endpoints=endpoints,
        )

    def pool_of(self, connection: Connection) -> UpstreamPool:
        pool = self._pools.get(id(connection))
        if pool is None:
            settings = self._proxy.settings
            pool = self._pools[id(connection)] = UpstreamPool(
                settings.routing.connect_timeout_s,
                settings.limits.max_frame_bytes,
                self._proxy.stats,
                lambda: self._proxy.link_for(connection),
            )
        return pool

    async def _close_pool(self, connection: Connection) -> None:
        pool = self._pools.pop(id(connection), None)
        if pool is not None:
            await pool.close()

    @property
    def client_connections(self) -> int:
        return len(self._connections)

    @property
    def share_sessions(self) -> int:
        """Share sessions (KIP-932) the clients hold at the proxy; each ends with its
        connection at the latest."""
        return sum(len(pool.share_sessions.sessions) for pool in self._pools.values())


class Proxy:
    def __init__(self, settings: ProxySettings, etcd: Etcd, routes: RoutingTable) -> None:
        self.settings = settings
        self.etcd = etcd
        self.routes = routes
        self.stats = UpstreamStats()
        self.sessions = FetchSessionCache(settings.limits.fetch_sessions)
        self.forwarder = Forwarder(routes, settings.routing, self.stats)
        self.context = ProxyContext(self.forwarder, self.sessions, Identity(0, "", 0, ""))
        self.server: ProxyServer | None = None
        self.admin: AdminServer | None = None
        self._stopping = False
        self._upstream_tls: ssl.SSLContext | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def link_for(self, connection: Connection) -> UpstreamLink:
        """How this client's requests go to the brokers: over the proxy's TLS, in an Envelope
        carrying the client's principal and address (unless forwarding principals is off)."""
        upstream = self.settings.upstream
        principal = None
        if upstream.forward_principals:
            principal = codec.encode_principal(connection.principal, connection.token_authenticated)
        return UpstreamLink(
            self._upstream_tls,
            principal,
            address_bytes(peer_host(connection.peer)),
            upstream_login(self.settings),
            upstream.listener.upper() if upstream.listener else None,
        )

    @classmethod
    async def start(cls, settings: ProxySettings) -> Proxy:
        try:
            etcd = await connect_etcd(settings.etcd)
        except MetadataUnavailable as exc:
            raise StartupError(f"etcd is not reachable: {exc}") from exc
        routes = RoutingTable(etcd, settings.cluster)
        try:
            await routes.start()
        except MetadataUnavailable as exc:
            await etcd.close()
            raise StartupError(f"cannot load routes from etcd: {exc}") from exc
        proxy = cls(settings, etcd, routes)
        await proxy._listen()
        return proxy

    async def _listen(self) -> None:
        settings = self.settings
        listener = settings.listener
        plan = settings.listener_plan()
        try:
            endpoints, contexts = listener_endpoints(
                plan, settings.tls, settings.sasl.enabled_mechanisms
            )
            self._upstream_tls = upstream_context(settings)
        except TlsConfigError as exc:
            await self._close_clients()
            raise StartupError(str(exc)) from exc
        self.server = ProxyServer(self, endpoints)
        try:
            await self.server.start()
        except OSError as exc:
            await self._close_clients()
            names = ", ".join(f"{e.listener.host}:{e.listener.port}" for e in endpoints)
            raise StartupError(f"cannot listen on {names}: {exc}") from exc
        if contexts:
            reloader = CertificateReloader(settings.tls, contexts)
            self._tasks.append(start_task(reloader.run(), name="tls-reload"))
        upstream_reloader = upstream_certificate_reloader(settings, self._upstream_tls)
        if upstream_reloader is not None:
            self._tasks.append(start_task(upstream_reloader.run(), name="upstream-tls-reload"))
        ports = self.server.ports
        identities = {
            item.name: Identity(
                listener.node_id,
                *advertised_address(item, ports[item.name], socket.getfqdn),
                settings.cluster,
                settings.routing.expose_owners,
            )
            for item in plan
        }
        self.context = ProxyContext(
            self.forwarder,
            self.sessions,
            identities[plan[0].name],
            identities,
            ProxyAccess(settings.authorizer, self.routes.view.acls),
            CredentialStore(self.etcd, settings.cluster).get,
            settings.transactions.protocol_version,
            listener_values(
                plan,
                plan[0].name,
                [(name, me.host, me.port) for name, me in identities.items()],
                ports,
            ),
            token_lookup(
                settings.delegation_token.policy(), TokenStore(self.etcd, settings.cluster)
            ),
            forwards_principals=settings.upstream.forward_principals,
        )
        routes = AdminRoutes(
            is_ready=self.is_ready,
            drain=_nothing,
            status=self.status,
            metrics=metrics_renderer(HotPathCollector(proxy=True), ProxyCollector(self)),
        )
        self.admin = AdminServer(routes, listener.host, listener.admin_port)
        try:
            await self.admin.start()
        except OSError as exc:  # a broker's or another proxy's admin port (both 8080)
            await self.server.close(0)
            await self._close_clients()
            raise StartupError(f"cannot listen on admin port {listener.admin_port}: {exc}") from exc
        set_node_id(listener.node_id)
        for item in plan:
            me = identities[item.name]
            log.info(
                "proxy listening on %s %s:%d %s (advertised %s:%d as node %d)",
                item.name,
                item.host,
                ports[item.name],
                item.protocol,
                me.host,
                me.port,
                listener.node_id,
            )
        log.info("proxy admin on %d", self.admin.port)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    def is_ready(self) -> bool:
        """``/readyz``: routes loaded, not stopping, and the cluster view follows etcd (one
        that cannot routes to owners that may have moved, without an error to show for it)."""
        return not self._stopping and self.routes.ready and self.routes.view.following

    def status(self) -> dict[str, object]:
        routes = self.routes
        view = routes.view
        partitions: dict[str, int] = {}
        for tp in view.partitions():
            owner = routes.partition_owner(tp)
            partitions[f"{tp[0]}/{tp[1]}"] = owner
        return {
            "ready": self.is_ready(),
            "cluster_view_following": view.following,
            "cluster_view_stopped": view.health.stopped_parts(),
            "node_id": self.settings.listener.node_id,
            "advertised": f"{self.context.identity.host}:{self.context.identity.port}",
            "brokers": {
                str(b.node_id): f"{b.host}:{b.port}"
                for b in sorted(view.brokers.values(), key=lambda b: b.node_id)
            },
            "draining": sorted(view.draining),
            "routes": {"partitions": partitions, "groups": dict(routes.groups.owners)},
            "client_connections": self.server.client_connections if self.server else 0,
            "upstream": {
                "open": self.stats.open,
                "opened": self.stats.opened,
                "connect_failures": self.stats.failed,
                "requests": self.stats.requests,
            },
            "retries": dict(self.stats.retries),
            "stale_routes": {
                "checks": routes.stale_checks,
                "corrections": routes.stale_corrections,
            },
            "fetch_sessions": len(self.sessions),
            "share_sessions": self.server.share_sessions if self.server else 0,
        }

    async def stop_accepting(self) -> None:
        """Take no new client connection (and report not ready); those open go on."""
        self._stopping = True
        if self.server is not None:
            await self.server.stop_accepting()

    async def shutdown(self, began_at: float | None = None) -> None:
        """Stop accepting, let the requests already read finish until ``limits.shutdown_grace_s``
        after ``began_at`` (the event loop's time of the stop signal; now if None), then close.
        ``kafscale local`` passes its signal's time, so the proxy and its brokers share one
        grace rather than each taking a whole one in turn."""
        self._stopping = True
        loop = asyncio.get_running_loop()
        start_s = loop.time() if began_at is None else began_at
        if self.server is not None:
            await self.server.close(
                left_s(start_s + self.settings.limits.shutdown_grace_s, loop.time())
            )
        if self.admin is not None:
            await self.admin.close()
        await self._close_clients()
        log.info("proxy stopped")

    async def _close_clients(self) -> None:
        """End the background tasks, the routes' etcd watches and the etcd client."""
        # Each cancelled until it ends: a task that lost one cancellation inside a library
        # (etcd answering again in that very step) kept a single cancel-and-gather waiting.
        await asyncio.gather(*(cancel_and_wait(task) for task in self._tasks))
        await self.routes.close()
        await self.etcd.close()


def upstream_context(settings: ProxySettings) -> ssl.SSLContext | None:
    """The TLS context of the proxy's connections to the brokers (None: PLAINTEXT)."""
    upstream = settings.upstream
    if not upstream.security_protocol.uses_tls:
        return None
    return client_context(
        upstream.ca_file, upstream.cert_file, upstream.key_file, upstream.check_hostname
    )


def upstream_certificate_reloader(
    settings: ProxySettings, context: ssl.SSLContext | None
) -> ClientCertificateReloader | None:
    """Keeps the upstream context on the current files (checked every
    ``tls.reload_interval_s``): on Kubernetes the operator renews the proxy's client
    certificate before it expires, and brokers would refuse the old one once it does."""
    upstream = settings.upstream
    if context is None or (upstream.cert_file is None and upstream.ca_file is None):
        return None
    return ClientCertificateReloader(
        context,
        upstream.ca_file,
        upstream.cert_file,
        upstream.key_file,
        settings.tls.reload_interval_s,
    )


def upstream_login(settings: ProxySettings) -> SaslLogin | None:
    """The proxy's own SASL login to the brokers (None unless a SASL protocol is set)."""
    upstream = settings.upstream
    if not upstream.security_protocol.uses_sasl:
        return None
    assert upstream.sasl_username is not None and upstream.sasl_password is not None
    return SaslLogin(
        upstream.sasl_mechanism,
        upstream.sasl_username,
        upstream.sasl_password.get_secret_value(),
    )


async def _nothing() -> None:
    """POST /drain: the proxy holds no leases; its clients move when its pod goes."""
    await asyncio.sleep(0)
