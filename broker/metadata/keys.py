"""Every etcd key and object-store key comes from a function here.

One builder per key means a key is spelt once: the writer and the reader of a key, the lease
taker and the lease releaser, can never disagree about its shape.

etcd (all under ``/kafscale/<cluster>/``)::

    brokers/<id>                     lease-bound registration (JSON)
    broker-ids/next                  node-id allocator
    topics/<name>                    topic id, partitions, configs (JSON)
    partitions/<topic>/<p>           high watermark, log start, leader epoch + history (JSON)
    leases/partitions/<topic>/<p>    owner broker id, bound to its session lease
    leases/groups/<group>            coordinator broker id, bound to its session lease
                                     (group ids percent-encoded: ``/`` becomes ``%2F``)
    assignment                       desired owner per partition, with a generation (JSON)
    draining/<id>                    broker asked to hand over its partitions
    groups/<group>/metadata          group state (JSON)
    groups/<group>/offsets/<topic>/<p>  committed offset (JSON)
    group-configs/<group>            a group's own configs, KIP-848 (JSON: name -> value)
    share-groups/<group>             a share group's metadata document again (the same bytes
                                     as ``groups/<group>/metadata``, written in the same
                                     transaction): what the cluster view follows for
                                     share-group membership, without watching ``groups/``
    indexed/share-groups             present once ``share-groups/`` holds every share group
                                     stored before it existed (``share_groups_index``)
    deleted-topics/<name>/<topic id> tombstone of a deleted topic until its objects are purged
    share-state/<group>/<topic>/<p>  a share-partition's delivery state, KIP-932 (JSON)
    producer-ids/next                producer id allocator (idempotent and transactional;
                                     idempotence state itself lives in ``partitions/``)
    transactions/<transactional id>  transaction state: producer id, epoch, state, partitions,
                                     groups, timeout (JSON; ids percent-encoded like group ids)
    leases/transactions/<txn id>     transaction coordinator's broker id, bound to its session
    groups/<group>/txn-offsets/<producer id>/<topic>/<p>
                                     an offset committed in a transaction, not yet visible
    users/<user>/scram/<mechanism>   SCRAM credential: salt, iterations, stored and server
                                     keys (JSON; user names percent-encoded like group ids)
    delegation-tokens/<token id>     a delegation token: owner, renewers, timestamps and its
                                     SCRAM credentials (JSON; never its HMAC)
    acls/<type>/<pattern>/<name>/<principal>/<host>/<operation>/<permission>
                                     one ACL binding (JSON); name, principal and host
                                     percent-encoded, the others Kafka's enum names
    quotas/users/<user>[/clients/<client id>]   client quotas of an entity (JSON: key ->
    quotas/clients/<client id>                  bytes/s); names percent-encoded, ``<default>``
                                                is the default entity (Kafka's ZooKeeper layout)

Object store (under the configured prefix)::

    <cluster>/topics/<topic>/<topic id>/<p>/<base offset 20 digits>-e<epoch>.kfs   segment
    <cluster>/topics/<topic>/<topic id>/<p>/<base offset 20 digits>-e<epoch>.idx   index
    <cluster>/topics/<topic>/<topic id>/<p>.aborted/<first 20 digits>-<last 20 digits>-e<epoch>.atx
                                     aborted-transaction index (spilled from the state)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import quote, unquote

ROOT = "/kafscale"


def cluster_prefix(cluster: str) -> str:
    return f"{ROOT}/{cluster}/"


def broker_key(cluster: str, broker_id: int) -> str:
    return f"{cluster_prefix(cluster)}brokers/{broker_id}"


def brokers_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}brokers/"


def broker_id_counter_key(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}broker-ids/next"


def topic_key(cluster: str, topic: str) -> str:
    return f"{cluster_prefix(cluster)}topics/{topic}"


def topics_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}topics/"


def deleted_topic_key(cluster: str, topic: str, topic_id: str) -> str:
    """A deleted topic's tombstone: present until its objects are deleted."""
    return f"{cluster_prefix(cluster)}deleted-topics/{topic}/{topic_id}"


