"""Pure parts of security: listener parsing, SCRAM (RFC 7677's own test vector), PLAIN against
SCRAM credentials, the SASL state machine, certificate principals, the admin guard."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from harness.tls import issue, make_ca
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kafscale.broker.admin_http import AdminGuard
from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.security.listeners import ClientAuth, SecurityProtocol, parse_endpoints
from kafscale.broker.security.sasl import SaslSession, SaslStage
from kafscale.broker.security.scram import (
    AuthenticationFailed,
    ScramCredential,
    ScramExchange,
    ScramMechanism,
    check_password,
    credential_from_salted,
    new_credential,
    parse_client_first,
    parse_plain,
    salted_password,
)
from kafscale.broker.security.tls import principal_from_certificate
from kafscale.broker.server import ServerEndpoint, new_connection

pytestmark = pytest.mark.unit


# --- listeners ---------------------------------------------------------------------------------


def test_default_is_one_plaintext_listener_from_the_listener_section() -> None:
    plan = BrokerSettings().listener_plan()
    assert [(p.name, p.host, p.port, p.protocol) for p in plan] == [
        ("PLAINTEXT", "0.0.0.0", 9092, SecurityProtocol.PLAINTEXT)
    ]


def test_listeners_with_protocols_advertised_addresses_and_client_auth() -> None:
    settings = BrokerSettings(
        listeners="INTERNAL://:9092,EXTERNAL://0.0.0.0:9093,MTLS://[::1]:9094",
        advertised_listeners="EXTERNAL://kafka.example.com:443",
        listener_security_protocol_map="INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL,MTLS:SSL",
        tls={
            "cert_file": "/c.pem",
            "key_file": "/k.pem",
            "ca_file": "/ca.pem",
            "client_auth_overrides": "MTLS:required",
        },
    )
    internal, external, mtls = settings.listener_plan()
    assert (internal.host, internal.port, internal.protocol) == (
        "0.0.0.0",
        9092,
        SecurityProtocol.PLAINTEXT,
    )
    assert (external.advertised_host, external.advertised_port) == ("kafka.example.com", 443)
    assert external.protocol.uses_tls and external.protocol.uses_sasl
    assert external.client_auth is ClientAuth.NONE
    assert (mtls.host, mtls.client_auth) == ("::1", ClientAuth.REQUIRED)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"listeners": "nonsense"}, "NAME://host:port"),
        ({"listeners": "A://:1,A://:2", "listener_security_protocol_map": "A:PLAINTEXT"}, "unique"),
        ({"listeners": "EXTERNAL://:9093"}, "security protocol map"),
        ({"listener_security_protocol_map": "X:KERBEROS", "listeners": "X://:1"}, "protocol"),
        ({"listeners": "SSL://:9093"}, "tls.cert_file"),
        ({"listeners": "PLAINTEXT://:1", "advertised_listeners": "OTHER://h:2"}, "advertised"),
        ({"listeners": "PLAINTEXT://:1,SSL://:1"}, "same port"),
        ({"internal_listener_name": "NOPE"}, "internal listener"),
        (
            {
                "listeners": "SSL://:9093",
                "tls": {"cert_file": "c", "key_file": "k", "client_auth": "required"},
            },
            "tls.ca_file",
        ),
    ],
)
def test_bad_listener_settings_are_clear_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BrokerSettings(**overrides)  # type: ignore[arg-type]


def test_endpoint_names_are_upper_cased_like_kafka() -> None:
    assert parse_endpoints("internal://h:1") == [("INTERNAL", "h", 1)]


def test_registration_without_listeners_answers_every_listener_with_its_main_address() -> None:
    old = BrokerInfo.from_json(b'{"node_id": 1, "host": "h", "port": 9092, "rack": null}')
    assert old.endpoint("EXTERNAL") == ("h", 9092)
    new = BrokerInfo(1, "h", 9092, listeners=(("INTERNAL", "h", 9092), ("EXTERNAL", "e", 443)))
    assert BrokerInfo.from_json(new.to_json()) == new
    assert new.endpoint("EXTERNAL") == ("e", 443)


# --- SCRAM ---------------------------------------------------------------------------------------

# RFC 7677 section 3: user "user", password "pencil".
RFC7677_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC7677_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC7677_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC7677_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _rfc_credential() -> ScramCredential:
    mechanism = ScramMechanism.SCRAM_SHA_256
    salted = salted_password(b"pencil", RFC7677_SALT, 4096, mechanism)
    return credential_from_salted(salted, RFC7677_SALT, 4096, mechanism)


def test_scram_sha_256_matches_rfc_7677() -> None:
    exchange = ScramExchange(
        ScramMechanism.SCRAM_SHA_256,
        parse_client_first(RFC7677_CLIENT_FIRST),
        _rfc_credential(),
        server_nonce=RFC7677_SERVER_NONCE,
    )
    assert exchange.server_first_message() == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert exchange.final(RFC7677_CLIENT_FINAL) == RFC7677_SERVER_FINAL


@pytest.mark.parametrize(
    "final",
    [
        RFC7677_CLIENT_FINAL.replace(b"p=dHzb", b"p=eHzb"),  # wrong proof
        RFC7677_CLIENT_FINAL.replace(b"r=rOpr", b"r=XOpr"),  # another nonce
        RFC7677_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # other channel binding
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",  # no proof
        b"\xff\xfe",
        b"c=biws,p=!!!",
    ],
)
def test_bad_scram_final_messages_fail(final: bytes) -> None:
    exchange = ScramExchange(
        ScramMechanism.SCRAM_SHA_256,
        parse_client_first(RFC7677_CLIENT_FIRST),
        _rfc_credential(),
        server_nonce=RFC7677_SERVER_NONCE,
    )
    with pytest.raises(AuthenticationFailed):
        exchange.final(final)


@pytest.mark.parametrize(
    "first",
    [b"", b"n,,", b"p=tls-server-end-point,,n=u,r=x", b"n,,r=x,n=u", b"n,,n=,r=x", b"n,,n=a=b,r=x"],
)
def test_bad_client_first_messages_fail(first: bytes) -> None:
    with pytest.raises(AuthenticationFailed):
        parse_client_first(first)


def test_user_names_are_unescaped() -> None:
    assert parse_client_first(b"n,,n=a=2Cb=3Dc,r=x").username == "a,b=c"


def test_plain_password_is_checked_against_the_scram_credential() -> None:
    credential = new_credential("secret", ScramMechanism.SCRAM_SHA_512)
    assert check_password(b"secret", credential, ScramMechanism.SCRAM_SHA_512)
    assert not check_password(b"Secret", credential, ScramMechanism.SCRAM_SHA_512)
    assert b"secret" not in repr(credential).encode()


# --- the SASL state machine --------------------------------------------------------------------


def _lookup(credentials: dict[tuple[str, ScramMechanism], ScramCredential]):  # type: ignore[no-untyped-def]
    async def lookup(user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return credentials.get((user, mechanism))

    return lookup


def test_plain_login_sets_the_user_and_a_second_handshake_is_illegal() -> None:
    mechanism = ScramMechanism.SCRAM_SHA_256
    lookup = _lookup({("alice", mechanism): new_credential("pw", mechanism)})
    session = SaslSession(("PLAIN",))
    assert not session.handshake("SCRAM-SHA-512")
    assert session.handshake("PLAIN")
    asyncio.run(session.authenticate(b"\0alice\0pw", lookup))
    assert session.stage is SaslStage.DONE and session.user == "alice"
    with pytest.raises(Exception, match="after the handshake"):
        session.handshake("PLAIN")


def test_plain_login_with_a_wrong_password_fails() -> None:
    mechanism = ScramMechanism.SCRAM_SHA_512
    lookup = _lookup({("alice", mechanism): new_credential("pw", mechanism)})
    session = SaslSession(("PLAIN",))
    session.handshake("PLAIN")
    with pytest.raises(AuthenticationFailed):
        asyncio.run(session.authenticate(b"\0alice\0nope", lookup))
    assert not session.authenticated


# --- certificates and principals ---------------------------------------------------------------


def test_client_certificate_subject_is_the_principal_in_kafka_form(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    pair = issue(
        ca,
        tmp_path,
        "c",
        [
            (NameOID.COUNTRY_NAME, "DE"),
            (NameOID.ORGANIZATION_NAME, "Example"),
            (NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
            (NameOID.COMMON_NAME, "alice"),
        ],
    )
    der = x509.load_pem_x509_certificate(pair.cert.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )
    assert principal_from_certificate(der) == "User:CN=alice,OU=eng,O=Example,C=DE"


def test_connections_start_anonymous_from_a_certificate_or_waiting_for_sasl(tmp_path: Path) -> None:
    from kafscale.broker.security.listeners import Listener

    plain = ServerEndpoint(Listener("PLAINTEXT", "h", 1, SecurityProtocol.PLAINTEXT))
    sasl = ServerEndpoint(Listener("EXT", "h", 2, SecurityProtocol.SASL_SSL), None, ("PLAIN",))
    assert new_connection("p", plain, None).principal == "User:ANONYMOUS"
    connection = new_connection("p", sasl, None)
    assert connection.sasl is not None and connection.listener == "EXT"
    assert connection.principal == "User:ANONYMOUS"


# --- the admin guard ---------------------------------------------------------------------------


def test_without_a_token_only_loopback_clients_may_drain() -> None:
    guard = AdminGuard()
    assert guard.check("127.0.0.1", None) is None
    assert guard.check("::1", None) is None
    refused = guard.check("10.1.2.3", None)
    assert refused is not None and refused[0] == 403
    assert AdminGuard(allow_remote_without_token=True).check("10.1.2.3", None) is None


def test_with_a_token_everyone_needs_it(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    guard = AdminGuard(token_file)
    assert guard.check("10.1.2.3", "Bearer s3cret") is None
    assert guard.check("127.0.0.1", None) == (401, "a valid bearer token is required")
    assert guard.check("127.0.0.1", "Bearer nope") is not None
    token_file.write_text("rotated")
    assert guard.check("10.1.2.3", "Bearer s3cret") is not None
    assert guard.check("10.1.2.3", "Bearer rotated") is None
    token_file.unlink()
    assert guard.check("10.1.2.3", "Bearer rotated") is not None


def test_missing_certificate_files_are_a_clear_start_up_error(tmp_path: Path) -> None:
    from kafscale.broker.app import server_endpoints
    from kafscale.broker.security.tls import TlsConfigError

    settings = BrokerSettings(
        listeners="SSL://127.0.0.1:0",
        tls={"cert_file": str(tmp_path / "missing.crt"), "key_file": str(tmp_path / "k.key")},
    )
    with pytest.raises(TlsConfigError, match="cannot load TLS files"):
        server_endpoints(settings)


def test_certificate_reload_waits_for_a_matching_key(tmp_path: Path) -> None:
    """A renewed certificate whose key is not there yet is not loaded: the old pair stays."""
    import os

    from kafscale.broker.config import TlsSettings
    from kafscale.broker.security.tls import CertificateReloader, server_context

    ca = make_ca(tmp_path)
    live = issue(ca, tmp_path, "live", [(NameOID.COMMON_NAME, "one")], server=True)
    settings = TlsSettings(cert_file=live.cert, key_file=live.key)
    context = server_context(settings, ClientAuth.NONE)
    reloader = CertificateReloader(settings, [context])
    renewed = issue(ca, tmp_path, "renewed", [(NameOID.COMMON_NAME, "two")], server=True)
    os.replace(renewed.cert, live.cert)  # the certificate first, its key not yet
    stamp = live.cert.stat().st_mtime + 5
    os.utime(live.cert, (stamp, stamp))
    assert not reloader.check()
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    assert _handshake_works(context, client)  # the old pair still serves
    os.replace(renewed.key, live.key)
    os.utime(live.key, (stamp + 1, stamp + 1))
    assert reloader.check() and reloader.reloads == 1
    assert _handshake_works(context, client)


def _handshake_works(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(server_in, server_out, server_side=True)
    c = client.wrap_bio(client_in, client_out, server_hostname="localhost")
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        try:
            c.do_handshake()
            s.do_handshake()
            return True
        except ssl.SSLWantReadError:
            continue
        except ssl.SSLError:
            return False
    return False


# --- hostile input: only AuthenticationFailed, never another exception ------------------------


@given(st.binary(max_size=200))
def test_any_client_first_message_parses_or_fails_cleanly(message: bytes) -> None:
    with contextlib.suppress(AuthenticationFailed):
        parse_client_first(message)


@given(st.binary(max_size=300))
def test_any_client_final_message_fails_cleanly(message: bytes) -> None:
    exchange = ScramExchange(
        ScramMechanism.SCRAM_SHA_256,
        parse_client_first(RFC7677_CLIENT_FIRST),
        _rfc_credential(),
        server_nonce=RFC7677_SERVER_NONCE,
    )
    with pytest.raises(AuthenticationFailed):
        exchange.final(message)


@given(st.binary(max_size=100))
def test_any_plain_message_parses_or_fails_cleanly(message: bytes) -> None:
    with contextlib.suppress(AuthenticationFailed):
        parse_plain(message)


def _client_seen_by_server(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """The common name of the certificate ``client`` presents in a memory-BIO handshake."""
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(server_in, server_out, server_side=True)
    c = client.wrap_bio(client_in, client_out, server_hostname="localhost")
    done = set()
    for _ in range(10):
        for name, side in (("client", c), ("server", s)):
            if name in done:
                continue
            try:
                side.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if done == {"client", "server"}:
            break
    peer = s.getpeercert()
    assert peer is not None, "the client presented no certificate"
    return next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName")


def test_a_client_context_presents_its_renewed_certificate_once_both_files_are_there(
    tmp_path: Path,
) -> None:
    """The proxy's upstream context: a renewed client certificate (same CA) is presented on
    new handshakes after the reload; a certificate without its key yet is not loaded."""
    import os

    from kafscale.broker.config import TlsSettings
    from kafscale.broker.security.tls import (
        ClientCertificateReloader,
        client_context,
        server_context,
    )

    ca = make_ca(tmp_path)
    server_pair = issue(ca, tmp_path, "server", [(NameOID.COMMON_NAME, "localhost")], server=True)
    server = server_context(
        TlsSettings(cert_file=server_pair.cert, key_file=server_pair.key, ca_file=ca.cert_path),
        ClientAuth.REQUIRED,
    )
    live = issue(ca, tmp_path, "proxy", [(NameOID.COMMON_NAME, "proxy-one")])
    context = client_context(ca.cert_path, live.cert, live.key)
    reloader = ClientCertificateReloader(context, ca.cert_path, live.cert, live.key, 10.0)
    assert _client_seen_by_server(server, context) == "proxy-one"
    assert not reloader.check()  # nothing changed
    renewed = issue(ca, tmp_path, "renewed", [(NameOID.COMMON_NAME, "proxy-two")])
    os.replace(renewed.cert, live.cert)
    stamp = live.cert.stat().st_mtime + 5
    os.utime(live.cert, (stamp, stamp))
    assert not reloader.check()  # the key of proxy-two is not there yet
    assert _client_seen_by_server(server, context) == "proxy-one"
    os.replace(renewed.key, live.key)
    os.utime(live.key, (stamp + 1, stamp + 1))
    assert reloader.check() and reloader.reloads == 1
    assert _client_seen_by_server(server, context) == "proxy-two"
