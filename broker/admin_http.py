"""The broker's small HTTP endpoint for Kubernetes: probes and the preStop drain hook.

``GET /healthz`` (liveness: the event loop answers), ``GET /readyz`` (readiness: registered and
serving), ``POST /drain`` (hand every partition over, then answer; the pod may then stop),
``GET /status`` (JSON: node id, owned partitions, segment cache), ``GET /metrics``
(Prometheus text format). Plain asyncio, no web framework: five routes do not justify a
dependency.

``POST /drain`` and ``GET /status`` are guarded (:class:`AdminGuard`): with a token file they
need ``Authorization: Bearer <token>``; without one they answer loopback clients only (the
preStop hook runs inside the pod), unless the operator of the broker opts out. The port itself
stays on the listener's address, so the kubelet's probes (which come from outside the pod) and
metrics scrapers keep working: every other route is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafscale.broker.observability.exposition import CONTENT_TYPE

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AdminRoutes:
    is_ready: Callable[[], bool]
    drain: Callable[[], Awaitable[None]]
    status: Callable[[], dict[str, object]]
    metrics: Callable[[], bytes] | None = None


GUARDED_ROUTES = frozenset({("POST", "/drain"), ("GET", "/status")})


@dataclass(frozen=True, slots=True)
class AdminGuard:
    """Who may use the guarded routes: bearer token holders, else loopback clients."""

    token_file: Path | None = None
    allow_remote_without_token: bool = False

    def check(self, peer_host: str, authorization: str | None) -> tuple[int, str] | None:
        """None if allowed, else (HTTP status, reason)."""
        if self.token_file is None:
            if self.allow_remote_without_token or is_loopback(peer_host):
                return None
            return 403, "no admin token is configured: only loopback clients may do this"
        try:
            token = self.token_file.read_text().strip()
        except OSError as exc:
            log.error("cannot read the admin token file: %s", exc)
            return 503, "the admin token file cannot be read"
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not token or not given or not hmac.compare_digest(given.encode(), token.encode()):
            return 401, "a valid bearer token is required"
        return None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


class AdminServer:
    def __init__(
        self, routes: AdminRoutes, host: str, port: int, guard: AdminGuard | None = None
    ) -> None:
        self._routes = routes
        self._guard = guard or AdminGuard()
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self._host, self._port, reuse_address=True
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(60):
                request_line = await reader.readline()
                headers = await _read_headers(reader)
                method, path = _parse_request_line(request_line)
                refused: tuple[int, str] | None = None
                body: dict[str, object]
                if (method, path) in GUARDED_ROUTES:
                    peer = writer.get_extra_info("peername")
                    peer_host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
                    refused = self._guard.check(peer_host, headers.get("authorization"))
                if refused is not None:
                    _respond(writer, refused[0], {"error": refused[1]})
                elif method == "GET" and path == "/metrics" and self._routes.metrics is not None:
                    self._respond_metrics(writer, self._routes.metrics)
                else:
                    status, body = await self._route(method, path)
                    _respond(writer, status, body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    @staticmethod
    def _respond_metrics(writer: asyncio.StreamWriter, render: Callable[[], bytes]) -> None:
        """The metrics page, or a 500 naming the failure (a scrape never kills the endpoint)."""
        try:
            payload = render()
        except Exception as exc:
            log.exception("rendering /metrics failed")
            _respond(writer, 500, {"error": f"metrics: {exc}"})
            return
        _respond_text(writer, payload)

    async def _route(self, method: str, path: str) -> tuple[int, dict[str, object]]:
        if method == "GET" and path == "/healthz":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/readyz":
            ready = self._routes.is_ready()
            return (200 if ready else 503), {"ready": ready}
        if method == "POST" and path == "/drain":
            await self._routes.drain()
            return 200, {"drained": True}
        if method == "GET" and path == "/status":
            return 200, self._routes.status()
        return 404, {"error": f"no route {method} {path}"}


_MAX_HEADERS = 100


async def _read_headers(reader: asyncio.StreamReader) -> dict[str, str]:
    """The request's headers, names lower-cased (at most ``_MAX_HEADERS`` lines)."""
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADERS):
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            return headers
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    raise ValueError("too many headers")


def _parse_request_line(line: bytes) -> tuple[str, str]:
    parts = line.decode("latin-1").split()
    if len(parts) < 2:
        raise ValueError("bad request line")
    return parts[0].upper(), parts[1].split("?", 1)[0]


def _respond(writer: asyncio.StreamWriter, status: int, body: dict[str, object]) -> None:
    payload = json.dumps(body).encode()
    reason = {
        200: "OK",
        401: "Unauthorized",
        403: "Forbidden",
        404: "Not Found",
        500: "Internal Server Error",
        503: "Service Unavailable",
    }.get(status, "OK")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)


def _respond_text(writer: asyncio.StreamWriter, payload: bytes) -> None:
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)


def admin_request(
    base_url: str, method: str, path: str, timeout_s: float = 10, token: str | None = None
) -> tuple[int, Any]:
    """(status, JSON body) of a call to a broker's admin endpoint: ``kafscale drain``, the test
    harness and the benches all talk to it through this one client. Raises OSError when the
    broker cannot be reached."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(base_url.rstrip("/") + path, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def read_token(token_file: str | None) -> str | None:
    """The admin token in ``token_file`` (None: no file given)."""
    if not token_file:
        return None
    return Path(token_file).read_text().strip()