def deleted_topics_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}deleted-topics/"


def partition_state_key(cluster: str, topic: str, partition: int) -> str:
    return f"{cluster_prefix(cluster)}partitions/{topic}/{partition}"


def partition_states_prefix(cluster: str, topic: str | None = None) -> str:
    base = f"{cluster_prefix(cluster)}partitions/"
    return base if topic is None else f"{base}{topic}/"


def partition_lease_key(cluster: str, topic: str, partition: int) -> str:
    return f"{cluster_prefix(cluster)}leases/partitions/{topic}/{partition}"


def partition_leases_prefix(cluster: str, topic: str | None = None) -> str:
    base = f"{cluster_prefix(cluster)}leases/partitions/"
    return base if topic is None else f"{base}{topic}/"


def group_key_part(group: str) -> str:
    """A group id as one key segment: ids may contain ``/``, keys must not split on it."""
    return quote(group, safe="")


def group_from_key_part(part: str) -> str:
    return unquote(part)


def group_lease_key(cluster: str, group: str) -> str:
    return f"{cluster_prefix(cluster)}leases/groups/{group_key_part(group)}"


def group_leases_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}leases/groups/"


def assignment_key(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}assignment"


def draining_key(cluster: str, broker_id: int) -> str:
    return f"{cluster_prefix(cluster)}draining/{broker_id}"


def draining_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}draining/"


def users_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}users/"


def scram_credential_key(cluster: str, user: str, mechanism: str) -> str:
    """A user's SCRAM credential for one mechanism (``SCRAM-SHA-512``)."""
    return f"{users_prefix(cluster)}{quote(user, safe='')}/scram/{mechanism}"


def delegation_tokens_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}delegation-tokens/"


def delegation_token_key(cluster: str, token_id: str) -> str:
    """One delegation token (ids are URL-safe base64, quoted all the same)."""
    return f"{delegation_tokens_prefix(cluster)}{quote(token_id, safe='')}"


def user_from_key(cluster: str, key: str) -> tuple[str, str] | None:
    """(user, mechanism) of a key under :func:`users_prefix`, or None."""
    parts = key.removeprefix(users_prefix(cluster)).split("/")
    if len(parts) != 3 or parts[1] != "scram":
        return None
    return unquote(parts[0]), parts[2]


def group_prefix(cluster: str, group: str) -> str:
    return f"{cluster_prefix(cluster)}groups/{group_key_part(group)}/"


def groups_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}groups/"


def group_config_key(cluster: str, group: str) -> str:
    """A group's own configs: beside its state, not under it, so that loading, listing and
    deleting the group (its ``groups/<group>/`` prefix, fenced by its lease) leave them be,
    and any broker can write them without the group's lease, as Kafka's controller does."""
    return f"{group_configs_prefix(cluster)}{group_key_part(group)}"


def group_configs_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}group-configs/"


def share_group_key(cluster: str, group: str) -> str:
    """A share group's metadata, again, outside ``groups/``: every broker's cluster view follows
    share-group membership through these keys, so it need not watch every committed offset."""
    return f"{share_groups_prefix(cluster)}{group_key_part(group)}"


def share_groups_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}share-groups/"


def share_groups_indexed_key(cluster: str) -> str:
    """Written once ``share-groups/`` was filled from the groups stored before it existed."""
    return f"{cluster_prefix(cluster)}indexed/share-groups"


def group_metadata_key(cluster: str, group: str) -> str:
    return f"{group_prefix(cluster, group)}metadata"


def group_offset_key(cluster: str, group: str, topic: str, partition: int) -> str:
    return f"{group_prefix(cluster, group)}offsets/{topic}/{partition}"


def group_offsets_prefix(cluster: str, group: str) -> str:
    return f"{group_prefix(cluster, group)}offsets/"


def share_state_key(cluster: str, group: str, topic: str, partition: int) -> str:
    """A share-partition's state (KIP-932): written by the partition's owner, fenced by the
    partition lease, so it sits apart from the group's prefix (which its coordinator fences)."""
    return f"{share_states_prefix(cluster, group)}{topic}/{partition}"


