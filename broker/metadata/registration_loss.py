"""Whether etcd deleting a broker's registration means the broker's session is over (pure).

A broker's registration (``brokers/<id>``) is bound to its session lease, and only the broker
writes it: etcd deletes it when the lease goes (revoked by another broker at the same address,
by an operator, or expired on etcd's clock while the broker was frozen). The cluster view's
watch delivers that deletion within milliseconds, while the keepalive would hear "lease not
found" only at its next round, up to TTL/3 later; meanwhile a broker woken from a freeze
shorter than its TTL by its own clock acted as owner on what etcd had already taken (Fetch
answered from its memory's high watermark, itself named leader and coordinator). So the
deletion ends the session at once, by the same call the keepalive's answer makes
(``SessionLease.mark_lost``).

Not every deletion of that key is such a loss: the deletion of a registration made on an
*earlier* session (its event arriving after the broker registered again, or while it is
registering on a new session) says nothing about the current one, and the broker's own
revoke at a graceful stop deletes it on purpose. The revision tells the first apart: the put
of the current session's registration has a revision, and a deletion after it can only be of
that registration (the broker alone writes the key, and a put on a new lease moves the key off
the old one, whose end then deletes nothing).
"""

from __future__ import annotations


def registration_lost(deleted_at: int, registered_at: int | None, released: bool) -> bool:
    """Whether etcd deleting this broker's own registration at revision ``deleted_at`` ends
    its current session.

    ``registered_at``: the revision of the put that registered the broker on the current
    session (None while that put is unanswered: the latest deletion seen is checked again once
    it is, so a deletion whose event came first is not missed); ``released``: the broker
    revoked the session itself (a graceful stop), so the deletion is its own doing. Draining
    changes nothing: a draining broker still serves until it stops, and a session etcd ended
    under it is lost as any other.
    """
    if released or registered_at is None:
        return False
    return deleted_at > registered_at
