"""Every share group's members as the cluster watch sees them (``share-groups/<group>``).

A share group's coordinator writes its membership to etcd when it changes (a join, a leave, a
session expiry), fenced by the group lease, to ``groups/<group>/metadata`` and, in the same
transaction, to ``share-groups/<group>``, which every broker's cluster view watches: so each
broker knows who is in every share group without asking the coordinator (which
may be another broker) and without an etcd read per request. Share-partition leaders use it to
refuse ShareFetch from member ids that are not in the group and to release a departed member's
records at once (Kafka's share-partition leader learns of departures the same way, from its
group coordinator's listener).

``decode_share_members`` is pure; ``ShareMembers`` keeps the map and tells its listeners of each
change (a group's new member set, or None once it is gone or not a share group).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

Listener = Callable[[str, frozenset[str] | None], None]
"""Called with (group, its member ids) after a change; None: the group is gone."""


def decode_share_members(value: bytes) -> frozenset[str] | None:
    """The member ids of a stored group document if it is a share group's, else None. Cheap for
    other groups: their documents are not parsed unless they name the share type."""
    if b'"share"' not in value:
        return None
    try:
        document = json.loads(value)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can parse
        return None
    if not isinstance(document, dict) or document.get("type") != "share":
        return None
    consumer = document.get("consumer") or {}
    members = consumer.get("members") if isinstance(consumer, dict) else None
    if not isinstance(members, list):  # a record of the wrong shape names nobody
        members = []
    return frozenset(
        str(m["member_id"]) for m in members if isinstance(m, dict) and "member_id" in m
    )


class ShareMembers:
    def __init__(self) -> None:
        self.members: dict[str, frozenset[str]] = {}
        self._listeners: list[Listener] = []
        self._changed = asyncio.Event()
        self._before_reload: dict[str, frozenset[str]] | None = None

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def has(self, group: str, member_id: str) -> bool:
        found = self.members.get(group)
        return found is not None and member_id in found

    async def wait_for(self, group: str, member_id: str, timeout_s: float) -> bool:
        """Whether ``member_id`` is (or, within ``timeout_s``, becomes) a member of ``group``:
        a member's first ShareFetch may overtake the watch event of its own join."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while not self.has(group, member_id):
                    await self._changed.wait()
        return self.has(group, member_id)

    def put(self, group: str, value: bytes) -> None:
        self._set(group, decode_share_members(value))

    def delete(self, group: str) -> None:
        self._set(group, None)

    def begin_reload(self) -> None:
        """The watch lost history: the view is read again; groups not put again are gone."""
        self._before_reload, self.members = self.members, {}

    def end_reload(self) -> None:
        before, self._before_reload = self._before_reload or {}, None
        for group in [g for g in before if g not in self.members]:
            self._notify(group, None)

    def _set(self, group: str, members: frozenset[str] | None) -> None:
        previous = self.members.get(group)
        if previous is None and self._before_reload is not None:
            previous = self._before_reload.get(group)
        if members is None:
            self.members.pop(group, None)
        else:
            self.members[group] = members
        if members != previous:
            self._notify(group, members)

    def _notify(self, group: str, members: frozenset[str] | None) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        for listener in self._listeners:
            listener(group, members)
