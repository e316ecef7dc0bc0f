"""``kafscale users create|delete|list``: SCRAM users of a cluster, written to etcd directly.

The same store Kafka's admin API (AlterUserScramCredentials) writes, so either way works; this
one needs no running broker, only etcd (``--etcd-endpoints``, ``--cluster``, as for the
broker). Passwords are read from a file, from standard input or from a prompt, never from the
command line (other users of the machine could read it in the process list).
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import sys
from pathlib import Path
from typing import Any

from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.etcd_channel import BadEndpoint
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.security.credentials import CredentialStore
from kafscale.broker.security.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    ScramMechanism,
    new_credential,
)
from kafscale.broker.settings_cli import add_settings_flags

ALL_MECHANISMS = [m.sasl_name for m in ScramMechanism]


def add_users_parser(commands: Any, add_settings: Any = add_settings_flags) -> None:
    users = commands.add_parser("users", help="create, delete and list SCRAM users (in etcd)")
    actions = users.add_subparsers(dest="users_command", required=True)
    create = actions.add_parser("create", help="create a user or set a new password")
    create.add_argument("name")
    source = create.add_mutually_exclusive_group()
    source.add_argument("--password-file", type=Path, help="file whose first line is the password")
    source.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    create.add_argument(
        "--mechanism",
        action="append",
        choices=ALL_MECHANISMS,
        help="SCRAM mechanism (repeatable; default: both)",
    )
    create.add_argument("--iterations", type=int, default=MIN_ITERATIONS)
    delete = actions.add_parser("delete", help="delete a user's credentials")
    delete.add_argument("name")
    delete.add_argument("--mechanism", action="append", choices=ALL_MECHANISMS)
    actions.add_parser("list", help="list users and their mechanisms")
    add_settings(users)  # etcd and cluster flags, before the action: `users --cluster x list`


def run_users(settings: BrokerSettings, args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(settings, args))
    except (BadEndpoint, MetadataUnavailable) as exc:
        print(f"kafscale users: etcd is not reachable: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"kafscale users: {exc}", file=sys.stderr)
        return 2


def _mechanisms(names: list[str] | None) -> list[ScramMechanism]:
    chosen = [ScramMechanism.from_sasl_name(n) for n in (names or ALL_MECHANISMS)]
    return [m for m in chosen if m is not None]


def _password(args: argparse.Namespace) -> str:
    if args.password_file is not None:
        text = args.password_file.read_text().splitlines()
        password = text[0] if text else ""
    elif args.password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass(f"password for {args.name}: ")
    if not password:
        raise ValueError("empty password")
    return password


async def _run(settings: BrokerSettings, args: argparse.Namespace) -> int:
    from kafscale.broker.metadata.etcd_connect import connect_etcd

    etcd = await connect_etcd(settings.etcd, retry_level=logging.DEBUG)
    try:
        store = CredentialStore(etcd, settings.cluster)
        if args.users_command == "create":
            if not MIN_ITERATIONS <= args.iterations <= MAX_ITERATIONS:
                raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}")
            password = _password(args)
            for mechanism in _mechanisms(args.mechanism):
                credential = new_credential(password, mechanism, args.iterations)
                await store.put(args.name, mechanism, credential)
                print(f"{args.name}: {mechanism.sasl_name} set")
            return 0
        if args.users_command == "delete":
            deleted = [
                m.sasl_name for m in _mechanisms(args.mechanism) if await store.delete(args.name, m)
            ]
            if not deleted:
                print(f"kafscale users: no credentials for {args.name}", file=sys.stderr)
                return 1
            print(f"{args.name}: {', '.join(deleted)} deleted")
            return 0
        for name, mechanisms in sorted((await store.list()).items()):
            described = ", ".join(
                f"{m.sasl_name} ({it} iterations)" for m, it in mechanisms.items()
            )
            print(f"{name}\t{described}")
        return 0
    finally:
        await etcd.close()
