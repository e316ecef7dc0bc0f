"""``kafscale local``: a whole cluster on this machine, on embedded defaults.

A real etcd from the bundled binary, one or more brokers on localhost:9092 and up, and a
local-directory object store under the data directory (or a real S3 bucket). Data lives in the
data directory, so a restart finds every acknowledged record again.
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

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LocalOptions:
    data_dir: Path
    brokers: int
    port: int
    host: str


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
            "port": options.port + index,
            "advertised_host": base.listener.advertised_host or "localhost",
            "admin_port": 0
            if base.listener.admin_port == 8080
            else base.listener.admin_port + index,
        }
    )
    etcd = base.etcd.model_copy(update={"endpoints": (etcd_url,)})
    return base.model_copy(update={"storage": storage, "listener": listener, "etcd": etcd})


async def run_local(base: BrokerSettings, options: LocalOptions) -> None:
    options.data_dir.mkdir(parents=True, exist_ok=True)
    etcd = EmbeddedEtcd(data_dir=options.data_dir / "etcd")
    await asyncio.to_thread(etcd.start)
    brokers: list[Broker] = []
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
        freeze_startup_objects()
        _print_banner(options, brokers, etcd.client_url)
        await stop.wait()
        print("\nshutting down: flushing and handing over partitions...", flush=True)
    finally:
        await asyncio.gather(*(b.shutdown() for b in brokers), return_exceptions=True)
        await asyncio.to_thread(etcd.stop)


def _print_banner(options: LocalOptions, brokers: list[Broker], etcd_url: str) -> None:
    bootstrap = ",".join(f"localhost:{options.port + i}" for i in range(len(brokers)))
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
        f"{', '.join(str(b.node_id) for b in brokers)})\n"
        f"  etcd              = {etcd_url} (data in {options.data_dir / 'etcd'})\n"
        f"  object storage    = {where}\n"
        "\n"
        f"  Try: kcat -b localhost:{options.port} -L\n"
        "  Ctrl-C stops it cleanly; data survives a restart.\n"
        "\n"
        "  Spark (pip install 'kafscale[spark]'):\n"
        f"{spark_snippet(brokers[0].settings, etcd_url, 'my-topic')}",
        flush=True,
    )


def spark_snippet(settings: BrokerSettings, etcd_url: str, topic: str) -> str:
    """Ready-to-paste PySpark reading ``topic`` of this cluster straight from its storage."""
    store = settings.storage
    options = {"etcd.endpoints": etcd_url, "cluster": settings.cluster}
    if store.kind is StorageKind.LOCAL:
        options |= {"storage.kind": "local", "storage.local_dir": str(store.local_dir.resolve())}
    else:
        options |= {"storage.kind": "s3", "storage.bucket": store.bucket}
        options |= {"storage.endpoint": store.endpoint} if store.endpoint else {}
    if store.prefix:
        options["storage.prefix"] = store.prefix
    lines = ['    df = (spark.read.format("kafscale")']
    lines += [f'          .option("{name}", "{value}")' for name, value in options.items()]
    lines += [f'          .option("subscribe", "{topic}").load())', ""]
    return "\n".join(lines)
