"""Group state in etcd: committed offsets and group metadata, written under the group lease.

Layout (keys from ``keys``; values JSON)::

    groups/<group>/metadata            protocol type, generation, protocol, leader, members,
                                       empty since (wall-clock ms, records of an Empty group)
    share-groups/<group>               a share group's metadata again, written with it
    groups/<group>/offsets/<topic>/<p> offset, leader epoch, metadata, commit timestamp, topic id,
                                       expire timestamp (OffsetCommit v2-v4 retention time)

Every write is one etcd transaction that first compares the group's lease key (owner value and
create revision), so a coordinator that lost its lease cannot write: the transaction fails and
the caller drops the group (DESIGN §3.7). Offsets of many partitions go in as few transactions
as etcd's per-transaction op limit allows. Metadata is written per completed rebalance, never
per heartbeat.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafscale.broker.groups.model import GroupRecord, MemberRecord
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_txn import (
    Compare,
    KeyValue,
    Op,
    create_revision_is,
    delete_op,
    delete_prefix_op,
    prefix_range_end,
    put_op,
    value_is,
)
from kafscale.broker.metadata.share_members import decode_share_members
from kafscale.broker.protocol.errors import UnreadableRecord

TopicPartition = tuple[str, int]

MAX_OPS_PER_TXN = 100
"""etcd refuses transactions with more than 128 operations (``--max-txn-ops``)."""

PAGE_KEYS = 500
"""Keys per etcd read when going through every stored group: each answer stays small (etcd
serves a range whole, in memory, and a cluster of throwaway group ids holds millions of keys)."""

DECODE_CHUNK_KEYS = 100
"""Keys of a page decoded between two yields to the event loop. Decoded whole, a page of 500
committed offsets held the loop for up to 10-13 ms of CPU at once, about half the pages over
5 ms (``bench/lag_refresh.py``, 10,000 groups): every request and scrape on the broker waited
that long. In chunks of 100 the loop is let in at least every ~5 ms."""


@dataclass(frozen=True, slots=True)
class Fence:
    """Proof of holding a group lease: its key, our owner value and the create revision."""

    key: str
    owner: bytes
    create_revision: int

    def compares(self) -> list[Compare]:
        return [value_is(self.key, self.owner), create_revision_is(self.key, self.create_revision)]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1
    topic_id: str = ""
    """The topic's id when committed ("" in documents from before): an offset of a topic that
    was deleted, or deleted and created again, is not the new topic's (see ``still_valid``)."""
    expire_timestamp_ms: int = -1
    """When the offset expires whatever its group does (OffsetCommit v2-v4 ``retention_time``,
    as Kafka's ``expireTimestamp``); -1: the broker's offset retention decides (``expiry``)."""

    def still_valid(self, current_topic_id: str | None) -> bool:
        """Whether the offset belongs to the topic now carrying its name (``None``: no topic of
        that name). Kafka removes a deleted topic's offsets; this gives the same answers."""
        return not self.topic_id or self.topic_id == current_topic_id


@dataclass(frozen=True, slots=True)
class LoadedGroup:
    record: GroupRecord | None
    offsets: dict[TopicPartition, CommittedOffset]
    pending: frozenset[TopicPartition] = frozenset()
    """Partitions with an offset committed in a transaction that is not complete yet."""

    @property
    def exists(self) -> bool:
        return self.record is not None or bool(self.offsets)

    @property
    def is_share(self) -> bool:
        """Whether etcd holds a share group (KIP-932): its record's type says so."""
        return self.record is not None and self.record.group_type == "share"


@dataclass(frozen=True, slots=True)
class PersistedGroup:
    """A group as ListGroups sees it in etcd (without loading it)."""

    group_id: str
    protocol_type: str
    has_members: bool
    group_type: str = "classic"
    unreadable: UnreadableRecord | None = None
    """Why the group's record does not decode (then it is not listed, but reported)."""


# --- JSON codecs ------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes:
    return base64.b64decode(str(text or ""))


DECODE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, RecursionError)
"""What decoding a value of the wrong shape raises: bytes that are no UTF-8 or no JSON, JSON
of another shape (a list, a string for a number, a member without an id), bad base64."""


