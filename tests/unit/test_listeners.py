"""The listener settings the broker and the proxy share: one function plans and checks both, so
the same fields give the same listeners and the same clear errors in either process."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kafscale.broker.config import BrokerSettings, ListenerSettings, TlsSettings
from kafscale.broker.proxy.config import ProxyListenerSettings, ProxySettings
from kafscale.broker.security.listeners import (
    ClientAuth,
    Listener,
    SecurityProtocol,
    advertised_address,
    advertised_host,
    check_listener_tls,
    configured_listeners,
)

pytestmark = pytest.mark.unit

SECURED = {
    "listeners": "INTERNAL://127.0.0.1:9092,EXTERNAL://:9093,MTLS://[::1]:9094",
    "advertised_listeners": "EXTERNAL://kafka.example.com:443",
    "listener_security_protocol_map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,MTLS:SSL",
    "tls": {
        "cert_file": "/c.pem",
        "key_file": "/k.pem",
        "ca_file": "/ca.pem",
        "client_auth": "requested",
        "client_auth_overrides": "MTLS:required",
    },
}


@pytest.mark.parametrize("settings_type", [BrokerSettings, ProxySettings])
def test_listeners_are_planned_alike_for_the_broker_and_the_proxy(
    settings_type: type[BrokerSettings] | type[ProxySettings],
) -> None:
    settings = settings_type(**SECURED)  # type: ignore[arg-type]
    assert settings.listener_plan() == configured_listeners(settings)
    assert settings.listener_plan() == [
        Listener("INTERNAL", "127.0.0.1", 9092, SecurityProtocol.PLAINTEXT, None, None,
                 ClientAuth.REQUESTED),
        Listener("EXTERNAL", "0.0.0.0", 9093, SecurityProtocol.SASL_SSL, "kafka.example.com",
                 443, ClientAuth.REQUESTED),
        Listener("MTLS", "::1", 9094, SecurityProtocol.SSL, None, None, ClientAuth.REQUIRED),
    ]  # fmt: skip


@pytest.mark.parametrize("settings_type", [BrokerSettings, ProxySettings])
def test_without_listeners_the_listener_section_is_one_plaintext_listener(
    settings_type: type[BrokerSettings] | type[ProxySettings],
) -> None:
    section = {"host": "127.0.0.1", "port": 0, "advertised_host": "h", "advertised_port": 7}
    settings = settings_type(listener=section)  # type: ignore[arg-type]
    assert settings.listener_plan() == [
        Listener("PLAINTEXT", "127.0.0.1", 0, SecurityProtocol.PLAINTEXT, "h", 7)
    ]


@pytest.mark.parametrize("settings_type", [BrokerSettings, ProxySettings])
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"listeners": "SSL://:9093"}, "needs tls.cert_file and tls.key_file"),
        (
            {
                "listeners": "SSL://:9093",
                "tls": {"cert_file": "c", "key_file": "k", "client_auth_overrides": "SSL:required"},
            },
            "client certificate authentication needs tls.ca_file",
        ),
        ({"listeners": "EXTERNAL://:9093"}, "no entry in the security protocol map"),
    ],
)
def test_bad_listener_settings_are_the_same_clear_error_in_both_processes(
    settings_type: type[BrokerSettings] | type[ProxySettings],
    overrides: dict[str, object],
    message: str,
) -> None:
    with pytest.raises(ValidationError, match=message):
        settings_type(**overrides)  # type: ignore[arg-type]


def test_client_authentication_on_a_plaintext_listener_needs_no_ca() -> None:
    plain = Listener("P", "h", 1, SecurityProtocol.PLAINTEXT, client_auth=ClientAuth.REQUIRED)
    check_listener_tls([plain], TlsSettings())
    tls = Listener("S", "h", 2, SecurityProtocol.SSL, client_auth=ClientAuth.NONE)
    check_listener_tls([plain, tls], TlsSettings(cert_file="c", key_file="k"))  # type: ignore[arg-type]


@pytest.mark.parametrize("section_type", [ListenerSettings, ProxyListenerSettings])
@pytest.mark.parametrize(
    ("bind", "advertised", "expected"),
    [("0.0.0.0", None, "fqdn"), ("::", None, "fqdn"), ("10.0.0.5", None, "10.0.0.5"),
     ("0.0.0.0", "kafka.example.com", "kafka.example.com")],
)  # fmt: skip
def test_a_listener_bound_to_every_interface_advertises_the_host_name(
    section_type: type[ListenerSettings] | type[ProxyListenerSettings],
    bind: str,
    advertised: str | None,
    expected: str,
) -> None:
    assert advertised_host(bind, advertised, lambda: "fqdn") == expected
    section = section_type(host=bind, advertised_host=advertised)
    assert section.advertised(lambda: "fqdn") == expected
    listener = Listener("P", bind, 0, SecurityProtocol.PLAINTEXT, advertised_host=advertised)
    assert advertised_address(listener, 9092, lambda: "fqdn") == (expected, 9092)
