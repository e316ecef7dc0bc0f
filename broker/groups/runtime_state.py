"""What every part of ``runtime.GroupRuntime`` reads, declared once.

``GroupRuntime`` is put together from mixins, one concern each (``classic_runtime``,
``consumer_runtime``, ``share_runtime``, ``offsets_runtime``, ``retention_runtime``,
``timer_runtime``, ``writer_runtime``). They share a few attributes, which
``GroupRuntime.__init__`` sets, and a few methods; declaring them here lets the type checker
check each part without each repeating the list. A part declares only what else it reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from kafscale.broker.groups.consumer import ConsumerGroup
from kafscale.broker.groups.group import Group
from kafscale.broker.groups.model import Effect, GroupConfig, Store
from kafscale.broker.groups.share import ShareGroup


class RuntimeState:
    """The attributes ``GroupRuntime`` sets that every part reads (no behaviour)."""

    group_id: str
    group: Group | None
    """The group while it is a classic one (at most one of ``group``, ``consumer``, ``share``)."""
    consumer: ConsumerGroup | None
    share: ShareGroup | None
    closed: bool
    _config: GroupConfig
    _clock: Callable[[], int]
    _wake: asyncio.Event
    """Set when a request changed the group: the timer task looks at its deadlines again."""
    _stores: asyncio.Queue[Store]
    """Writes for the etcd writer task, in order."""

    if TYPE_CHECKING:  # defined by ``GroupRuntime``'s parts; absent at run time, so no stub
        # here can stand before the real method in the runtime's MRO

        def _check_open(self) -> None: ...

        def _note_members(self) -> None: ...

        def _apply(self, effects: list[Effect]) -> None: ...