def unreadable(key: str, exc: BaseException) -> UnreadableRecord:
    """The error of a stored value that does not decode: it names the key, for an operator."""
    return UnreadableRecord(f"the value of {key} in etcd does not decode ({exc!r})")


def encode_group(record: GroupRecord) -> bytes:
    document: dict[str, Any] = {
        "protocol_type": record.protocol_type,
        "generation": record.generation,
        "protocol": record.protocol_name,
        "leader": record.leader,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "session_timeout_ms": m.session_timeout_ms,
                "subscription": _b64(m.subscription),
                "assignment": _b64(m.assignment),
            }
            for m in record.members
        ],
    }
    if record.group_type != "classic":
        document["type"] = record.group_type
    if record.consumer is not None:
        document["consumer"] = record.consumer
    if record.empty_since_ms is not None:
        document["empty_since_ms"] = record.empty_since_ms
    return json.dumps(document, separators=(",", ":")).encode()


def decode_group(data: bytes, key: str = "a group record") -> GroupRecord:
    """The record stored under a group's metadata key; UnreadableRecord if it does not
    decode (one corrupt value must fail its own group, never the caller's loop over many)."""
    try:
        return _decode_group(data)
    except DECODE_ERRORS as exc:
        raise unreadable(key, exc) from exc


def _decode_group(data: bytes) -> GroupRecord:
    document = json.loads(data)
    members = tuple(
        MemberRecord(
            member_id=str(m["member_id"]),
            group_instance_id=m.get("group_instance_id"),
            client_id=str(m.get("client_id", "")),
            client_host=str(m.get("client_host", "")),
            rebalance_timeout_ms=int(m.get("rebalance_timeout_ms", 0)),
            session_timeout_ms=int(m.get("session_timeout_ms", 0)),
            subscription=_unb64(m.get("subscription")),
            assignment=_unb64(m.get("assignment")),
        )
        for m in document.get("members", [])
    )
    return GroupRecord(
        protocol_type=document.get("protocol_type"),
        generation=int(document.get("generation", 0)),
        protocol_name=document.get("protocol"),
        leader=document.get("leader"),
        members=members,
        group_type=str(document.get("type") or "classic"),
        consumer=document.get("consumer"),
        empty_since_ms=_optional_int(document.get("empty_since_ms")),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def encode_offset(committed: CommittedOffset) -> bytes:
    document = {
        "offset": committed.offset,
        "leader_epoch": committed.leader_epoch,
        "metadata": committed.metadata,
        "commit_timestamp_ms": committed.commit_timestamp_ms,
    }
    if committed.topic_id:
        document["topic_id"] = committed.topic_id
    if committed.expire_timestamp_ms >= 0:
        document["expire_timestamp_ms"] = committed.expire_timestamp_ms
    return json.dumps(document, separators=(",", ":")).encode()


def decode_offset(data: bytes, key: str = "a committed offset") -> CommittedOffset:
    """A committed offset as stored; UnreadableRecord if it does not decode."""
    try:
        return _decode_offset(data)
    except DECODE_ERRORS as exc:
        raise unreadable(key, exc) from exc


def _decode_offset(data: bytes) -> CommittedOffset:
    document = json.loads(data)
    return CommittedOffset(
        offset=int(document["offset"]),
        leader_epoch=int(document.get("leader_epoch", -1)),
        metadata=str(document.get("metadata") or ""),
        commit_timestamp_ms=int(document.get("commit_timestamp_ms", -1)),
        topic_id=str(document.get("topic_id") or ""),
        expire_timestamp_ms=int(document.get("expire_timestamp_ms", -1)),
    )


def parse_group_key(cluster: str, key: str) -> tuple[str, TopicPartition | None] | None:
    """(group, None) for a metadata key, (group, (topic, p)) for an offset key, else None."""
    relative = key[len(keys.groups_prefix(cluster)) :]
    if relative.endswith("/metadata"):
        return keys.group_from_key_part(relative[: -len("/metadata")]), None
    head, sep, partition = relative.rpartition("/")
    group_and_offsets, sep2, topic = head.rpartition("/")
    group, sep3, marker = group_and_offsets.rpartition("/")
    if not (sep and sep2 and sep3) or marker != "offsets" or not partition.isdigit():
        return None
    return keys.group_from_key_part(group), (topic, int(partition))


def parse_pending_key(relative: str) -> tuple[int, TopicPartition] | None:
    """``<producer id>/<topic>/<p>`` (a transactional offset's key under the group's
    ``txn-offsets/``) → (producer id, (topic, p)); None if malformed."""
    pid, sep, rest = relative.partition("/")
    topic, sep2, partition = rest.rpartition("/")
    if not (sep and sep2) or not partition.isdigit() or not pid.lstrip("-").isdigit():
        return None
    return int(pid), (topic, int(partition))


def _group_part_end(groups_prefix: str, key: str) -> str:
    """The first key after every key of the group ``key`` belongs to (``key`` under
    ``groups_prefix``): a group's keys share the prefix ``groups/<quoted id>/``."""
    part = key[len(groups_prefix) :].partition("/")[0]
    return prefix_range_end(f"{groups_prefix}{part}/".encode()).decode()


def first_keys(groups_prefix: str, entries: Sequence[KeyValue]) -> list[KeyValue]:
    """Of keys in key order, each group's first. A group's metadata key, if it has one, is its
    first: ``metadata`` sorts before ``offsets/`` and ``txn-offsets/``."""
    firsts: list[KeyValue] = []
    end = ""
    for entry in entries:
        if entry.key >= end:
            firsts.append(entry)
            end = _group_part_end(groups_prefix, entry.key)
    return firsts


def _chunks(ops: list[Op], size: int) -> Iterable[list[Op]]:
    for start in range(0, len(ops), size):
        yield ops[start : start + size]


def _packed(groups: list[list[Op]], size: int) -> Iterable[list[Op]]:
    """The ops in chunks of at most ``size``, a group never split unless larger than that."""
    chunk: list[Op] = []
    for group in groups:
        if chunk and len(chunk) + len(group) > size:
            yield chunk
            chunk = []
        chunk.extend(group)
        while len(chunk) > size:
            yield chunk[:size]
            chunk = chunk[size:]
    if chunk:
        yield chunk


# --- the store --------------------------------------------------------------------------------


class GroupStore:
    """Reads and fenced writes of one cluster's group state."""

    def __init__(self, etcd: Etcd, cluster: str) -> None:
        self._etcd = etcd
        self._cluster = cluster

    async def load(self, group_id: str) -> LoadedGroup:
        """Metadata and committed offsets of ``group_id`` in one prefix read; UnreadableRecord
        if one of its values does not decode."""
        entries = await self._etcd.get_prefix(keys.group_prefix(self._cluster, group_id))
        record: GroupRecord | None = None
        offsets: dict[TopicPartition, CommittedOffset] = {}
        metadata_key = keys.group_metadata_key(self._cluster, group_id)
        pending_prefix = keys.group_txn_offsets_prefix(self._cluster, group_id)
        pending: set[TopicPartition] = set()
        for entry in entries:
            if entry.key == metadata_key:
                record = decode_group(entry.value, entry.key)
                continue
            if entry.key.startswith(pending_prefix):
                parsed_pending = parse_pending_key(entry.key[len(pending_prefix) :])
                if parsed_pending is not None:
                    pending.add(parsed_pending[1])
                continue
            parsed = parse_group_key(self._cluster, entry.key)
            if parsed is None or parsed[0] != group_id or parsed[1] is None:
                continue  # another group whose id extends this one's prefix
            offsets[parsed[1]] = decode_offset(entry.value, entry.key)
        return LoadedGroup(record, offsets, frozenset(pending))

    async def save_group(self, group_id: str, record: GroupRecord, fence: Fence) -> bool:
        """Write the group metadata; False if the lease is no longer ours. A share group's goes
        to ``share-groups/<group>`` too, in the same transaction: every broker's cluster view
        follows share-group membership there (it does not watch ``groups/``)."""
        document = encode_group(record)
        ops = [put_op(keys.group_metadata_key(self._cluster, group_id), document)]
        if record.group_type == "share":
            ops.append(put_op(keys.share_group_key(self._cluster, group_id), document))
        result = await self._etcd.txn(fence.compares(), ops)
        return result.succeeded

    async def save_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset], fence: Fence
    ) -> bool:
        """Commit offsets, ``MAX_OPS_PER_TXN`` partitions per transaction; False if fenced."""
        ops: list[Op] = [
            put_op(keys.group_offset_key(self._cluster, group_id, topic, p), encode_offset(c))
            for (topic, p), c in offsets.items()
        ]
        for chunk in _chunks(ops, MAX_OPS_PER_TXN):
            result = await self._etcd.txn(fence.compares(), chunk)
            if not result.succeeded:
                return False
        return True

    async def delete_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition],
        fence: Fence,
        pending: Iterable[TopicPartition] = (),
    ) -> bool:
        """OffsetDelete: remove committed offsets, fenced like commits; False if fenced.

        ``pending``: those of ``partitions`` that may have an offset pending in an open
        transaction. Those go too, as Kafka's offset tombstone drops them
        (``OffsetMetadataManager.replay``): the transaction's commit must not bring back an
        offset deleted after it was sent. A partition's keys go in one etcd transaction."""
        doomed = list(dict.fromkeys(partitions))
        by_partition: dict[TopicPartition, list[Op]] = {
            (topic, p): [delete_op(keys.group_offset_key(self._cluster, group_id, topic, p))]
            for topic, p in doomed
        }
        if set(pending) & set(doomed):
            for key, tp in await self._pending_keys(group_id):
                if tp in by_partition:
                    by_partition[tp].append(delete_op(key))
        for chunk in _packed(list(by_partition.values()), MAX_OPS_PER_TXN):
            result = await self._etcd.txn(fence.compares(), chunk)
            if not result.succeeded:
                return False
        return True

    async def _pending_keys(self, group_id: str) -> list[tuple[str, TopicPartition]]:
        """(key, partition) of every offset of the group pending in an open transaction."""
        prefix = keys.group_txn_offsets_prefix(self._cluster, group_id)
        found = []
        for entry in await self._etcd.get_prefix(prefix):
            parsed = parse_pending_key(entry.key[len(prefix) :])
            if parsed is not None:
                found.append((entry.key, parsed[1]))
        return found

    async def delete_group(self, group_id: str, fence: Fence) -> bool:
        """Delete every key under the group's ``groups/<group>/`` prefix (metadata, offsets,
        offsets pending in open transactions, as Kafka's ``deleteAllOffsets`` does: a
        transaction committing later must not bring the group's offsets back; and whatever
        else is there, so a group whose values do not decode goes whole too), a share group's
        share-partition states and ``share-groups/<group>`` copy, and the lease itself, in one
        fenced transaction; False if fenced. Prefix deletes are one op each, whatever the
        number of keys: a coordinator that lost the group lease deletes nothing, and a
        deletion is never left half done."""
        ops: list[Op] = [
            delete_prefix_op(keys.group_prefix(self._cluster, group_id)),
            delete_prefix_op(keys.share_states_prefix(self._cluster, group_id)),
            delete_op(keys.share_group_key(self._cluster, group_id)),
            delete_op(fence.key),
        ]
        result = await self._etcd.txn(fence.compares(), ops)
        return result.succeeded

    async def list_persisted(self) -> list[PersistedGroup]:
        """Every group with metadata or committed offsets in etcd; one whose record does not
        decode comes with ``unreadable`` set (the others are listed all the same)."""
        found: list[PersistedGroup] = []
        async for entries, _ in self._group_pages(None, keys_only=False):
            for entry in entries:
                parsed = parse_group_key(self._cluster, entry.key)
                if parsed is None:
                    continue  # a group with only offsets pending in a transaction
                group_id, tp = parsed
                if tp is None:
                    try:
                        record = decode_group(entry.value, entry.key)
                    except UnreadableRecord as exc:
                        found.append(PersistedGroup(group_id, "", False, unreadable=exc))
                        continue
                    found.append(
                        PersistedGroup(
                            group_id,
                            record.protocol_type or "",
                            record.has_members(),
                            record.group_type,
                        )
                    )
                else:
                    found.append(PersistedGroup(group_id, "", False))
        return sorted(found, key=lambda g: g.group_id)

    async def share_group_metadata(self) -> AsyncGenerator[KeyValue, None]:
        """The metadata key of every stored share group, read a page at a time."""
        async for entries, _ in self._group_pages(None, keys_only=False):
            for entry in entries:
                parsed = parse_group_key(self._cluster, entry.key)
                metadata = parsed is not None and parsed[1] is None
                if metadata and decode_share_members(entry.value) is not None:
                    yield entry

    async def group_id_pages(
        self, after: str | None
    ) -> AsyncGenerator[tuple[list[str], bool], None]:
        """The ids of the groups with metadata or committed offsets in etcd, in key order from
        the one after ``after`` (None: from the first), a page at a time, each with whether it
        is the last. Only keys are read, and of each group one: the rest are skipped."""
        async for entries, last in self._group_pages(after, keys_only=True):
            ids = []
            for entry in entries:
                parsed = parse_group_key(self._cluster, entry.key)
                if parsed is not None:
                    ids.append(parsed[0])
            yield ids, last

    async def committed_offset_pages(
        self, after: str | None, wanted: Callable[[str], bool] | None = None
    ) -> AsyncGenerator[tuple[list[tuple[str, dict[TopicPartition, CommittedOffset]]], bool], None]:
        """Every stored group's committed offsets, in key order from the group after ``after``
        (None: from the first), one bounded etcd read (``PAGE_KEYS`` keys with their values) per
        page, each with whether it is the last. A page yields the groups whose keys it ends: a
        group whose keys go on into the next read comes whole with that one, and no key is read
        twice. A group with metadata only comes with no offsets; offsets pending in an open
        transaction are not committed and are left out, as are values that do not decode.
        ``wanted``: the groups whose offsets are decoded (the others come with none)."""
        prefix = keys.groups_prefix(self._cluster)
        end = prefix_range_end(prefix.encode()).decode()
        start = prefix
        if after is not None:
            start = prefix_range_end(keys.group_prefix(self._cluster, after).encode()).decode()
        open_part: str | None = None
        open_wanted = False
        offsets: dict[TopicPartition, CommittedOffset] = {}
        while True:
            entries, more = await self._etcd.get_range(start, end, PAGE_KEYS)
            done: list[tuple[str, dict[TopicPartition, CommittedOffset]]] = []
            for index, entry in enumerate(entries):
                if index and index % DECODE_CHUNK_KEYS == 0:
                    await asyncio.sleep(0)  # let requests and scrapes in between chunks
                part = entry.key[len(prefix) :].partition("/")[0]
                if part != open_part:
                    if open_part is not None:
                        done.append((keys.group_from_key_part(open_part), offsets))
                    open_part, offsets = part, {}
                    group_id = keys.group_from_key_part(part)
                    open_wanted = wanted is None or wanted(group_id)
                if open_wanted:
                    _add_offset(self._cluster, entry, offsets)
            last = not more or not entries
            if last and open_part is not None:
                done.append((keys.group_from_key_part(open_part), offsets))
            yield done, last
            if last:
                return
            start = entries[-1].key + "\0"

    async def _group_pages(
        self, after: str | None, keys_only: bool
    ) -> AsyncGenerator[tuple[list[KeyValue], bool], None]:
        """Each stored group's first key (``first_keys``), in key order from the group after
        ``after``, one bounded etcd read (``PAGE_KEYS``) per page; True with the last page.
        The next read starts past the page's last group, so its other keys are not read."""
        prefix = keys.groups_prefix(self._cluster)
        end = prefix_range_end(prefix.encode()).decode()
        start = prefix
        if after is not None:
            start = prefix_range_end(keys.group_prefix(self._cluster, after).encode()).decode()
        while True:
            entries, more = await self._etcd.get_range(start, end, PAGE_KEYS, keys_only)
            last = not more or not entries
            yield first_keys(prefix, entries), last
            if last:
                return
            start = _group_part_end(prefix, entries[-1].key)


def _add_offset(
    cluster: str, entry: KeyValue, offsets: dict[TopicPartition, CommittedOffset]
) -> None:
    """Add ``entry`` to its group's ``offsets`` if it is a committed offset that decodes."""
    parsed = parse_group_key(cluster, entry.key)
    if parsed is None or parsed[1] is None:
        return  # the metadata record, or an offset pending in a transaction
    try:
        offsets[parsed[1]] = decode_offset(entry.value, entry.key)
    except UnreadableRecord:  # what decode_offset raises for any value that does not decode
        return  # not ours to judge here: the group's coordinator reports it when loading
