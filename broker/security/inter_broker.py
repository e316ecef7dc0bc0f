"""The broker's own connections to other brokers: over the listener and security they serve.

A transaction coordinator sends WriteTxnMarkers to each partition's owner. Those connections are
the proxy's connections to brokers (:class:`~kafscale.broker.proxy.upstream.UpstreamLink`: TLS
with a client certificate, a SASL login, or neither), made from ``inter_broker.*``; a setting
left unset follows the broker's own internal listener and certificate, so a cluster whose
brokers share one certificate (the operator's) needs no more than that certificate allowing
client authentication and its principal being a super user.
"""

from __future__ import annotations

import ssl

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.login import SaslLogin
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.security.tls import TlsConfigError, client_context


def uses_own_certificate(settings: BrokerSettings) -> bool:
    """Whether the inter-broker TLS context loads the broker's ``tls.*`` files (then the
    certificate reloader keeps it current with the listeners' contexts)."""
    inter = settings.inter_broker
    return (
        settings.inter_broker_protocol().uses_tls
        and inter.cert_file is None
        and settings.tls.cert_file is not None
        and (inter.ca_file is None or inter.ca_file == settings.tls.ca_file)
    )


def inter_broker_context(settings: BrokerSettings) -> ssl.SSLContext | None:
    """The TLS context toward other brokers (None: their listener is not TLS). Raises
    TlsConfigError when the files do not load."""
    if not settings.inter_broker_protocol().uses_tls:
        return None
    inter, tls = settings.inter_broker, settings.tls
    cert_file, key_file = inter.cert_file, inter.key_file
    if bool(cert_file) != bool(key_file):
        raise TlsConfigError("inter_broker.cert_file and inter_broker.key_file go together")
    if cert_file is None:
        cert_file, key_file = tls.cert_file, tls.key_file
    return client_context(inter.ca_file or tls.ca_file, cert_file, key_file, inter.check_hostname)


def missing_login(settings: BrokerSettings) -> str | None:
    """Why this broker cannot log in to the others (None: it can, or needs not). Not a start-up
    error: a broker whose only listener is SASL served before there were transactions, and
    serves everything else still; its coordinator's markers are refused until this is set."""
    inter = settings.inter_broker
    protocol = settings.inter_broker_protocol()
    if protocol.uses_sasl and not (inter.sasl_username and inter.sasl_password):
        return (
            f"the brokers' {protocol} listener needs inter_broker.sasl_username and "
            "sasl_password: transactions cannot be completed (their markers are refused)"
        )
    return None


def inter_broker_login(settings: BrokerSettings) -> SaslLogin | None:
    """The broker's SASL login to other brokers (None unless their listener is SASL and the
    credentials are set)."""
    inter = settings.inter_broker
    if not settings.inter_broker_protocol().uses_sasl or missing_login(settings):
        return None
    assert inter.sasl_username is not None and inter.sasl_password is not None
    password = inter.sasl_password.get_secret_value()
    return SaslLogin(inter.sasl_mechanism, inter.sasl_username, password)


def inter_broker_link(settings: BrokerSettings, context: ssl.SSLContext | None) -> UpstreamLink:
    """How requests of this broker reach another: bare (its own principal), never enveloped."""
    listener = settings.inter_broker.listener
    return UpstreamLink(
        ssl_context=context,
        login=inter_broker_login(settings),
        listener=listener.upper() if listener else None,
    )
