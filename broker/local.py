"""``kafscale local``: a whole cluster on this machine, on embedded defaults.

A real etcd (one that keeps acknowledged writes through a crash when the machine has one, else
the bundled binary: ``etcd_binary``), one or more brokers on localhost:9092 and up, and a
local-directory object store under the data directory (or a real S3 bucket). Data lives in the
data directory, so a restart finds every acknowledged record again. With ``--proxy`` the
lease-aware proxy takes the first port and the brokers the ports after it: clients need only
the proxy's address. The listener and security settings given (``--listeners``, TLS, SASL) are
then the proxy's: it is where clients log in, and the brokers behind it serve only the proxy.
With the authorizer on, the brokers listen with TLS and accept only the proxy's certificate
(made at start-up, ``local_pki``), so only the proxy may forward its clients' principals.

The etcd child dies with this process, however it dies (see ``embedded_etcd``), and one left
over from an older run on the same data directory is stopped before ours starts; a run that
is still going holds the directory (``data_dir_lock``) and a second start on it is refused.
Every start-up failure is one line on stderr and a non-zero exit (``StartupError``), never a
traceback.
Ctrl-C (SIGINT) or SIGTERM stops every part gracefully and together, within the one
``limits.shutdown_grace_s`` from the signal (``_stop_all``), and the whole command exits within
that grace + 5 s however a part hangs (``stop_deadline``, as ``kafscale broker``). An etcd
that ends while the cluster runs (killed, crashed) stops the cluster the same way, and the
command then says so in one line and exits 1 (``RunError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import shlex
import signal
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafscale.broker.app import Broker, StartupError
from kafscale.broker.config import BrokerSettings, StorageKind, TlsSettings
from kafscale.broker.data_dir_lock import data_dir_claimed
from kafscale.broker.free_ports import ports_free
from kafscale.broker.memory import freeze_startup_objects
from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd, EtcdBinaryNotFound, EtcdStartError
from kafscale.broker.metadata.etcd_binary import (
    EtcdBinaryUnusable,
    EtcdChoice,
    data_etcd_version,
    describe_etcd,
    find_local_etcd,
    later_release,
    no_etcd_exit,
    remember_data_version,
)
from kafscale.broker.proxy.app import Proxy
from kafscale.broker.proxy.config import (
    ProxyEtcdSettings,
    ProxyListenerSettings,
    ProxySettings,
    UpstreamSettings,
)
from kafscale.broker.security.listeners import (
    ALL_INTERFACES,
    DEFAULT_PROTOCOL_MAP,
    ClientAuth,
    SecurityProtocol,
)
from kafscale.broker.security.local_pki import (
    BROKER_PRINCIPAL,
    PROXY_PRINCIPAL,
    LocalPki,
    make_local_pki,
)
from kafscale.broker.startup_error import RunError, SettingError
from kafscale.broker.stop_deadline import stop_bound_s, stop_within
from kafscale.broker.storage.object_store import ObjectStoreError

log = logging.getLogger(__name__)

ETCD_PORTS_FILE = "ports.json"  # beside etcd's own data directory
ETCD_CHECK_INTERVAL_S = 0.5  # how often the running cluster checks that its etcd still runs


@dataclass(frozen=True, slots=True)
class LocalOptions:
    data_dir: Path
    brokers: int
    port: int
    host: str
    proxy: bool = False
    etcd_binary: Path | None = None
    """The etcd to run (``--etcd-binary``); None: ``find_local_etcd`` picks one."""

    def broker_port(self, index: int) -> int:
        return self.port + index + (1 if self.proxy else 0)

    def listen_ports(self) -> range:
        """The proxy's port (with ``proxy``) and the brokers'."""
        return range(self.port, self.broker_port(self.brokers))


def check_options(base: BrokerSettings, options: LocalOptions) -> None:
    """Refuse what cannot work before anything starts: ``--listeners`` are one process's
    listeners, so several brokers without the proxy would all bind the same ports (the second
    failed with "address already in use", naming its sibling's port)."""
    if base.listeners and options.brokers > 1 and not options.proxy:
        raise StartupError(
            f"--listeners are one broker's listeners: with --brokers {options.brokers}, add "
            "--proxy (the listeners become the proxy's, where clients connect) or leave "
            "--listeners out (the brokers then take --port and the ports after it)"
        )


def promised_ports(base: BrokerSettings, options: LocalOptions) -> frozenset[int]:
    """Every port the user gave or the local cluster will listen on: etcd, started before any
    of it listens, keeps off them all (a free-port probe cannot see a port nobody binds yet).

    The proxy's and brokers' Kafka ports (``listen_ports``), the ports of the given listeners
    (``--listeners``: the brokers' or, with the proxy, the proxy's), ``--listener-port`` (which
    ``--port`` overrides here: kept free all the same), and the brokers' admin ports
    (``--listener-admin-port`` and the next ones). Port 0 is no promise: the kernel then picks
    one from its ephemeral range, which etcd's ports are never taken from.
    """
    ports = {*options.listen_ports(), base.listener.port}
    ports |= {listener.port for listener in base.listener_plan()}
    for index in range(options.brokers):
        settings = local_settings(base, options, "http://127.0.0.1:2379", index)
        ports |= {listener.port for listener in settings.listener_plan()}
        ports.add(settings.listener.admin_port)
    return frozenset(ports - {0})


def local_settings(
    base: BrokerSettings,
    options: LocalOptions,
    etcd_url: str,
    index: int,
    pki: LocalPki | None = None,
) -> BrokerSettings:
    """The settings of local broker ``index``: pure, so tests can check what local runs.
    Behind the proxy, the given listeners are the proxy's; with ``pki`` the broker's one
    listener requires the proxy's certificate, and trusts it to forward principals."""
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
    update: dict[str, object] = {"storage": storage, "listener": listener, "etcd": etcd}
    if options.proxy:
        update |= behind_proxy(base, options, index, pki)
    return base.model_copy(update=update)


def behind_proxy(
    base: BrokerSettings, options: LocalOptions, index: int, pki: LocalPki | None
) -> dict[str, object]:
    """What a broker behind the local proxy changes: none of the given listeners (the
    proxy's); with ``pki`` one SSL listener requiring a certificate of the local CA: the
    proxy's or the brokers' own (their markers and transaction checks), both super users."""
    plain: dict[str, object] = {
        "listeners": None,
        "advertised_listeners": None,
        "listener_security_protocol_map": DEFAULT_PROTOCOL_MAP,
        "internal_listener_name": None,
        "tls": TlsSettings(),
    }
    if pki is None:
        return plain
    port = options.broker_port(index)
    authorizer = base.authorizer.model_copy(
        update={"super_users": (*base.authorizer.super_users, PROXY_PRINCIPAL, BROKER_PRINCIPAL)}
    )
    return plain | {
        "listeners": f"INTERNAL://{options.host}:{port}",
        "advertised_listeners": f"INTERNAL://{internal_host(options)}:{port}",
        "listener_security_protocol_map": "INTERNAL:SSL",
        "tls": TlsSettings(
            cert_file=pki.broker_cert,
            key_file=pki.broker_key,
            ca_file=pki.ca_file,
            client_auth=ClientAuth.REQUIRED,
        ),
        "authorizer": authorizer,
    }


def internal_host(options: LocalOptions) -> str:
    """The address brokers behind the proxy register (the proxy's way to them)."""
    return "127.0.0.1" if options.host in ALL_INTERFACES else options.host


def local_proxy_settings(
    base: BrokerSettings, options: LocalOptions, etcd_url: str, pki: LocalPki | None = None
) -> ProxySettings:
    """The local proxy's settings: the given port (or listeners, TLS and SASL), the brokers'
    cluster, etcd, limits and authorizer; with ``pki`` it reaches them with its certificate."""
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
        listeners=base.listeners,
        advertised_listeners=base.advertised_listeners,
        listener_security_protocol_map=base.listener_security_protocol_map,
        tls=base.tls,
        sasl=base.sasl,
        authorizer=base.authorizer,
        upstream=UpstreamSettings()
        if pki is None
        else UpstreamSettings(
            security_protocol=SecurityProtocol.SSL,
            ca_file=pki.ca_file,
            cert_file=pki.proxy_cert,
            key_file=pki.proxy_key,
        ),
        log_level=base.log_level,
        log_format=base.log_format,
        metrics_enabled=base.metrics_enabled,
    )


