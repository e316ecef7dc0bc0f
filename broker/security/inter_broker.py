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
from pathlib import Path

from kafscale.broker.config import BrokerSettings
from kafscale.broker.proxy.login import SaslLogin
from kafscale.broker.proxy.upstream import UpstreamLink
from kafscale.broker.security.tls import ClientCertificateReloader, TlsConfigError, client_context


def client_files(settings: BrokerSettings) -> tuple[Path | None, Path | None, Path | None]:
    """(CA, certificate, key) of the inter-broker TLS client: ``inter_broker.*``, else the
    broker's own ``tls.*`` (as Kafka's brokers use their keystore and truststore)."""
    inter, tls = settings.inter_broker, settings.tls
    ca_file = inter.ca_file or tls.ca_file
    if inter.cert_file is not None or inter.key_file is not None:
        return ca_file, inter.cert_file, inter.key_file
    return ca_file, tls.cert_file, tls.key_file


def inter_broker_context(settings: BrokerSettings) -> ssl.SSLContext | None:
    """The TLS context toward other brokers (None: their listener is not TLS). Raises
    TlsConfigError when the files do not load."""
    if not settings.inter_broker_protocol().uses_tls:
        return None
    ca_file, cert_file, key_file = client_files(settings)
    if bool(cert_file) != bool(key_file):
        raise TlsConfigError("inter_broker.cert_file and inter_broker.key_file go together")
    return client_context(ca_file, cert_file, key_file, settings.inter_broker.check_hostname)


def inter_broker_reloader(
    settings: BrokerSettings, context: ssl.SSLContext | None
) -> ClientCertificateReloader | None:
    """Keeps the inter-broker context on the current files (every ``tls.reload_interval_s``):
    the broker's certificate is renewed as the proxy's is, and would be refused once expired."""
    if context is None:
        return None
    ca_file, cert_file, key_file = client_files(settings)
    if cert_file is None and ca_file is None:
        return None
    return ClientCertificateReloader(
        context, ca_file, cert_file, key_file, settings.tls.reload_interval_s
    )


def missing_login(settings: BrokerSettings) -> str | None:
    """Why this broker cannot log in to the others (None: it can, or needs not). Not a start-up
    error: a broker whose only listener is SASL served before there were transactions, and
    serves everything else still; its coordinator's markers for other brokers' partitions are
    refused until this is set (its own partitions get theirs in place)."""
    inter = settings.inter_broker
    protocol = settings.inter_broker_protocol()
    if protocol.uses_sasl and not (inter.sasl_username and inter.sasl_password):
        return (
            f"the brokers' {protocol} listener needs inter_broker.sasl_username and "
            "sasl_password: transactions with partitions on other brokers cannot be completed "
            "(their markers are refused there)"
        )
    return None


def missing_login_warning(settings: BrokerSettings, cluster_size: int | None) -> str | None:
    """The start-up warning for ``missing_login``, when it applies: markers and transaction
    checks go from broker to broker only in a cluster of several. ``cluster_size`` is the
    number of brokers when whoever starts them knows it for good (``kafscale local --brokers
    N``, on an etcd of its own); None (``kafscale broker``, which others may join) counts as
    several."""
    if cluster_size == 1:
        return None
    return missing_login(settings)


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
