"""What one offset retention check reports when etcd did not answer for part of it.

A retention check goes over every group this broker coordinates. While etcd is away each
group's check fails the same way, and each used to log its own WARNING: a broker coordinating
500 groups wrote 500 lines per check for as long as the outage lasted. The check still goes on
with every group (one group's slow etcd transaction must not starve the groups after it in
every check), but reports the part it could not do as one error, which the check's loop logs
once and then summarises (``retry_log``). A group whose coordinator changed during the check
is not an error: the new coordinator checks it.
"""

from __future__ import annotations

from collections.abc import Sequence

from kafscale.broker.metadata.etcd_errors import MetadataUnavailable
from kafscale.broker.observability.retry_log import reason

NAMED_GROUPS = 3
"""How many of the groups not checked the error names; the rest are counted."""


class RetentionNotChecked(MetadataUnavailable):
    """Part of a retention check went unanswered by etcd; the next check tries it again."""


def unanswered_part(
    unlisted: MetadataUnavailable | None,
    unchecked: Sequence[tuple[str, MetadataUnavailable]],
    coordinated: int,
) -> RetentionNotChecked | None:
    """The one error of a check whose stored-group listing (``unlisted``) or group checks
    (``unchecked``: group id and its error, of ``coordinated`` groups) etcd did not answer;
    None when etcd answered everything."""
    parts: list[str] = []
    if unlisted is not None:
        parts.append(f"stored groups not listed: {reason(unlisted)}")
    if unchecked:
        named = ", ".join(group_id for group_id, _ in unchecked[:NAMED_GROUPS])
        more = len(unchecked) - NAMED_GROUPS
        if more > 0:
            named += f" and {more} more"
        parts.append(
            f"{len(unchecked)} of {coordinated} groups not checked ({named}): "
            f"{reason(unchecked[0][1])}"
        )
    return RetentionNotChecked("; ".join(parts)) if parts else None