def share_states_prefix(cluster: str, group: str | None = None) -> str:
    base = f"{cluster_prefix(cluster)}share-state/"
    return base if group is None else f"{base}{group_key_part(group)}/"


def producer_id_counter_key(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}producer-ids/next"


def transaction_key(cluster: str, transactional_id: str) -> str:
    return f"{transactions_prefix(cluster)}{quote(transactional_id, safe='')}"


def transactions_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}transactions/"


def transactional_id_from_key(cluster: str, key: str) -> str:
    return unquote(key[len(transactions_prefix(cluster)) :])


def transaction_lease_key(cluster: str, transactional_id: str) -> str:
    return f"{transaction_leases_prefix(cluster)}{quote(transactional_id, safe='')}"


def transaction_leases_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}leases/transactions/"


def group_txn_offsets_prefix(cluster: str, group: str, producer_id: int | None = None) -> str:
    """A group's offsets committed in open transactions (of one producer id, if given)."""
    base = f"{group_prefix(cluster, group)}txn-offsets/"
    return base if producer_id is None else f"{base}{producer_id}/"


def group_txn_offset_key(
    cluster: str, group: str, producer_id: int, topic: str, partition: int
) -> str:
    return f"{group_txn_offsets_prefix(cluster, group, producer_id)}{topic}/{partition}"


def acl_key(cluster: str, *parts: str) -> str:
    """One ACL binding's key: resource type, pattern type, resource name, principal, host,
    operation, permission, each percent-encoded into one key segment (names may hold ``/``)."""
    return acls_prefix(cluster) + "/".join(quote(part, safe="") for part in parts)


def acls_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}acls/"


QUOTA_DEFAULT = "<default>"
"""The default entity's key segment (a user literally named ``<default>`` is percent-encoded
to ``%3Cdefault%3E``, so the two never meet)."""


def quotas_prefix(cluster: str) -> str:
    return f"{cluster_prefix(cluster)}quotas/"


def _quota_part(name: str | None) -> str:
    return QUOTA_DEFAULT if name is None else quote(name, safe="")


def _quota_name(part: str) -> str | None:
    return None if part == QUOTA_DEFAULT else unquote(part)


_QUOTA_SEGMENTS = {"user": "users", "client-id": "clients"}
_QUOTA_TYPES = {segment: entity_type for entity_type, segment in _QUOTA_SEGMENTS.items()}


def quota_key(cluster: str, entity: Sequence[tuple[str, str | None]]) -> str:
    """A quota entity's key: (``user``|``client-id``, name or None for the default) pairs,
    user first."""
    segments = []
    for entity_type, name in entity:
        segments += [_QUOTA_SEGMENTS[entity_type], _quota_part(name)]
    return quotas_prefix(cluster) + "/".join(segments)


def quota_entity_from_key(cluster: str, key: str) -> list[tuple[str, str | None]] | None:
    """The (entity type, name or None) pairs of a quota key, or None if it is not one."""
    parts = key.removeprefix(quotas_prefix(cluster)).split("/")
    if parts[0::2] not in (["users"], ["clients"], ["users", "clients"]) or len(parts) % 2:
        return None
    return [(_QUOTA_TYPES[parts[i]], _quota_name(parts[i + 1])) for i in range(0, len(parts), 2)]


# --- object store -----------------------------------------------------------------------------

OFFSET_DIGITS = 20
_SEGMENT_NAME = re.compile(r"^(\d{20})-e(\d+)\.(kfs|idx)$")


def partition_object_prefix(cluster: str, topic: str, topic_id: str, partition: int) -> str:
    return f"{cluster}/topics/{topic}/{topic_id}/{partition}/"


def topic_object_prefix(cluster: str, topic: str, topic_id: str) -> str:
    return f"{cluster}/topics/{topic}/{topic_id}/"


def cluster_object_prefix(cluster: str) -> str:
    return f"{cluster}/"


