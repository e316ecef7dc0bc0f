"""The broker's client identity toward other brokers (``inter_broker.*``): which security it
speaks, with which certificate or login, from the settings alone."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography.x509.oid import NameOID
from harness.tls import issue, make_pki
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings
from kafscale.broker.security import inter_broker
from kafscale.broker.security.inter_broker import (
    inter_broker_context,
    inter_broker_link,
    missing_login,
    missing_login_warning,
)
from kafscale.broker.security.listeners import SecurityProtocol
from kafscale.broker.security.tls import TlsConfigError

LISTENERS = {
    "listeners": "INTERNAL://127.0.0.1:0,CLIENTS://127.0.0.1:0,SASLIN://127.0.0.1:0",
    "listener_security_protocol_map": "INTERNAL:SSL,CLIENTS:PLAINTEXT,SASLIN:SASL_PLAINTEXT",
    "internal_listener_name": "INTERNAL",
}


def _settings(tmp_path: Path, **extra: object) -> BrokerSettings:
    pki = make_pki(tmp_path)
    tls = {"cert_file": pki.server.cert, "key_file": pki.server.key, "ca_file": pki.ca.cert_path}
    return BrokerSettings(**{**LISTENERS, "tls": tls, **extra})  # type: ignore[arg-type]


def test_plaintext_by_default_with_no_tls_and_no_login() -> None:
    settings = BrokerSettings()
    assert settings.inter_broker_protocol() is SecurityProtocol.PLAINTEXT
    assert inter_broker_context(settings) is None
    link = inter_broker_link(settings, None)
    assert link.ssl_context is None and link.login is None and link.principal is None


def test_an_ssl_internal_listener_means_tls_with_the_brokers_own_certificate(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    assert settings.inter_broker_protocol() is SecurityProtocol.SSL
    context = inter_broker_context(settings)
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert inter_broker.client_files(settings) == (
        settings.tls.ca_file,
        settings.tls.cert_file,
        settings.tls.key_file,
    )
    assert inter_broker.inter_broker_reloader(settings, context) is not None  # renewed files
    link = inter_broker_link(settings, context)
    assert link.ssl_context is context and link.listener is None and link.principal is None


def test_a_certificate_of_its_own_is_used_and_reloaded(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "other")
    own = issue(pki.ca, tmp_path, "broker-client", [(NameOID.COMMON_NAME, "broker")])
    settings = _settings(
        tmp_path,
        inter_broker={"cert_file": own.cert, "key_file": own.key, "ca_file": pki.ca.cert_path},
    )
    assert inter_broker.client_files(settings) == (pki.ca.cert_path, own.cert, own.key)
    context = inter_broker_context(settings)
    assert inter_broker.inter_broker_reloader(settings, context) is not None


def test_a_sasl_listener_by_name_logs_in_as_the_brokers_user(tmp_path: Path) -> None:
    settings = _settings(
        tmp_path,
        inter_broker={
            "listener": "saslin",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "broker",
            "sasl_password": "secret",
        },
    )
    assert settings.inter_broker_protocol() is SecurityProtocol.SASL_PLAINTEXT
    link = inter_broker_link(settings, inter_broker_context(settings))
    assert link.listener == "SASLIN" and link.ssl_context is None
    assert link.login is not None and link.login.username == "broker"
    assert link.login.mechanism == "SCRAM-SHA-256"


def test_a_sasl_listener_without_credentials_is_reported_not_refused(tmp_path: Path) -> None:
    """A broker whose internal listener is SASL served before transactions: it still starts,
    says why its markers will be refused, and connects without a login."""
    settings = _settings(tmp_path, inter_broker={"listener": "SASLIN"})
    problem = missing_login(settings)
    assert problem is not None and "inter_broker.sasl_username" in problem
    assert inter_broker_link(settings, None).login is None
    assert missing_login(_settings(tmp_path)) is None


def test_an_unknown_inter_broker_listener_is_refused_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"inter_broker\.listener"):
        _settings(tmp_path, inter_broker={"listener": "NOPE"})


def test_a_certificate_without_its_key_is_a_start_up_error(tmp_path: Path) -> None:
    settings = _settings(tmp_path, inter_broker={"cert_file": tmp_path / "x.crt"})
    with pytest.raises(TlsConfigError, match="go together"):
        inter_broker_context(settings)


def test_the_protocol_may_be_set_explicitly(tmp_path: Path) -> None:
    settings = _settings(tmp_path, inter_broker={"security_protocol": "PLAINTEXT"})
    assert inter_broker_context(settings) is None


def test_the_missing_login_is_a_warning_only_where_other_brokers_may_be(tmp_path: Path) -> None:
    """Markers and transaction checks go from broker to broker only in a cluster of several: a
    ``kafscale local`` of one broker has none to log in to; ``kafscale broker`` (no size known,
    others may join) and a local cluster of several do."""
    sasl_only = _settings(tmp_path, inter_broker={"listener": "SASLIN"})
    assert missing_login_warning(sasl_only, 1) is None
    for cluster_size in (None, 2, 3):
        warning = missing_login_warning(sasl_only, cluster_size)
        assert warning is not None and "inter_broker.sasl_username" in warning
    assert missing_login_warning(_settings(tmp_path), None) is None  # not SASL: nothing to say
