"""A group's own configs in etcd (``keys.group_config_key``): read, changed by compare-and-swap.

Any broker may change them (no group lease needed: they are an operator's settings, not the
coordinator's state, as in Kafka where the controller keeps them). Every broker's cluster view
follows the key through its watch, and a group's coordinator reads the view at each
ConsumerGroupHeartbeat, so a change applies from the next heartbeat of each member.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import decode_group_configs
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.metadata.etcd_txn import (
    delete_op,
    mod_revision_is,
    put_op,
)
from kafscale.broker.protocol.errors import ErrorCode, KafkaError, MetadataTimeout

ATTEMPTS = 5

Change = Callable[[Mapping[str, str]], dict[str, str]]
"""From a group's stored configs to the configs to store (it raises to refuse)."""


async def read_group_configs(etcd: Etcd, cluster: str, group: str) -> dict[str, str]:
    try:
        stored = await etcd.get(keys.group_config_key(cluster, group))
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    return {} if stored is None else decode_group_configs(stored.value)


async def update_group_configs(
    etcd: Etcd, cluster: str, group: str, change: Change
) -> dict[str, str]:
    """Apply ``change`` to the stored configs atomically; an empty result deletes the key."""
    key = keys.group_config_key(cluster, group)
    try:
        for _ in range(ATTEMPTS):
            stored = await etcd.get(key)
            current = {} if stored is None else decode_group_configs(stored.value)
            updated = change(current)
            if updated == current:
                return updated
            revision = 0 if stored is None else stored.mod_revision
            op = (
                put_op(key, json.dumps(updated, sort_keys=True).encode())
                if updated
                else delete_op(key)
            )
            result = await etcd.txn([mod_revision_is(key, revision)], [op])
            if result.succeeded:
                return updated
    except MetadataUnavailable as exc:
        raise MetadataTimeout(str(exc)) from exc
    raise KafkaError(f"the configs of group {group} kept changing", ErrorCode.REQUEST_TIMED_OUT)
