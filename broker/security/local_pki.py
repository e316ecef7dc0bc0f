"""Certificates made at start-up for ``kafscale local --proxy`` with the authorizer on.

Behind a local proxy the brokers must trust the proxy's forwarded principals, and nobody else's:
so they listen with TLS and require a client certificate, and only the proxy holds one. A fresh
CA, a broker certificate (for localhost, 127.0.0.1 and the bind host) and the proxy's client
certificate (``CN=kafscale-local-proxy``, a super user of the local brokers) are written to the
data directory on every start. The brokers present their certificate to each other too
(``CN=kafscale-local-broker``, also a super user): a transaction coordinator's markers and a
partition owner's transaction checks need CLUSTER_ACTION, as between Kafka's brokers. Keys are
readable by their owner only. Short-lived (30 days) and local: production clusters bring their
own PKI or cert-manager's.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PROXY_COMMON_NAME = "kafscale-local-proxy"
PROXY_PRINCIPAL = f"User:CN={PROXY_COMMON_NAME}"
BROKER_COMMON_NAME = "kafscale-local-broker"
BROKER_PRINCIPAL = f"User:CN={BROKER_COMMON_NAME}"
_VALID = datetime.timedelta(days=30)


@dataclass(frozen=True, slots=True)
class LocalPki:
    ca_file: Path
    broker_cert: Path
    broker_key: Path
    proxy_cert: Path
    proxy_key: Path


def make_local_pki(directory: Path, hosts: list[str]) -> LocalPki:
    """A CA, a broker server certificate for ``hosts`` and the proxy's client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("kafscale-local-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pki = LocalPki(
        directory / "ca.crt",
        directory / "broker.crt",
        directory / "broker.key",
        directory / "proxy.crt",
        directory / "proxy.key",
    )
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = (
        _builder(_name(BROKER_COMMON_NAME), ca_name, broker_key.public_key(), now)
        .add_extension(x509.SubjectAlternativeName(_alt_names(hosts)), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki.broker_cert, pki.broker_key, broker, broker_key)
    proxy_key = ec.generate_private_key(ec.SECP256R1())
    proxy = _builder(_name(PROXY_COMMON_NAME), ca_name, proxy_key.public_key(), now).sign(
        ca_key, hashes.SHA256()
    )
    _write(pki.proxy_cert, pki.proxy_key, proxy, proxy_key)
    return pki


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )


def _alt_names(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _write(
    cert_path: Path, key_path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.chmod(0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
