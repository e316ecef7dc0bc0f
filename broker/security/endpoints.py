"""The server endpoints of a listener plan: each listener with its TLS context and the SASL
mechanisms it offers. The broker's and the proxy's listeners are opened from the same function,
in a module of its own so that the proxy need not import the broker's wiring (``app.py``)."""

from __future__ import annotations

import ssl

from kafscale.broker.config import TlsSettings
from kafscale.broker.security.listeners import Listener
from kafscale.broker.security.tls import server_context
from kafscale.broker.server import ServerEndpoint


def listener_endpoints(
    plan: list[Listener], tls: TlsSettings, sasl_mechanisms: tuple[str, ...]
) -> tuple[list[ServerEndpoint], list[ssl.SSLContext]]:
    """``server_endpoints`` for any listener plan: the broker's, or the proxy's."""
    contexts: dict[object, ssl.SSLContext] = {}
    endpoints = []
    for listener in plan:
        context = None
        if listener.protocol.uses_tls:
            context = contexts.get(listener.client_auth)
            if context is None:
                context = server_context(tls, listener.client_auth)
                contexts[listener.client_auth] = context
        mechanisms = sasl_mechanisms if listener.protocol.uses_sasl else ()
        endpoints.append(ServerEndpoint(listener, context, tuple(mechanisms)))
    return endpoints, list(contexts.values())
