"""``kafscale local``: a whole cluster on this machine, on embedded defaults.

A real etcd from the bundled binary, one or more brokers on localhost:9092 and up, and a
local-directory object store under the data directory (or a real S3 bucket). Data lives in the
data directory, so a restart finds every acknowledged record again. With ``--proxy`` the
lease-aware proxy takes the first port and the brokers the ports after it: clients need only
the proxy's address.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from kafscale.broker.app import Broker
from kafscale.broker.config import BrokerSettings, StorageKind
from kafscale.broker.memory import freeze_startup_objects
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.broker.proxy.app import Proxy
from kafscale.broker.proxy.config import ProxyEtcdSettings, ProxyListenerSettings, ProxySettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalOptions:
    data_dir: Path
    brokers: int
    port: int
    host: str
    proxy: bool = False

    def broker_port(self, index: int) -> int:
        return self.port + index + (1 if self.proxy else 0)


def local_settings(
    base: BrokerSettings, options: LocalOptions, etcd_url: str, index: int
) -> BrokerSettings:
    """The settings of local broker ``index``: pure, so tests can check what local runs."""
    storage = base.storage
    if storage.endpoint is None and storage.kind is StorageKind.S3:
        storage = storage.model_copy(
            update={"kind": StorageKind.LOCAL, "local_dir": options.data_dir / "objects"}
        )
    listener = base.listener.model_copy(
        update={
            "host": options.host,
            "port": options.broker_port(index),
            "advertised_host": base.listener.advertised_host or "localhost",
            "admin_port": 0
            if base.listener.admin_port == 8080
            else base.listener.admin_port + index,
        }
    )
    etcd = base.etcd.model_copy(update={"endpoints": (etcd_url,)})
    return base.model_copy(update={"storage": storage, "listener": listener, "etcd": etcd})


def local_proxy_settings(
    base: BrokerSettings, options: LocalOptions, etcd_url: str
) -> ProxySettings:
    """The local proxy's settings: the given port, the brokers' cluster, etcd and limits."""
    listener = ProxyListenerSettings(
        host=options.host,
        port=options.port,
        advertised_host=base.listener.advertised_host or "localhost",
        admin_port=0,
    )
    return ProxySettings(
        cluster=base.cluster,
        listener=listener,
        etcd=ProxyEtcdSettings(endpoints=(etcd_url,), timeout_s=base.etcd.timeout_s),
        limits=base.limits,
        log_level=base.log_level,
    )


async def run_local(base: BrokerSettings, options: LocalOptions) -> None:
    options.data_dir.mkdir(parents=True, exist_ok=True)
    etcd = EmbeddedEtcd(data_dir=options.data_dir / "etcd")
    await asyncio.to_thread(etcd.start)
    brokers: list[Broker] = []
    proxy: Proxy | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        for index in range(options.brokers):
            settings = local_settings(base, options, etcd.client_url, index)
            if settings.storage.kind is StorageKind.S3:
                from kafscale.broker.storage.s3 import S3ObjectStore

                store = S3ObjectStore.from_settings(settings.storage)
                await store.create_bucket_if_missing()
                await store.close()
            brokers.append(await Broker.start(settings))
        if options.proxy:
            proxy = await Proxy.start(local_proxy_settings(base, options, etcd.client_url))
        freeze_startup_objects()
        _print_banner(options, brokers, etcd.client_url)
        await stop.wait()
        print("\nshutting down: flushing and handing over partitions...", flush=True)
    finally:
        if proxy is not None:
            await proxy.shutdown()
        await asyncio.gather(*(b.shutdown() for b in brokers), return_exceptions=True)
        await asyncio.to_thread(etcd.stop)


def _print_banner(options: LocalOptions, brokers: list[Broker], etcd_url: str) -> None:
    broker_ports = [options.broker_port(i) for i in range(len(brokers))]
    if options.proxy:
        bootstrap = f"localhost:{options.port}"
        behind = f" behind the proxy, on ports {', '.join(map(str, broker_ports))}"
    else:
        bootstrap = ",".join(f"localhost:{port}" for port in broker_ports)
        behind = ""
    store = brokers[0].settings.storage
    where = (
        f"s3 {store.endpoint} bucket {store.bucket}"
        if store.kind is StorageKind.S3
        else str(store.local_dir)
    )
    print(
        "\n"
        "  KafScale is running.\n"
        f"  bootstrap.servers = {bootstrap}\n"
        f"  brokers           = {len(brokers)} (node ids "
        f"{', '.join(str(b.node_id) for b in brokers)}){behind}\n"
        f"  etcd              = {etcd_url} (data in {options.data_dir / 'etcd'})\n"
        f"  object storage    = {where}\n"
        "\n"
        f"  Try: kcat -b localhost:{options.port} -L\n"
        "  Ctrl-C stops it cleanly; data survives a restart.\n",
        flush=True,
    )
