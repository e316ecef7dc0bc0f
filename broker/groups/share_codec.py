"""A share group's membership as a JSON-ready document, and back (pure).

Written under the group's metadata key (type "share", fenced by the group lease) when the group
epoch, a member, a subscription or an assignment changes; heartbeats that change none of these
write nothing. A new coordinator restores the members at their epochs with whole sessions
from ``now_ms`` (when the last coordinator's lease went, if it saw that:
``runtime.sessions_start_ms``).
``roll_back`` puts a group back to its stored document when a write of a change failed.
"""

from __future__ import annotations

from typing import Any

from kafscale.broker.groups.share import ShareConfig, ShareGroup, ShareMember

Document = dict[str, Any]


def snapshot(group: ShareGroup) -> Document:
    return {
        "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch,
        "subscribed_partitions": dict(sorted(group.subscribed_partitions.items())),
        "subscribed_ids": dict(sorted(group.subscribed_ids.items())),
        "members": [
            {
                "member_id": m.member_id,
                "rack_id": m.rack_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "topic_names": list(m.topic_names),
                "epoch": m.epoch,
                "assigned": [[t, p] for t, p in sorted(m.assigned)],
            }
            for m in group.members.values()
        ],
    }


def restore(group_id: str, document: Document, config: ShareConfig, now_ms: int) -> ShareGroup:
    group = ShareGroup(group_id, config, int(document.get("group_epoch", 0)))
    group.assignment_epoch = int(document.get("assignment_epoch", group.group_epoch))
    group.subscribed_partitions = {
        str(t): int(n) for t, n in (document.get("subscribed_partitions") or {}).items()
    }
    group.subscribed_ids = {
        str(t): str(i) for t, i in (document.get("subscribed_ids") or {}).items()
    }
    for entry in document.get("members") or ():
        member = ShareMember(
            member_id=str(entry["member_id"]),
            rack_id=entry.get("rack_id"),
            client_id=str(entry.get("client_id", "")),
            client_host=str(entry.get("client_host", "")),
            topic_names=tuple(str(t) for t in entry.get("topic_names") or ()),
            epoch=int(entry.get("epoch", 0)),
            assigned=frozenset((str(t), int(p)) for t, p in entry.get("assigned") or ()),
            session_deadline_ms=now_ms + config.session_timeout_ms,
        )
        member.sent = member.assigned
        group.members[member.member_id] = member
    return group


def roll_back(group: ShareGroup, document: Document | None, now_ms: int) -> None:
    """Put ``group`` back to ``document``, the state etcd last took (None: nothing yet), after
    the write of a later change failed: members, epochs and assignments are what was stored, so
    a member whose answer was lost to the failure heartbeats on with the epoch it knows. The
    members still there keep their session deadline (they did heartbeat) and what they were
    sent; members the failed change removed come back with a fresh session."""
    stored = restore(group.group_id, document or {}, group.config, now_ms)
    for member_id, member in stored.members.items():
        current = group.members.get(member_id)
        if current is not None:
            member.session_deadline_ms = current.session_deadline_ms
            member.sent = current.sent
    group.group_epoch = stored.group_epoch
    group.assignment_epoch = stored.assignment_epoch
    group.subscribed_partitions = stored.subscribed_partitions
    group.subscribed_ids = stored.subscribed_ids
    group.members = stored.members
