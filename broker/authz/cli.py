"""``kafscale acls add|list|remove``: ACL bindings written straight to etcd.

Kafka's admin clients (CreateAcls, DescribeAcls, DeleteAcls) are the primary interface, but
they need a principal already allowed to ALTER the cluster. This command is the bootstrap path
(as ``kafka-acls --bootstrap-controller`` is for Kafka): it talks to etcd with the broker's own
settings (``KAFSCALE_ETCD__*``, ``KAFSCALE_CLUSTER`` or the same flags), so whoever can reach
etcd can grant the first ACLs. Brokers pick changes up through their watch.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from kafscale.broker.authz.model import (
    CLUSTER_NAME,
    WILDCARD,
    AclBinding,
    AclFilter,
    InvalidBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    binding_of,
    filter_matches,
)
from kafscale.broker.authz.store import create_bindings, delete_matching, stored_bindings
from kafscale.broker.config import BrokerSettings
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.protocol.errors import KafkaError


def add_acls_parser(commands: Any, add_settings: Any) -> None:
    """``acls`` and its three actions on ``commands`` (argparse subparsers)."""
    acls = commands.add_parser("acls", help="add, list or remove ACL bindings (through etcd)")
    actions = acls.add_subparsers(dest="action", required=True)
    for action, text in (
        ("add", "store a binding"),
        ("list", "print bindings (every option narrows)"),
        ("remove", "delete the bindings the options match"),
    ):
        parser = actions.add_parser(action, help=text)
        _add_binding_flags(parser, action)
        add_settings(parser)


def _add_binding_flags(parser: argparse.ArgumentParser, action: str) -> None:
    # remove needs a resource too: a bare remove would delete every binding
    resource = parser.add_mutually_exclusive_group(required=action != "list")
    resource.add_argument("--topic", help="a topic name ('*': every topic)")
    resource.add_argument("--group", help="a consumer group id ('*': every group)")
    resource.add_argument("--transactional-id", help="a transactional id")
    resource.add_argument("--cluster-resource", action="store_true", help="the cluster")
    resource.add_argument(
        "--user-principal", help="a user, for CREATE_TOKENS/DESCRIBE_TOKENS (e.g. User:alice)"
    )
    resource.add_argument("--delegation-token", help="a delegation token id (for DESCRIBE)")
    parser.add_argument("--prefixed", action="store_true", help="the name is a prefix")
    parser.add_argument("--principal", help="e.g. User:alice ('User:*': everyone)")
    parser.add_argument("--host", help="client address ('*': any; the default for add)")
    parser.add_argument(
        "--operation", type=str.upper, choices=[o.name for o in Operation][2:], help="operation"
    )
    parser.add_argument("--deny", action="store_true", help="a DENY binding (default ALLOW)")


def _resource(args: argparse.Namespace) -> tuple[ResourceType, str | None]:
    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster_resource:
        return ResourceType.CLUSTER, CLUSTER_NAME
    if args.user_principal is not None:
        return ResourceType.USER, args.user_principal
    if args.delegation_token is not None:
        return ResourceType.DELEGATION_TOKEN, args.delegation_token
    return ResourceType.ANY, None


def binding_from_args(args: argparse.Namespace) -> AclBinding:
    resource_type, name = _resource(args)
    if args.principal is None or args.operation is None:
        raise InvalidBinding("add needs --principal and --operation")
    return binding_of(
        resource_type,
        name or "",
        PatternType.PREFIXED if args.prefixed else PatternType.LITERAL,
        args.principal,
        args.host or WILDCARD,
        Operation[args.operation],
        Permission.DENY if args.deny else Permission.ALLOW,
    )


def filter_from_args(args: argparse.Namespace) -> AclFilter:
    resource_type, name = _resource(args)
    pattern = PatternType.ANY
    if name is not None:
        pattern = PatternType.PREFIXED if args.prefixed else PatternType.LITERAL
    return AclFilter(
        resource_type,
        name,
        pattern,
        args.principal,
        args.host,
        Operation[args.operation] if args.operation else Operation.ANY,
        Permission.DENY if args.deny else Permission.ANY,
    )


def describe(binding: AclBinding) -> str:
    return "\t".join(
        [
            binding.resource_type.name,
            binding.pattern_type.name,
            binding.resource_name,
            binding.principal,
            binding.host,
            binding.operation.name,
            binding.permission.name,
        ]
    )


def run_acls(args: argparse.Namespace, settings: BrokerSettings) -> int:
    try:
        return asyncio.run(_run(args, settings))
    except InvalidBinding as exc:
        print(f"kafscale acls: {exc}", file=sys.stderr)
        return 2
    except (MetadataError, KafkaError) as exc:
        print(f"kafscale acls: etcd: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, settings: BrokerSettings) -> int:
    from kafscale.broker.metadata.etcd_connect import connect_etcd

    etcd = await connect_etcd(settings.etcd, retry_level=logging.DEBUG)
    try:
        if args.action == "add":
            await create_bindings(etcd, settings.cluster, [binding_from_args(args)])
            return 0
        if args.action == "list":
            stored = await stored_bindings(etcd, settings.cluster)
            acl_filter = filter_from_args(args)
            for binding in sorted(b for b in stored.values() if filter_matches(acl_filter, b)):
                print(describe(binding))
            return 0
        removed = await delete_matching(etcd, settings.cluster, [filter_from_args(args)])
        for binding in removed[0]:
            print(describe(binding))
        return 0
    finally:
        await etcd.close()