def storage_startup_message(error: ObjectStoreError, settings: BrokerSettings) -> str:
    """The one line that tells a user what is wrong with the S3 store and what to do."""
    text = str(error)
    if "credentials" in text.lower():
        return (
            f"no S3 credentials for {settings.storage.endpoint}: set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or --storage-access-key-id and --storage-secret-access-key)"
        )
    return f"object storage is not usable: {text}"


def etcd_choice_level(choice: EtcdChoice) -> int:
    """How loudly to log the etcd chosen: WARNING for a buggy etcd the user named (they chose
    it and should hear what it risks), INFO otherwise (the bundled one's risk included: a user
    of ``make local`` did not pick it, and the line says how to get a durable one)."""
    return logging.WARNING if choice.given and choice.warning else logging.INFO


def say_etcd_choice(choice: EtcdChoice) -> None:
    """One log line: the etcd run, and what it risks if it can lose acknowledged writes. Said
    once the cluster runs, with the banner: a failed start stays one line on stderr."""
    if choice.warning is None:
        log.info("running %s", choice.describe())
    else:
        log.log(etcd_choice_level(choice), "running %s: %s", choice.describe(), choice.warning)


async def start_etcd(
    data_dir: Path, avoid_ports: Collection[int] = (), etcd_binary: Path | None = None
) -> tuple[EmbeddedEtcd, EtcdChoice]:
    """Our etcd (``etcd_binary``, else the one ``find_local_etcd`` picks), healthy, on ports of
    its own apart from ``avoid_ports``, and that choice; a stale one on the same directory is
    stopped first.

    Launched from the event loop's thread (not a worker thread): the kernel kills an etcd
    started with ``die_with_parent`` when the thread that forked it exits.
    """
    try:
        data_version = await asyncio.to_thread(data_etcd_version, data_dir)
        choice = await asyncio.to_thread(find_local_etcd, etcd_binary, data_version)
    except (EtcdBinaryUnusable, EtcdBinaryNotFound) as exc:
        raise StartupError(f"cannot start etcd: {exc}") from exc
    client_port, peer_port = remembered_ports(data_dir, avoid_ports)
    try:
        etcd = EmbeddedEtcd(
            data_dir=data_dir,
            die_with_parent=True,
            client_port=client_port,
            peer_port=peer_port,
            avoid_ports=avoid_ports,
            binary=choice.path,
            version=choice.version,
        )
        stale = await asyncio.to_thread(etcd.stop_stale)
        if stale:
            print(f"stopped an etcd left running on {etcd.etcd_dir} (pid {stale[0]})", flush=True)
        etcd.launch()
    except (EtcdBinaryNotFound, OSError) as exc:
        raise StartupError(f"cannot start etcd: {exc}") from exc
    except EtcdStartError as exc:
        raise StartupError(exc.summary) from exc
    try:
        await etcd.wait_healthy_async()
    except EtcdStartError as exc:
        no_etcd = no_etcd_exit(choice.path, etcd.exit_status, etcd.log_since_launch())
        etcd.kill()
        if choice.given and no_etcd is not None:
            raise SettingError(no_etcd) from exc
        raise StartupError(exc.summary) from exc
    except BaseException:
        etcd.kill()
        raise
    remember_ports(data_dir, etcd)
    remember_data_version(data_dir, later_release(data_version, choice.version))
    return etcd, choice


