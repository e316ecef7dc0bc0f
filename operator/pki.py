"""The operator's own small PKI: a CA per purpose and the certificates it signs, as PEM.

Used when cert-manager is not installed: a cluster with TLS listeners gets a CA
(``<cluster>-ca``) and a broker server certificate; a managed etcd with ``tls: true`` gets its
own CA (``<cluster>-etcd-ca``), a server/peer certificate for its members and one client
certificate that brokers, proxies and the operator present. Separate CAs keep the two trust
domains apart: an etcd client certificate is no Kafka identity, and the reverse.

Keys are ECDSA P-256 (fast to make, accepted by Python's ssl, librdkafka, the Java client, Go's
etcd). Everything takes the time as an argument; the only impurity is key generation.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=365)
# A leaf certificate is re-issued when less than this is left (brokers and etcd reload
# certificate files when the Secret volume changes).
RENEW_BEFORE = datetime.timedelta(days=30)
BACKDATE = datetime.timedelta(minutes=5)  # tolerate clocks a little behind the operator's


@dataclass(frozen=True)
class PemPair:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kafscale"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64]),
        ]
    )


def make_ca(common_name: str, now: datetime.datetime) -> PemPair:
    """A self-signed CA certificate (and key) valid for :data:`CA_VALIDITY`."""
    key = _new_key()
    subject = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def issue(
    ca: PemPair,
    common_name: str,
    hosts: Iterable[str],
    now: datetime.datetime,
    *,
    server: bool = True,
    client: bool = False,
) -> PemPair:
    """A leaf certificate signed by ``ca`` for ``hosts`` (DNS names, wildcards or IPs)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key made by the operator")
    key = _new_key()
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + LEAF_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    sans = _san(hosts)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return PemPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def certificate_hosts(cert_pem: bytes) -> frozenset[str]:
    """The DNS names and IP addresses a certificate is for."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    dns = san.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return frozenset([*dns, *ips])


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``cert_pem``'s signature verifies with ``ca_pem``'s key."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _allows_client_auth(cert: x509.Certificate) -> bool:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no extended key usage: any use
    return ExtendedKeyUsageOID.CLIENT_AUTH in usages


def needs_reissue(
    cert_pem: bytes | None,
    ca_pem: bytes,
    hosts: Iterable[str],
    now: datetime.datetime,
    client: bool = False,
) -> bool:
    """Whether a leaf certificate must be (re-)issued: missing, unreadable, not from this CA,
    not for exactly ``hosts``, without the client-auth usage it now needs (a broker certificate
    once the internal listener became mTLS), or within :data:`RENEW_BEFORE` of expiring."""
    if not cert_pem:
        return True
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    if not signed_by(cert_pem, ca_pem):
        return True
    if certificate_hosts(cert_pem) != frozenset(hosts):
        return True
    if client and not _allows_client_auth(cert):
        return True
    return cert.not_valid_after_utc - now < RENEW_BEFORE


def _public_der(key: Any) -> bytes:
    """A public key as DER (any algorithm: RSA, ECDSA, Ed25519), to compare two."""
    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def pair_problem(cert_pem: bytes, key_pem: bytes | None) -> str | None:
    """What keeps a PEM certificate (and, given, its private key) from being used: not a PEM
    certificate, not a PEM private key without a password, or not the key of that certificate
    (None: usable). Said in words a user can act on, about the Secret's ``tls.crt``/``tls.key``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "tls.crt is not a PEM certificate"
    if key_pem is None:
        return None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        return "tls.key is not a PEM private key (without a password)"
    if _public_der(key.public_key()) != _public_der(cert.public_key()):
        return "tls.key is not the private key of tls.crt"
    return None


def ca_usable(ca: PemPair | None, now: datetime.datetime) -> bool:
    """Whether a stored CA can keep signing (readable, key matches, not about to expire)."""
    if ca is None or pair_problem(ca.cert, ca.key) is not None:
        return False
    cert = x509.load_pem_x509_certificate(ca.cert)
    return cert.not_valid_after_utc - now > LEAF_VALIDITY
