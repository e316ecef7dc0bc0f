"""Entry point of the operator process: ``kafscale operator`` calls :func:`run_operator`.

:func:`operate` is the asyncio form (tests run it in-process with their own stop flag).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer

import kopf
import prometheus_client

from kafscale.operator.handlers import register
from kafscale.operator.metrics import OperatorMetrics
from kafscale.operator.settings import OperatorSettings


def build_registry(
    settings: OperatorSettings, metrics: OperatorMetrics | None = None
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    register(registry, settings, metrics or OperatorMetrics())
    return registry


async def operate(
    settings: OperatorSettings,
    *,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal arrives), serving its metrics
    on ``settings.metrics_port`` meanwhile (0: not served)."""
    namespaces: dict[str, Any] = (
        {"namespaces": list(settings.namespaces)} if settings.namespaces else {"clusterwide": True}
    )
    metrics = OperatorMetrics()
    server = start_metrics_server(settings.metrics_port, metrics) if settings.metrics_port else None
    try:
        await kopf.operator(
            registry=build_registry(settings, metrics),
            standalone=True,  # one active replica per Deployment; no peering resources needed
            liveness_endpoint=settings.liveness_endpoint,
            memo=kopf.Memo(),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            **namespaces,
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def run_operator(settings: OperatorSettings | None = None) -> None:
    """Parse the settings from the environment (unless given) and run until signalled."""
    settings = settings or OperatorSettings()
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency, but optional here
        runner = asyncio.run
    runner(operate(settings))


def start_metrics_server(port: int, metrics: OperatorMetrics, host: str = "0.0.0.0") -> WSGIServer:
    """Serve ``metrics`` (handler runs, clusters, and the process's CPU, memory and garbage
    collection) on ``GET /metrics`` from a thread of its own; ``server_port`` is the bound
    port (``port`` 0 picks one)."""
    try:
        server, _thread = prometheus_client.start_http_server(
            port, addr=host, registry=metrics.registry
        )
    except OSError as exc:
        raise OSError(f"cannot listen on the metrics port {host}:{port}: {exc}") from exc
    return server
