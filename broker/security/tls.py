"""TLS for SSL and SASL_SSL listeners: server contexts, certificate reload, mTLS principals.

Certificates are rotated by replacing files (cert-manager renews a Secret, the kubelet updates
the mounted files), so the broker (and the proxy, for its listeners and for the client
certificate it presents to the brokers) checks their modification times every
``tls.reload_interval_s`` and loads the new ones into the contexts in place: new connections
get the new certificate, open ones keep theirs. A file that does not load (half written) is
logged and retried on the next check; the old certificate stays in use meanwhile.

A client certificate verified against ``tls.ca_file`` becomes the principal ``User:<subject>``
with the subject written as Kafka's default principal builder writes it (RFC 2253, most
specific first: ``CN=alice,OU=eng,O=Example``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable
from pathlib import Path

from kafscale.broker.config import TlsSettings
from kafscale.broker.security.listeners import ClientAuth

log = logging.getLogger(__name__)

_VERIFY_MODES = {
    ClientAuth.NONE: ssl.CERT_NONE,
    ClientAuth.REQUESTED: ssl.CERT_OPTIONAL,
    ClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}


class TlsConfigError(Exception):
    """The certificate, key or CA files cannot be loaded."""


def server_context(settings: TlsSettings, client_auth: ClientAuth) -> ssl.SSLContext:
    """A server context for a TLS listener (TLS 1.2 or newer)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = _VERIFY_MODES[client_auth]
    load_files(context, settings)
    return context


def load_files(context: ssl.SSLContext, settings: TlsSettings) -> None:
    """(Re)load the certificate chain, key and client CA into ``context``."""
    assert settings.cert_file is not None and settings.key_file is not None
    password = settings.key_password.get_secret_value() if settings.key_password else None
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file, password)
        if settings.ca_file is not None:
            context.load_verify_locations(cafile=settings.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load TLS files: {exc}") from exc


def principal_from_certificate(der: bytes) -> str:
    """``User:<subject in RFC 2253 form>`` of a DER client certificate."""
    # Imported here: cryptography.x509 costs ~0.1 s of CPU at every start, and only mTLS
    # listeners need it.
    from cryptography import x509

    subject = x509.load_der_x509_certificate(der).subject
    return f"User:{subject.rfc4514_string()}"


def _mtimes(paths: Iterable[Path | None]) -> tuple[float, ...]:
    stamps = []
    for path in paths:
        try:
            stamps.append(path.stat().st_mtime if path is not None else 0.0)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


class _FileReloader:
    """Reloads TLS files into live contexts when their modification times change.

    A trial load into a fresh context comes first: loading a certificate whose key does not
    match (the key file not replaced yet) into a live context would drop its key, and
    handshakes would fail until the next check."""

    def __init__(
        self, files: tuple[Path | None, ...], contexts: list[ssl.SSLContext], interval_s: float
    ) -> None:
        self._files = files
        self._contexts = contexts
        self._interval_s = interval_s
        self._seen = _mtimes(files)
        self.reloads = 0

    def _load(self, context: ssl.SSLContext) -> None:
        raise NotImplementedError

    def _trial_context(self) -> ssl.SSLContext:
        raise NotImplementedError

    def check(self) -> bool:
        """Reload if any file changed since the last load; True if it reloaded."""
        stamps = _mtimes(self._files)
        if stamps == self._seen:
            return False
        try:
            self._load(self._trial_context())
            for context in self._contexts:
                self._load(context)
        except TlsConfigError as exc:
            log.warning("TLS files changed but do not load yet (%s); keeping the old ones", exc)
            return False
        self._seen = stamps
        self.reloads += 1
        log.info("TLS certificate reloaded from %s", self._files[0])
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self.check()


class CertificateReloader(_FileReloader):
    """Reloads the TLS files into every listener's context when they change."""

    def __init__(self, settings: TlsSettings, contexts: list[ssl.SSLContext]) -> None:
        files = (settings.cert_file, settings.key_file, settings.ca_file)
        super().__init__(files, contexts, settings.reload_interval_s)
        self._settings = settings

    def _load(self, context: ssl.SSLContext) -> None:
        load_files(context, self._settings)

    def _trial_context(self) -> ssl.SSLContext:
        return ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)


class ClientCertificateReloader(_FileReloader):
    """Reloads a client context's certificate, key and CA when they change: the proxy's
    certificate towards the brokers (``<name>-proxy-client-tls`` on Kubernetes, renewed by the
    operator or cert-manager before it expires). New connections present the new certificate;
    open ones keep theirs."""

    def __init__(
        self,
        context: ssl.SSLContext,
        ca_file: Path | None,
        cert_file: Path | None,
        key_file: Path | None,
        interval_s: float,
    ) -> None:
        super().__init__((cert_file, key_file, ca_file), [context], interval_s)
        self._ca_file, self._cert_file, self._key_file = ca_file, cert_file, key_file

    def _load(self, context: ssl.SSLContext) -> None:
        load_client_files(context, self._ca_file, self._cert_file, self._key_file)

    def _trial_context(self) -> ssl.SSLContext:
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def load_client_files(
    context: ssl.SSLContext, ca_file: Path | None, cert_file: Path | None, key_file: Path | None
) -> None:
    """(Re)load a client's own certificate and key and the CAs it trusts into ``context``
    (loading adds CAs; the system's stay when ``ca_file`` is None)."""
    try:
        if ca_file is not None:
            context.load_verify_locations(cafile=str(ca_file))
        if cert_file is not None and key_file is not None:
            context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load TLS files: {exc}") from exc


def client_context(
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context for the proxy's connections to the brokers' TLS listener: the
    brokers' certificates verified against ``ca_file`` (or the system's CAs), and the proxy's
    own certificate presented when given (its principal on the brokers)."""
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"cannot load TLS files: {exc}") from exc
    load_client_files(context, None, cert_file, key_file)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = check_hostname
    return context
