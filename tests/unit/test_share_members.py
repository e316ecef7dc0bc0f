"""Share group membership as every broker's cluster watch sees it (``groups/<g>/metadata``),
and which writes of a refused share-state flush round were the refused ones."""

from __future__ import annotations

import asyncio
import json

from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.share import ShareConfig, ShareGroup, ShareHeartbeat
from kafscale.broker.groups.share_codec import snapshot
from kafscale.broker.groups.store import encode_group
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.share_members import ShareMembers, decode_share_members
from kafscale.broker.share.store import StateWrite, refused_writes


def _stored(*members: str) -> bytes:
    """A share group's metadata as its coordinator writes it."""
    group = ShareGroup("g", ShareConfig())
    for member in members:
        group.heartbeat(0, ShareHeartbeat(member, 0, None, ("t",), "c", "/h"), {"t": 1})
    record = GroupRecord("share", 1, None, None, group_type="share", consumer=snapshot(group))
    return encode_group(record)


def test_members_are_read_from_a_share_groups_document_only() -> None:
    assert decode_share_members(_stored("a", "b")) == {"a", "b"}
    assert decode_share_members(_stored()) == frozenset()
    classic = encode_group(GroupRecord("consumer", 3, "range", "m1"))
    assert decode_share_members(classic) is None
    assert decode_share_members(b'not json but says "share"') is None
    assert decode_share_members(json.dumps({"type": "share", "consumer": 3}).encode()) == set()
    wrong_members = {"type": "share", "consumer": {"members": 5}}  # a corrupt record
    assert decode_share_members(json.dumps(wrong_members).encode()) == set()


def test_listeners_hear_each_change_and_the_group_going() -> None:
    heard: list[tuple[str, frozenset[str] | None]] = []
    members = ShareMembers()
    members.listen(lambda group, ids: heard.append((group, ids)))
    members.put("g", _stored("a", "b"))
    members.put("g", _stored("a", "b"))  # the same members (an epoch moved): nothing to say
    members.put("g", _stored("b"))
    members.put("classic", encode_group(GroupRecord("consumer", 1, "range", "m")))
    assert members.has("g", "b") and not members.has("g", "a")
    members.delete("g")
    assert heard == [("g", {"a", "b"}), ("g", {"b"}), ("g", None)]


def test_a_reload_reports_groups_that_went_meanwhile() -> None:
    heard: list[tuple[str, frozenset[str] | None]] = []
    members = ShareMembers()
    members.put("kept", _stored("a"))
    members.put("gone", _stored("a"))
    members.listen(lambda group, ids: heard.append((group, ids)))
    members.begin_reload()
    members.put("kept", _stored("a"))
    members.end_reload()
    assert heard == [("gone", None)]
    assert members.has("kept", "a")


async def test_waiting_for_a_member_whose_join_is_on_its_way() -> None:
    members = ShareMembers()
    assert not await members.wait_for("g", "a", 0.01)
    waiting = asyncio.create_task(members.wait_for("g", "a", 30))
    await asyncio.sleep(0)
    members.put("g", _stored("b"))
    await asyncio.sleep(0)
    assert not waiting.done()
    members.put("g", _stored("a", "b"))
    assert await asyncio.wait_for(waiting, 30)


def test_only_the_writes_whose_own_checks_fail_are_refused() -> None:
    cluster, me = "c", b"1"

    def write(partition: int, lease_revision: int, expected: int) -> StateWrite:
        return StateWrite("g", "t", partition, lease_revision, expected, b"{}")

    writes = [write(0, 5, 0), write(1, 5, 40), write(2, 6, 41), write(3, 7, 0)]
    leases = {
        keys.partition_lease_key(cluster, "t", 0): (me, 5),
        keys.partition_lease_key(cluster, "t", 1): (me, 5),
        keys.partition_lease_key(cluster, "t", 2): (b"2", 6),  # another broker's now
        keys.partition_lease_key(cluster, "t", 3): (me, 7),
    }
    states = {
        keys.share_state_key(cluster, "g", "t", 1): 40,
        keys.share_state_key(cluster, "g", "t", 2): 41,
        keys.share_state_key(cluster, "g", "t", 3): 50,  # an admin wrote it meanwhile
    }
    assert refused_writes(writes, cluster, me, leases, states) == {2, 3}
    del leases[keys.partition_lease_key(cluster, "t", 0)]  # the lease expired
    assert refused_writes(writes, cluster, me, leases, states) == {0, 2, 3}


def test_a_document_nested_deeper_than_json_parses_names_no_share_group() -> None:
    # json.loads raises RecursionError on it: that ended the share-group index task silently.
    deep = b'{"type": "share", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert decode_share_members(deep) is None
