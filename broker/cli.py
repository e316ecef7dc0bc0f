"""The ``kafscale`` command: ``broker``, ``proxy``, ``local``, ``operator``, ``drain``, ``acls``,
``users``, ``status``, ``config-reference``.

One image runs every component; the subcommand picks which.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from kafscale.broker import drain_hook
from kafscale.broker.authz.cli import add_acls_parser, run_acls
from kafscale.broker.config import BrokerSettings
from kafscale.broker.import_gc import collection_paused
from kafscale.broker.memory import freeze_startup_objects, tune_allocator
from kafscale.broker.metadata.etcd_channel import BadEndpoint
from kafscale.broker.metadata.etcd_connect import connect_etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.logs import setup_logging
from kafscale.broker.observability.metrics import METRICS
from kafscale.broker.settings_check import (
    describe_errors,
    misspelt_variables,
    unparsable_variables,
)
from kafscale.broker.settings_cli import (
    S,
    add_settings_flags,
    build_model,
    full_reference_markdown,
    overrides_from_args,
    update_readme,
)
from kafscale.broker.startup_error import RunError, SettingError, StartupError
from kafscale.broker.stop_deadline import stop_bound_s, stop_within
from kafscale.broker.users_cli import add_users_parser, run_users

if TYPE_CHECKING:
    from kafscale.broker.observability.status import ClusterStatus
    from kafscale.broker.proxy.config import ProxySettings
    from kafscale.broker.settings_combinations import Combinations

log = logging.getLogger("kafscale")

DEFAULT_LOCAL_PORT = 9092
DEFAULT_LOCAL_HOST = "127.0.0.1"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser(next((arg for arg in argv if not arg.startswith("-")), ""))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handler = {
        "broker": _cmd_broker,
        "proxy": _cmd_proxy,
        "local": _cmd_local,
        "operator": _cmd_operator,
        "drain": drain_hook.drain,
        "status": _cmd_status,
        "config-reference": _cmd_config_reference,
        "users": _cmd_users,
        "acls": _cmd_acls,
    }[args.command]
    return int(handler(args))


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; the settings flags (a hundred or so per command) only on
    ``command``'s parser, or on every command's when None. Building them all, and importing
    the proxy's settings for them, cost every broker start ~40 ms of CPU on a busy machine."""

    def settings_flags(name: str) -> Callable[..., None]:
        return add_settings_flags if command is None or command == name else _no_flags

    parser = argparse.ArgumentParser(prog="kafscale", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    broker = commands.add_parser("broker", help="run one broker (configured by env and flags)")
    settings_flags("broker")(broker)
    proxy = commands.add_parser(
        "proxy", help="run the lease-aware proxy: one Kafka endpoint in front of the brokers"
    )
    if command is None or command == "proxy":
        from kafscale.broker.proxy.config import ProxySettings

        add_settings_flags(proxy, ProxySettings)
    local = commands.add_parser("local", help="run a whole cluster on this machine")
    local.add_argument("--data-dir", type=Path, default=Path("data"), help="where data lives")
    local.add_argument("--brokers", type=int, default=1, help="number of brokers")
    local.add_argument(
        "--port",
        type=int,
        default=None,
        help="first broker's Kafka port (with --proxy: the proxy's, brokers on the next ports; "
        "default 9092)",
    )
    local.add_argument(
        "--proxy", action="store_true", help="put the lease-aware proxy in front of the brokers"
    )
    local.add_argument(
        "--host", default=None, help="address the brokers bind to (default 127.0.0.1)"
    )
    local.add_argument("--s3-endpoint", default=None, help="use this S3 endpoint, not a dir")
    local.add_argument(
        "--bucket", default=None, help="S3 bucket (with --s3-endpoint; refused without one)"
    )
    local.add_argument(
        "--etcd-binary",
        type=Path,
        default=None,
        help="the etcd executable to run (default: $KAFSCALE_ETCD_BINARY, else the first etcd "
        "on PATH or /usr/bin/etcd that keeps acked writes through a crash, else the bundled "
        "3.5.1)",
    )
    settings_flags("local")(local)
    commands.add_parser("operator", help="run the Kubernetes operator")
    drain = commands.add_parser("drain", help="ask a broker to hand its partitions over")
    drain_hook.add_arguments(drain)
    add_users_parser(commands, settings_flags("users"))
    add_acls_parser(commands, settings_flags("acls"))
    status = commands.add_parser(
        "status",
        help="brokers, partition owners, groups and their lag (from etcd and the brokers' "
        "admin ports; etcd and cluster from the broker's variables and flags)",
    )
    status.add_argument("--json", action="store_true", help="print JSON, not tables")
    settings_flags("status")(status)
    reference = commands.add_parser(
        "config-reference", help="print the configuration reference (Markdown)"
    )
    reference.add_argument(
        "--update", type=Path, default=None, help="rewrite this README's reference section"
    )
    return parser


def _no_flags(parser: argparse.ArgumentParser, model: object = None) -> None:
    """``add_settings_flags`` for a command that is not the one being run."""


def _setup_logging(settings: BrokerSettings | ProxySettings) -> None:
    """Logging and the process's metrics switch, from the settings."""
    setup_logging(settings.log_level, settings.log_format)
    METRICS.enabled = settings.metrics_enabled


def _load_settings(args: argparse.Namespace) -> BrokerSettings | None:
    overrides = overrides_from_args(args)
    if getattr(args, "s3_endpoint", None):
        storage = overrides.setdefault("storage", {})
        storage.update(kind="s3", endpoint=args.s3_endpoint)
    if getattr(args, "bucket", None):  # with --s3-endpoint or --storage-endpoint (local_flags)
        overrides.setdefault("storage", {})["bucket"] = args.bucket
    return _checked_settings(BrokerSettings, overrides)


def _checked_settings(model: type[S], overrides: dict[str, Any]) -> S | None:
    """``model`` from the environment and flags, or None after one line per mistake on stderr
    (a misspelt variable that would be ignored, a value or name the model refuses)."""
    problems = misspelt_variables(os.environ, [model])
    if problems:  # not if it is the other command's: a broker's and a proxy's share variables
        from kafscale.broker.proxy.config import ProxySettings  # a plain broker does not load it

        problems = misspelt_variables(os.environ, [BrokerSettings, ProxySettings])
    problems = problems or unparsable_variables(os.environ, model)
    if not problems:
        try:
            return build_model(model, overrides)
        except ValidationError as exc:
            problems = describe_errors(exc, model)
    for problem in problems:
        print(f"kafscale: invalid configuration: {problem}", file=sys.stderr)
    return None


def _combinations_allowed(combinations: Combinations) -> bool:
    """False after one line per refused combination of settings on stderr (as any other
    configuration mistake: before logging is set up, so the line is the only output)."""
    for problem in combinations.refused:
        print(f"kafscale: invalid configuration: {problem}", file=sys.stderr)
    return not combinations.refused


def _warn_combinations(combinations: Combinations) -> None:
    for warning in combinations.warned:
        log.warning("configuration: %s", warning)


def _cmd_broker(args: argparse.Namespace) -> int:
    settings = _load_settings(args)
    if settings is None:
        return 2
    from kafscale.broker.settings_combinations import broker_combinations

    combinations = broker_combinations(settings)
    if not _combinations_allowed(combinations):
        return 2
    _setup_logging(settings)
    _warn_combinations(combinations)
    tune_allocator()
    return _run(_serve_broker(settings))


async def _serve_broker(settings: BrokerSettings) -> None:
    # Imported here: the broker (its API table, coordinators, storage) is most of the import
    # time of every command, and drain (a pod's preStop hook), users, acls or status need none.
    with collection_paused():  # see import_gc: collecting during imports frees almost nothing
        from kafscale.broker.app import Broker

    await _serve_until_signalled(
        await Broker.start(settings, pod_name=os.environ.get("KAFSCALE_POD_NAME")),
        settings.limits.shutdown_grace_s,
    )


class _Service(Protocol):
    async def shutdown(self) -> None: ...


async def _serve_until_signalled(service: _Service, shutdown_grace_s: float) -> None:
    """Serve until SIGINT or SIGTERM, then shut ``service`` down (its own graceful order),
    exiting by ``stop_bound_s`` after the signal even if that shutdown does not end."""
    freeze_startup_objects()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await stop_within(service.shutdown, stop_bound_s(shutdown_grace_s))


def _cmd_proxy(args: argparse.Namespace) -> int:
    from kafscale.broker.proxy.config import ProxySettings
    from kafscale.broker.settings_combinations import proxy_combinations

    settings = _checked_settings(ProxySettings, overrides_from_args(args, ProxySettings))
    if settings is None:
        return 2
    combinations = proxy_combinations(settings)
    if not _combinations_allowed(combinations):
        return 2
    _setup_logging(settings)
    _warn_combinations(combinations)
    return _run(_serve_proxy(settings))


async def _serve_proxy(settings: ProxySettings) -> None:
    # Imported here, as for the other commands: a broker need not load the proxy's modules.
    with collection_paused():  # see import_gc
        from kafscale.broker.proxy.app import Proxy

    await _serve_until_signalled(await Proxy.start(settings), settings.limits.shutdown_grace_s)


def _cmd_local(args: argparse.Namespace) -> int:
    settings = _load_settings(args)
    if settings is None:
        return 2
    from kafscale.broker.local_flags import (
        LocalFlags,
        ignored_flags,
        listener_flag_clashes,
    )

    port = DEFAULT_LOCAL_PORT if args.port is None else args.port
    host = DEFAULT_LOCAL_HOST if args.host is None else args.host
    flags = LocalFlags(
        overrides_from_args(args),
        args.bucket,
        args.s3_endpoint,
        args.brokers,
        port,
        args.proxy,
        host,
        port_given=args.port is not None,
        host_given=args.host is not None,
    )
    listeners = [(item.host, item.port) for item in settings.listener_plan()]
    refused, warned = listener_flag_clashes(flags, listeners if settings.listeners else [])
    problems = [*ignored_flags(flags, settings.storage), *refused]
    for problem in problems:
        print(f"kafscale: invalid configuration: {problem}", file=sys.stderr)
    if problems:
        return 2
    # Imported here: the proxy and the local PKI (cryptography) only ``local`` needs.
    with collection_paused():  # see import_gc
        from kafscale.broker.local import LocalOptions, run_local

    etcd_binary, etcd_problem = _named_etcd(args)
    if etcd_problem is not None:
        print(f"kafscale: invalid configuration: {etcd_problem}", file=sys.stderr)
        return 2
    _setup_logging(settings)
    for warning in warned:
        log.warning("configuration: %s", warning)
    tune_allocator()
    options = LocalOptions(args.data_dir, args.brokers, port, host, args.proxy, etcd_binary)
    return _run(run_local(settings, options))


def _named_etcd(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """The etcd ``kafscale local`` was told to run (None: it picks one), and why it cannot
    run at all (a path that is not there or not executable: a bad setting, exit 2)."""
    from kafscale.broker.metadata.etcd_binary import BINARY_ENV, named_etcd, named_etcd_problem

    binary = named_etcd(args.etcd_binary, os.environ)
    named_by = "--etcd-binary" if args.etcd_binary is not None else BINARY_ENV
    return binary, None if binary is None else named_etcd_problem(binary, named_by)


def _run(coroutine: object) -> int:
    import uvloop

    try:
        uvloop.run(coroutine)  # type: ignore[arg-type]
    except SettingError as exc:
        print(f"kafscale: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"kafscale: cannot start: {exc}", file=sys.stderr)
        return 1
    except RunError as exc:
        print(f"kafscale: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from kafscale.operator.main import run_operator

    run_operator()
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    settings = _load_settings(args)
    if settings is None:
        return 2
    # Imported here: only ``status`` reads other brokers' metrics.
    from kafscale.broker.observability.status import read_status, render, scrape_metrics

    async def read() -> ClusterStatus:
        try:
            etcd = await connect_etcd(settings.etcd, retry_level=logging.DEBUG)
        except BadEndpoint as exc:
            raise StartupError(f"etcd is not usable: {exc}") from exc
        except MetadataUnavailable as exc:
            raise StartupError(f"etcd is not reachable: {exc}") from exc
        try:
            return await read_status(etcd, settings.cluster, scrape_metrics)
        except MetadataUnavailable as exc:
            raise StartupError(f"etcd is not reachable: {exc}") from exc
        finally:
            await etcd.close()

    try:
        status = asyncio.run(read())
    except StartupError as exc:
        print(f"kafscale status: {exc}", file=sys.stderr)
        return 1
    print(status.to_json() if args.json else render(status), end="" if not args.json else "\n")
    return 0


def _cmd_users(args: argparse.Namespace) -> int:
    settings = _load_settings(args)
    if settings is None:
        return 2
    return run_users(settings, args)


def _cmd_acls(args: argparse.Namespace) -> int:
    settings = _load_settings(args)
    return 2 if settings is None else run_acls(args, settings)


def _cmd_config_reference(args: argparse.Namespace) -> int:
    if args.update is None:
        print(full_reference_markdown())
    else:
        args.update.write_text(update_readme(args.update.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
