"""etcd over TLS (``https://`` endpoints, a CA, client certificates) and with username/password
authentication, against a real etcd."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import children
from harness.brokers import BrokerCluster
from harness.tls_etcd import start_etcd_process

from kafscale.broker.metadata.embedded_etcd import find_etcd_binary
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_channel import EtcdTls
from kafscale.broker.metadata.etcd_errors import MetadataError, MetadataUnavailable

pytestmark = pytest.mark.integration


def openssl(*args: str, cwd: Path) -> None:
    children.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=ca",
            "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)  # fmt: skip
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", "san.cnf",
                "-out", f"{name}.crt", cwd=directory)  # fmt: skip


async def connected_within(url: str, timeout_s: float = 20, **kwargs: object) -> Etcd:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Etcd.connect([url], 2.0, **kwargs)  # type: ignore[arg-type]
        except MetadataUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def wait_until_serving(url: str, **kwargs: object) -> None:
    etcd = await connected_within(url, **kwargs)
    await etcd.close()


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    make_certificates(tmp_path)
    process, url = start_etcd_process(
        tmp_path,
        f"--cert-file={tmp_path / 'server.crt'}",
        f"--key-file={tmp_path / 'server.key'}",
        f"--trusted-ca-file={tmp_path / 'ca.crt'}",
        "--client-cert-auth",
        scheme="https",
    )
    try:
        yield url, tmp_path
    finally:
        process.kill()
        process.wait(10)


async def test_https_endpoints_with_a_ca_and_a_client_certificate(
    tls_etcd: tuple[str, Path],
) -> None:
    url, certs = tls_etcd
    tls = EtcdTls(certs / "ca.crt", certs / "client.crt", certs / "client.key")
    etcd = await connected_within(url, tls=tls)
    try:
        await etcd.put("/kafscale/tls/k", b"v")
        kv = await etcd.get("/kafscale/tls/k")
        assert kv is not None and kv.value == b"v"
        # A bounded page (Etcd.get_range calls aetcd's KV stub itself): over TLS too.
        page, more = await etcd.get_range("/kafscale/tls/", "/kafscale/tls0", 1, keys_only=True)
        assert [(kv.key, kv.value) for kv in page] == [("/kafscale/tls/k", b"")] and not more
    finally:
        await etcd.close()
    with pytest.raises(MetadataUnavailable):  # no client certificate: etcd refuses
        await Etcd.connect([url], 2.0, tls=EtcdTls(certs / "ca.crt"))


def test_a_broker_runs_on_an_https_etcd(
    broker_cluster: BrokerCluster, tls_etcd: tuple[str, Path]
) -> None:
    url, certs = tls_etcd
    tls = EtcdTls(certs / "ca.crt", certs / "client.crt", certs / "client.key")
    asyncio.run(wait_until_serving(url, tls=tls))
    broker = broker_cluster.start(
        KAFSCALE_ETCD__ENDPOINTS=json.dumps([url]),
        KAFSCALE_ETCD__CA_FILE=str(certs / "ca.crt"),
        KAFSCALE_ETCD__CERT_FILE=str(certs / "client.crt"),
        KAFSCALE_ETCD__KEY_FILE=str(certs / "client.key"),
    )
    assert broker.status()["ready"]


async def test_username_and_password(tmp_path: Path) -> None:
    process, url = start_etcd_process(tmp_path)
    etcdctl = str(find_etcd_binary().with_name("etcdctl"))
    try:
        await wait_until_serving(url)
        for command in (
            ["user", "add", "root:rootpw"],
            ["user", "add", "kafscale:s3cret"],
            ["role", "add", "kafscale"],
            ["role", "grant-permission", "kafscale", "--prefix=true", "readwrite", "/kafscale"],
            ["user", "grant-role", "kafscale", "kafscale"],
            ["auth", "enable"],
        ):
            await asyncio.to_thread(
                children.run,
                [etcdctl, f"--endpoints={url}", *command],
                check=True,
                capture_output=True,
                timeout=30,
            )
        etcd = await Etcd.connect([url], 2.0, username="kafscale", password="s3cret")
        try:
            await etcd.put("/kafscale/auth/k", b"v")
            assert (await etcd.get("/kafscale/auth/k")) is not None
            await etcd.put("/kafscale/auth/l", b"w")
            # A bounded page (Etcd.get_range calls aetcd's KV stub itself) carries the token.
            page, more = await etcd.get_range("/kafscale/auth/", "/kafscale/auth0", 1)
            assert [(kv.key, kv.value) for kv in page] == [("/kafscale/auth/k", b"v")] and more
        finally:
            await etcd.close()
        with pytest.raises(MetadataError):
            await Etcd.connect([url], 2.0, username="kafscale", password="wrong")
    finally:
        process.kill()
        process.wait(10)