def segment_object_key(
    cluster: str, topic: str, topic_id: str, partition: int, base_offset: int, epoch: int
) -> str:
    prefix = partition_object_prefix(cluster, topic, topic_id, partition)
    return f"{prefix}{base_offset:0{OFFSET_DIGITS}d}-e{epoch}.kfs"


def index_object_key(
    cluster: str, topic: str, topic_id: str, partition: int, base_offset: int, epoch: int
) -> str:
    prefix = partition_object_prefix(cluster, topic, topic_id, partition)
    return f"{prefix}{base_offset:0{OFFSET_DIGITS}d}-e{epoch}.idx"


def aborted_index_object_key(
    cluster: str, topic: str, topic_id: str, partition: int, first: int, last: int, epoch: int
) -> str:
    """An aborted-transaction index object: beside the partition's segments, not among them
    (its own prefix keeps segment listings free of it), under the topic id (a topic's purge
    deletes it with the segments)."""
    prefix = aborted_index_prefix(cluster, topic, topic_id, partition)
    return f"{prefix}{first:0{OFFSET_DIGITS}d}-{last:0{OFFSET_DIGITS}d}-e{epoch}.atx"


def aborted_index_prefix(cluster: str, topic: str, topic_id: str, partition: int) -> str:
    return f"{cluster}/topics/{topic}/{topic_id}/{partition}.aborted/"


_ABORTED_INDEX_NAME = re.compile(r"^(\d{20})-(\d{20})-e(\d+)\.atx$")


def parse_aborted_index_name(name: str) -> tuple[int, int, int] | None:
    """(first offset, last offset, epoch) of an aborted-transaction index object, or None."""
    match = _ABORTED_INDEX_NAME.match(name.rsplit("/", 1)[-1])
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def objects_from(partition_prefix: str, base: int) -> str:
    """A key just below a partition's objects at ``base`` (every epoch, segment and index), for
    listing from there on (S3's exclusive ``StartAfter``)."""
    return f"{partition_prefix}{base:0{OFFSET_DIGITS}d}-"


def parse_object_name(name: str) -> tuple[int, int, str] | None:
    """(base offset, epoch, "kfs"|"idx") of an object's last path part, or None."""
    match = _SEGMENT_NAME.match(name.rsplit("/", 1)[-1])
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), match.group(3)


# --- cleaned (compacted) objects --------------------------------------------------------------

GENERATION_DIGITS = 10
_CLEANED_PASS = re.compile(r"^g(\d{10})-e(\d+)/$")


def cleaned_root_prefix(cluster: str, topic: str, topic_id: str, partition: int) -> str:
    """Every compaction pass's objects of a partition: beside its segments, not among them (a
    segment listing never sees them), under the topic id (a topic's purge deletes them)."""
    return f"{cluster}/topics/{topic}/{topic_id}/{partition}.cleaned/"


def cleaned_pass_prefix(
    cluster: str, topic: str, topic_id: str, partition: int, generation: int, epoch: int
) -> str:
    """One pass's cleaned objects: generation ``generation`` written at leader epoch ``epoch``
    (a fenced writer's pass has another epoch, so its objects never match the state's)."""
    root = cleaned_root_prefix(cluster, topic, topic_id, partition)
    return f"{root}g{generation:0{GENERATION_DIGITS}d}-e{epoch}/"


def cleaned_object_key(pass_prefix: str, base_offset: int) -> str:
    return f"{pass_prefix}{base_offset:0{OFFSET_DIGITS}d}.kfs"


def parse_cleaned_key(root: str, key: str) -> tuple[int, int, int, str] | None:
    """(generation, epoch, base offset, "kfs"|"idx") of an object under ``root``, or None."""
    if not key.startswith(root):
        return None
    rest = key[len(root) :]
    head, _, name = rest.partition("/")
    match = _CLEANED_PASS.match(head + "/")
    object_match = re.match(r"^(\d{20})\.(kfs|idx)$", name)
    if match is None or object_match is None:
        return None
    return (
        int(match.group(1)),
        int(match.group(2)),
        int(object_match.group(1)),
        object_match.group(2),
    )
