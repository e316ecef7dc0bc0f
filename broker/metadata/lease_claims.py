"""What a broker does with a partition's lease key when it acquires the partition: a pure
decision over the key as etcd holds it.

A key bound to an earlier session of this same broker is not ours to keep. The broker gives a
session up when no keepalive succeeded for two TTLs (``session_lease``: suspended after one,
resumed if etcd answers in time), but etcd may still hold that lease: an etcd that restarted (or
lost its leader) extends every lease by its TTL when it comes back. Confirming
such a key (same value, same create revision) left it bound to the old lease, which nobody
renews any more: a TTL later etcd deleted it while the broker still served the partition as its
own, so etcd named no holder, no other broker took it over and the proxies and clients followed
an ownership that etcd no longer had (the churn test's "ownership did not settle in etcd").
Such a key is cleared (fenced on its value and create revision) and created anew on the current
session, with a fresh create revision, as ``GroupLeases.acquire`` does for group leases.
"""

from __future__ import annotations

import enum

from kafscale.broker.metadata.etcd_txn import KeyValue


class LeaseClaim(enum.Enum):
    CREATE = "create"
    """Nobody holds the key: create it on our session (create-if-absent)."""
    CONFIRM = "confirm"
    """Ours, on our current session: keep it (fenced on value and create revision)."""
    CLEAR_STALE = "clear stale"
    """Ours, from a session we gave up: delete it (fenced), then create it anew."""
    REFUSE = "refuse"
    """Another broker holds it."""


def claim_lease(existing: KeyValue | None, me: bytes, session_id: int) -> LeaseClaim:
    """What to do with the lease key ``existing`` (None: absent) when broker ``me`` (its value)
    on session lease ``session_id`` acquires the partition."""
    if existing is None:
        return LeaseClaim.CREATE
    if existing.value != me:
        return LeaseClaim.REFUSE
    if existing.lease != session_id:
        return LeaseClaim.CLEAR_STALE
    return LeaseClaim.CONFIRM
