"""Fill ``share-groups/`` from the share groups a cluster stored before that range existed.

Every broker's cluster view learns share-group membership from ``share-groups/<group>``, which
the group coordinator writes with ``groups/<group>/metadata`` (``GroupStore.save_group``). A
cluster written by an older KafScale has share groups with only the metadata key: the first
broker of this version to start copies each of them over, once, in the background (the broker
calls this after it is ready; every view sees each copy as a watch event), then marks the
cluster done (``indexed/share-groups``), so later start-ups read nothing of ``groups/``.

Each copy is a transaction that holds only if the metadata key is still the one read and the
share-group key still absent: a coordinator of this version that saved the group meanwhile
wrote both, and its copy stands. Brokers starting together may both copy: each key is created
once, and the mark is written after every copy. (A coordinator of the older version, in a mixed
cluster during a rolling upgrade, does not write ``share-groups/``: membership changes it makes
after the copy reach brokers of this version when the group next moves to one of them.)
"""

from __future__ import annotations

import logging

from kafscale.broker.groups.store import GroupStore
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import create_revision_is, mod_revision_is, put_op

log = logging.getLogger(__name__)


async def index_share_groups(etcd: Etcd, cluster: str) -> int:
    """Copy every stored share group lacking its ``share-groups/`` key, unless the cluster is
    marked done; returns how many were copied."""
    marker = keys.share_groups_indexed_key(cluster)
    if await etcd.get(marker) is not None:
        return 0
    copied = 0
    async for entry in GroupStore(etcd, cluster).share_group_metadata():
        group = keys.group_from_key_part(entry.key.split("/")[-2])
        share_key = keys.share_group_key(cluster, group)
        unchanged = mod_revision_is(entry.key, entry.mod_revision)
        result = await etcd.txn(
            [unchanged, create_revision_is(share_key, 0)], [put_op(share_key, entry.value)]
        )
        copied += int(result.succeeded)
    await etcd.put(marker, b"1")
    if copied:
        log.info("share groups: %d stored before share-groups/ existed copied there", copied)
    return copied
