"""The INFO lines of group state changes (a rebalance, members expired, a protocol migration,
a group loaded), limited per group.

Each comes from one client action, so a client that joins and leaves in a loop, or asks for
group after group, could write thousands a second. They go through the process's log limit
(``observability/log_limit``) keyed by the group: an operator sees the first ten per minute of
each group (any group at a normal rate, all of them), then one line with the count; a client
churning its own group hides no other group's lines.
"""

from __future__ import annotations

import logging

from kafscale.broker.observability.log_limit import ClientEvent, client_log, named


def log_group_change(
    logger: logging.Logger, group_id: str, msg: str, *args: object, level: int = logging.INFO
) -> None:
    """``logger.log(level, msg, *args)`` within the limit of ``group_id``'s lines."""
    client_log(logger, level, ClientEvent.GROUP_CHANGE, named("group", group_id), msg, *args)
