"""Test certificates made at test time with ``cryptography``: a CA, a server certificate for
127.0.0.1/localhost, client certificates (one valid, one expired, one from another CA).

Nothing is committed: every key is generated into the test's temporary directory.
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

_NOW = datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey
    cert_path: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_ca(directory: Path, name: str = "kafscale-test-ca") -> Authority:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOW - datetime.timedelta(days=1))
        .not_valid_after(_NOW + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return Authority(subject, key, path)


def issue(
    ca: Authority,
    directory: Path,
    file_stem: str,
    subject: list[tuple[x509.ObjectIdentifier, str]],
    *,
    server: bool = False,
    expired: bool = False,
) -> Pair:
    """A certificate signed by ``ca`` (valid now unless ``expired``)."""
    key = _key()
    if expired:
        not_before, not_after = (
            _NOW - datetime.timedelta(days=10),
            _NOW - datetime.timedelta(days=1),
        )
    else:
        not_before, not_after = (
            _NOW - datetime.timedelta(days=1),
            _NOW + datetime.timedelta(days=10),
        )
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in subject]))
        .issuer_name(ca.name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    cert = builder.sign(ca.key, hashes.SHA256())
    pair = Pair(directory / f"{file_stem}.crt", directory / f"{file_stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


@dataclass(frozen=True)
class TestPki:
    __test__ = False  # not a test class
    ca: Authority
    server: Pair
    alice: Pair  # client certificate: O=KafScale Test, CN=alice
    expired: Pair  # client certificate that expired yesterday
    stranger: Pair  # client certificate from a CA the broker does not trust


def make_pki(directory: Path) -> TestPki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    other_ca = make_ca(directory, "untrusted-ca")
    org = (NameOID.ORGANIZATION_NAME, "KafScale Test")
    return TestPki(
        ca=ca,
        server=issue(ca, directory, "server", [(NameOID.COMMON_NAME, "localhost")], server=True),
        alice=issue(ca, directory, "alice", [org, (NameOID.COMMON_NAME, "alice")]),
        expired=issue(ca, directory, "expired", [org, (NameOID.COMMON_NAME, "old")], expired=True),
        stranger=issue(other_ca, directory, "stranger", [org, (NameOID.COMMON_NAME, "eve")]),
    )