def remembered_ports(etcd_home: Path, avoid: Collection[int]) -> tuple[int | None, int | None]:
    """The client and peer ports of the last run's etcd, if both are free and promised to no
    broker: the address the banner printed, which a user pasted into a Spark job or a
    ``kafscale status`` command, then stays the same across restarts. (None, None): new ones."""
    try:
        saved = json.loads((etcd_home / ETCD_PORTS_FILE).read_text())
        ports = (int(saved["client"]), int(saved["peer"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None, None
    if not set(ports).isdisjoint(avoid) or not ports_free(ports):
        return None, None
    return ports


def remember_ports(etcd_home: Path, etcd: EmbeddedEtcd) -> None:
    """Keep ``etcd``'s ports for the next start (``remembered_ports``); best effort."""
    with contextlib.suppress(OSError):
        (etcd_home / ETCD_PORTS_FILE).write_text(
            json.dumps({"client": etcd.client_port, "peer": etcd.peer_port})
        )


async def _prepare_bucket(settings: BrokerSettings) -> None:
    from kafscale.broker.storage.s3 import S3ObjectStore

    store = S3ObjectStore.from_settings(settings.storage)
    try:
        await store.create_bucket_if_missing()
    except ObjectStoreError as exc:
        raise StartupError(storage_startup_message(exc, settings)) from exc
    finally:
        await store.close()


async def run_local(base: BrokerSettings, options: LocalOptions) -> None:
    """Start etcd, the brokers and the proxy; serve until SIGINT or SIGTERM; stop them all.

    The stop (after start-up, or cutting a start-up short) is bounded as a broker's is
    (``stop_deadline``): every part is given ``stop_bound_s(limits.shutdown_grace_s)`` from
    the signal, and a part that hangs past it (etcd frozen, a watch that never ends) no longer
    keeps the whole command alive: it exits with ``EXIT_STOP_DEADLINE`` and the kernel sends
    the etcd child SIGTERM (``die_with_parent``), after ``EmbeddedEtcd.wake`` made sure a
    frozen etcd can act on it."""
    check_options(base, options)
    try:
        options.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot use data directory {options.data_dir}: {exc}") from exc
    with data_dir_claimed(options.data_dir):  # before etcd: a running one's is not stale
        await _run_claimed(base, options)


async def _run_claimed(base: BrokerSettings, options: LocalOptions) -> None:
    """``run_local`` once this process holds the data directory."""
    etcd, choice = await start_etcd(
        options.data_dir / "etcd", promised_ports(base, options), options.etcd_binary
    )
    started = _Started()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    starting = asyncio.create_task(_start_all(base, options, etcd.client_url, started))
    etcd_ended: str | None = None
    try:
        if not await _started_unless_stopped(starting, stop):
            print("\ninterrupted during start-up; shutting down", flush=True)
            return
        freeze_startup_objects()
        say_etcd_choice(choice)
        _print_banner(options, started.brokers, etcd, started.proxy)
        etcd_ended = await _serve_until_stopped(stop, etcd)
        what = "etcd has ended" if etcd_ended else "flushing and handing over partitions..."
        print(f"\nshutting down: {what}", flush=True)
    finally:
        await stop_within(
            functools.partial(_stop_all, starting, started, etcd, loop.time()),
            stop_bound_s(base.limits.shutdown_grace_s),
            on_deadline=etcd.wake,
        )
    if etcd_ended:
        raise RunError(etcd_ended)


async def _serve_until_stopped(stop: asyncio.Event, etcd: EmbeddedEtcd) -> str | None:
    """Wait for Ctrl-C or SIGTERM (None), or for our etcd to end under the running cluster
    (killed, crashed, out of memory): then the line saying so. Nothing would start it again,
    so the brokers would log an interrupted watch a few times a second for good and time
    every request out, and the stop says why instead."""
    while not stop.is_set():
        status = etcd.exit_status
        if status is not None:
            return etcd_ended_message(status, etcd.log_path)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), ETCD_CHECK_INTERVAL_S)
    return None


def etcd_ended_message(status: int, log_path: Path) -> str:
    """What ``kafscale local`` says when its etcd ended with ``status`` (negative: a signal)."""
    if status < 0:
        how = f"was killed by {signal.Signals(-status).name}"
    else:
        how = f"exited with status {status}"
    return (
        f"etcd {how} while the cluster ran (its log: {log_path}); "
        "the cluster stopped: start kafscale local again"
    )


@dataclass
class _Started:
    brokers: list[Broker] = field(default_factory=list)
    proxy: Proxy | None = None


async def _start_all(
    base: BrokerSettings, options: LocalOptions, etcd_url: str, started: _Started
) -> None:
    pki = None
    if options.proxy and base.authorizer.enabled:
        hosts = [h for h in (options.host,) if h not in ALL_INTERFACES]
        try:
            pki = await asyncio.to_thread(make_local_pki, options.data_dir / "internal-tls", hosts)
        except OSError as exc:
            raise StartupError(f"cannot write the brokers' certificates: {exc}") from exc
    for index in range(options.brokers):
        settings = local_settings(base, options, etcd_url, index, pki)
        if settings.storage.kind is StorageKind.S3 and index == 0:
            await _prepare_bucket(settings)
        # run_local says what the etcd risks (say_etcd_choice): the brokers need not
        broker = await Broker.start(
            settings, cluster_size=options.brokers, etcd_warning_level=logging.DEBUG
        )
        started.brokers.append(broker)
    if options.proxy:
        started.proxy = await Proxy.start(local_proxy_settings(base, options, etcd_url, pki))


async def _started_unless_stopped(starting: asyncio.Task[None], stop: asyncio.Event) -> bool:
    """Wait for ``starting`` unless ``stop`` is set first (Ctrl-C during start-up). True if it
    finished; a start-up error propagates. A start cut short is cancelled by ``_stop_all``,
    under the stop's bound: shutting down does not wait for three brokers to finish starting,
    nor for one whose start hangs."""
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if starting.done():
        starting.result()
        return True
    return False


async def _stop_all(
    starting: asyncio.Task[None], started: _Started, etcd: EmbeddedEtcd, began_at: float
) -> None:
    """The graceful stop, every part within the one grace that began at ``began_at`` (the
    signal), so Ctrl-C ends within ``limits.shutdown_grace_s`` plus closing, however many
    brokers there are.

    A start still running ends first. Then no broker takes a partition, a group or a
    transactional id any more, nor writes a draining mark or an assignment (its siblings stop
    too: a partition handed to one would bump its epoch there only to be handed back at once;
    ``Broker.stop_acquiring``) and the proxy takes no new client. Then the proxy's requests in
    flight and every broker's stop (flush and release, then its requests in flight) run
    together to the same deadline: a request the proxy forwarded is still answered by its
    broker, which serves what it has read until the grace is over. Before, the proxy had a
    whole grace of its own and the brokers a second one after it, and a stop still making
    progress was cut at the bound (exit 124). etcd stops last: every part needs it until
    then."""
    if not starting.done():
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
    for broker in started.brokers:
        broker.stop_acquiring()
    if started.proxy is not None:
        await started.proxy.stop_accepting()
    parts = [broker.shutdown(began_at) for broker in started.brokers]
    if started.proxy is not None:
        parts.append(started.proxy.shutdown(began_at))
    for outcome in await asyncio.gather(*parts, return_exceptions=True):
        if isinstance(outcome, Exception):
            log.error("stopping a part of the local cluster failed", exc_info=outcome)
    await asyncio.to_thread(etcd.stop)


def _print_banner(
    options: LocalOptions, brokers: list[Broker], etcd: EmbeddedEtcd, proxy: Proxy | None
) -> None:
    etcd_url = etcd.client_url
    broker_ports = [options.broker_port(i) for i in range(len(brokers))]
    security = ""
    if proxy is not None:
        me = proxy.context.identity
        bootstrap = f"{me.host}:{me.port}"
        behind = f" behind the proxy, on ports {', '.join(map(str, broker_ports))}"
        protocol = proxy.settings.listener_plan()[0].protocol
        if protocol != "PLAINTEXT":
            security = (
                f"  security.protocol = {protocol} (users: kafscale users "
                f"--etcd-endpoints {etcd_url} create NAME --password-stdin)\n"
            )
    else:
        bootstrap = advertised_bootstrap([b.info for b in brokers if b.info is not None])
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
        f"{security}"
        f"  brokers           = {len(brokers)} (node ids "
        f"{', '.join(str(b.node_id) for b in brokers)}){behind}\n"
        f"  etcd              = {etcd_url} ({describe_etcd(etcd.binary, etcd.version)}; "
        f"data in {options.data_dir / 'etcd'})\n"
        f"  object storage    = {where}\n"
        "\n"
        f"  Try: kcat -b {bootstrap.split(',')[0]} -L\n"
        "  Ctrl-C stops it cleanly; data survives a restart.\n"
        "\n"
        "  Spark (pip install 'kafscale[spark]'):\n"
        f"{spark_python_line()}\n"
        f"{spark_snippet(brokers[0].settings, etcd_url, 'my-topic')}",
        flush=True,
    )


def advertised_bootstrap(brokers: Sequence[BrokerInfo]) -> str:
    """The ``bootstrap.servers`` to print: each broker's first listener as it registered it,
    which is what Metadata then tells clients (``--listener-advertised-host``,
    ``--advertised-listeners``). The banner used to say ``localhost:PORT`` whatever clients
    were told: a user who gave another name was shown one the brokers never answer with."""
    addresses = [
        info.listeners[0][1:] if info.listeners else (info.host, info.port) for info in brokers
    ]
    return ",".join(f"{host}:{port}" for host, port in addresses)


def spark_python_line(python: str = sys.executable) -> str:
    """The variable a Spark job needs before its session starts. Spark runs the Python that
    finds data sources (and its workers) as ``$PYSPARK_PYTHON``, else plain ``python3``: from a
    virtual environment that is not activated, that is the system's Python, which has no
    ``pyspark_kafscale``, and the read fails with Spark's DATA_SOURCE_NOT_FOUND. This process
    runs in the environment that has the package, so its interpreter is the one to name."""
    return f"    export PYSPARK_PYTHON={shlex.quote(python)}   # in the shell, before Spark starts"


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
