"""The broker's one etcd session lease and the task that keeps it alive.

Every ownership key a broker writes (partition and group leases, its registration) is bound to
this lease, so ownership ends with the broker: at once on ``revoke()`` (a graceful handoff), or
within one TTL after a crash. ``still_valid()`` tells an owner whether it may act now, ``lost``
that the session is over for good (DESIGN §3.3, §3.4). Apart from the client (:mod:`etcd`)
because it is a long-lived task with its own timing rules, not a call.

A session whose keepalives went unanswered for a TTL is *suspended*, not lost. Its own clock
cannot tell whether etcd still holds the lease: after an etcd leader change the new leader
extends every lease by its TTL (etcd's lease "promote"), so a broker whose keepalives failed
through the election usually still holds everything. Giving it all up then (abandoning every
partition, failing what was buffered, registering again on a new lease) was churn for nothing
(``bench/chaos.py --kinds etcd-leader``). So (``session_phase``, pure):

* **valid** until a TTL after the last answered keepalive was sent (etcd holds the lease at
  least that long): the broker acts as owner.
* **suspended** from then on: ``still_valid()`` is false, so nothing acts on ownership that
  only memory vouches for (a group coordinator answers NOT_COORDINATOR and its timers wait,
  a partition it owns answers Produce and Fetch with NOT_LEADER_OR_FOLLOWER, no partition,
  group or transactional id is claimed, its reads of other partitions and its share-partitions
  go by etcd, not by what it holds). The keepalive goes on.
* **valid again** if etcd then renews the lease (a keepalive answered with a TTL, in time:
  ``session_phase`` of the renewed lease is valid): the session resumes with nothing abandoned
  and no new registration. An answer so late that the renewal it reports has run out too (an
  event loop stalled past the TTL) leaves the session suspended.
* **lost** when etcd says the lease is gone (the keepalive's answer, or the cluster view's
  watch deleting the broker's own registration: ``registration_loss``), or nothing answered for
  one more TTL: as before, the broker gives everything up and starts a new session
  (``session_renewal``).

Why resuming is safe: every key that stands for ownership is bound to this lease, and etcd
deletes such keys only by revoking the lease (its expiry or a ``revoke``); it never renews an
expired lease (a renewal that meets one waits for its revocation and answers "not found"), and
a lease id is never granted twice. A keepalive answered with a TTL therefore proves that none of
those keys went away since the last answered one, so no other broker can have created them
(every claim is create-if-absent) and nothing was taken from this one. What a partition writer
did meanwhile is fenced by etcd, not by the clock: a flush commits with a transaction that
compares its lease key (value and create revision, DESIGN §3.4), so a commit sent while
suspended lands only if the key, and so the lease, still existed, and an upload whose commit
failed stays an orphan readers ignore; acks follow commits, so a lease that had gone acks
nothing. The clock only ever decides the moment to stop acting on memory: before etcd could
have expired the lease, as before.

While suspended, Metadata still names the broker leader of what it owns as long as etcd *may*
still hold the lease (``held_after_send``: a keepalive went out before the last one sent could
have run out), because then every other broker, reading etcd, names it too: its ownership keys
are there. Naming another broker instead sent clients back and forth between two brokers that
both refused them. A broker that sent nothing for a TTL (frozen, SIGSTOP) knows etcd has most
likely deleted its keys, and names itself leader of nothing, as the other brokers do
(``leaders.live_leaders``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import LeaseLost, MetadataError
from kafscale.broker.observability.retry_log import RetryLog
from kafscale.broker.task_stop import cancel_and_wait, start_task

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    VALID = "valid"
    SUSPENDED = "suspended"
    LOST = "lost"


def session_phase(now: float, valid_until: float, ttl_s: float) -> Phase:
    """Where a session stands by its own clock alone: valid until ``valid_until`` (the last
    answered keepalive's send time + its TTL), then suspended for one more TTL while the
    keepalive asks etcd, then lost (etcd did not answer at all)."""
    if now < valid_until:
        return Phase.VALID
    if now < valid_until + ttl_s:
        return Phase.SUSPENDED
    return Phase.LOST


def held_after_send(held_until: float, sent_at: float, ttl_s: float) -> float:
    """Until when etcd may still hold the lease once a keepalive is sent at ``sent_at``, given
    it may hold it until ``held_until``: a keepalive that reaches a live lease renews it for a
    TTL from then; one sent after the lease could have run out (the process frozen past it)
    finds it gone, so the chain of sends ends there. (Sends reach etcd promptly here; one held
    up in the network longer than it is seen in etcd is not told apart: the broker then names
    itself leader for at most the rest of its suspension, and every request it gets is refused
    with a retriable error.)"""
    return max(held_until, sent_at + ttl_s) if sent_at < held_until else held_until


def may_be_held(phase: Phase, now: float, held_until: float) -> bool:
    """Whether etcd may still hold the lease: surely while valid, never once lost, and while
    suspended until the chain of sent keepalives could have kept it (``held_after_send``)."""
    if phase is Phase.SUSPENDED:
        return now < held_until
    return phase is Phase.VALID


@dataclass
class SessionCounts:
    """How often a broker's sessions were suspended and resumed: one object for all the sessions
    a broker has (a new one after a loss goes on counting), for its counters in ``/metrics``."""

    suspensions: int = 0
    resumptions: int = 0


class SessionLease:
    """The broker's one session lease, kept alive every TTL/3 by a task this object owns.

    Every ownership key (partition and group leases, the broker registration) is bound to it,
    so a broker that dies loses everything within one TTL, and ``revoke()`` hands everything
    over at once. ``still_valid()`` is false once no keepalive has succeeded for a whole TTL
    (measured from when the last good one was sent, so it errs on the early side): from then
    on the broker must not act as owner, until etcd renews the lease (the module's docstring).
    ``lost`` is set when etcd says the lease is gone, or when no keepalive has succeeded for
    two TTLs. A lost lease is not renewed; start a new session. ``revoke()`` is a deliberate
    release and does not set ``lost``.
    """

    def __init__(
        self,
        etcd: Etcd,
        lease_id: int,
        ttl_s: int,
        valid_until: float = 0.0,
        counts: SessionCounts | None = None,
    ) -> None:
        self._etcd = etcd
        self._id = lease_id
        self._ttl_s = ttl_s
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._valid_until = valid_until
        """Loop time until which etcd holds the lease at least (the last good keepalive's
        send time + its TTL)."""
        self._held_until = valid_until
        """Loop time until which etcd may hold the lease (``held_after_send``)."""
        self._suspended = False  # told once per suspension
        self._resumed_at: float | None = None
        """Loop time of the session's last resumption (None: it never resumed)."""
        self.registered_at: int | None = None
        """The etcd revision of the put of the broker's registration on this session (None:
        not registered on it yet); a deletion of the registration after it ends the session
        (``registration_loss``)."""
        self.released = False
        """The broker revoked this session itself (``revoke``): its keys' deletion is no loss."""
        self.counts = counts if counts is not None else SessionCounts()

    @classmethod
    async def start(
        cls, etcd: Etcd, ttl_s: int, counts: SessionCounts | None = None
    ) -> SessionLease:
        """A new lease kept alive from now; ``counts`` goes on counting a broker's earlier
        sessions' suspensions and resumptions."""
        loop = asyncio.get_running_loop()
        granted_at = loop.time()
        lease_id = await etcd.grant_lease(ttl_s)
        session = cls(etcd, lease_id, ttl_s, granted_at + ttl_s, counts)
        session._task = start_task(session._keep_alive(), name=f"session-lease-{session.id:x}")
        return session

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def still_valid(self) -> bool:
        """Whether the broker may act as owner at this moment. The keepalive task runs on its
        own timer; a process woken from a freeze longer than the TTL (SIGSTOP, a stalled VM)
        runs its other timers and requests in the same loop turn as that one, so a group
        coordinator expired members and answered JoinGroups with a generation for groups whose
        lease etcd had already deleted. An owner about to act asks here first: a lease past its
        TTL is suspended (or lost) now, whatever the keepalive task has seen."""
        return self.phase() is Phase.VALID

    def phase(self) -> Phase:
        """The session's phase now (a session whose keepalive was stopped: valid until lost)."""
        if self._task is None:
            return Phase.LOST if self.lost.is_set() else Phase.VALID
        return self._phase(asyncio.get_running_loop().time())

    def resumed_at_ms(self) -> int | None:
        """Loop time in ms (the group runtimes' clock) of the session's last resumption, None
        if it never resumed. A group coordinated on this session moves its members' timers
        for a resumption it has not seen yet, at its next timer step or request, whenever its
        timers are due (``groups/session_resume``): a suspension that ended before a group's
        next deadline woke no timer of it, and its members were refused all the same."""
        return None if self._resumed_at is None else int(self._resumed_at * 1000)

    def may_be_held(self) -> bool:
        """Whether etcd may still hold the lease now, and so every key bound to it: while this
        is true, the other brokers name this one owner of what it holds (``may_be_held``)."""
        if self._task is None:
            return not self.lost.is_set()
        now = asyncio.get_running_loop().time()
        return may_be_held(self._phase(now), now, self._held_until)

    def _phase(self, now: float) -> Phase:
        """The session's phase now, told once in the log as it changes; LOST sets ``lost``."""
        if self.lost.is_set():
            return Phase.LOST
        phase = session_phase(now, self._valid_until, self._ttl_s)
        if phase is Phase.LOST:
            self.mark_lost(f"no keepalive succeeded for {2 * self._ttl_s} s")
        elif phase is Phase.SUSPENDED and not self._suspended:
            self._suspended = True
            self.counts.suspensions += 1
            log.warning(
                "session lease %x suspended: no keepalive succeeded for %d s; not acting as "
                "owner until etcd answers whether it still holds the lease",
                self._id,
                self._ttl_s,
            )
        return phase

    async def revoke(self) -> None:
        """Stop the keepalive and revoke: every key bound to the lease is deleted at once."""
        self.released = True
        await self._stop_keepalive()
        await self._etcd.revoke_lease(self._id)

    async def close(self) -> None:
        """Stop the keepalive; the lease then expires within its TTL."""
        await self._stop_keepalive()

    async def _stop_keepalive(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl_s / 3
        retry = min(interval, 0.5)
        delay = interval
        retries = RetryLog(log, f"session lease {self._id:x} keepalive failed")
        try:
            while True:
                # Woken early by a loss told from outside (``mark_lost``): it ends at once,
                # not up to TTL/3 later, with nothing left running for the old session.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(
                        max(0.0, min(delay, self._next_change(loop.time())))
                    ):
                        await self.lost.wait()
                if self._phase(loop.time()) is Phase.LOST:
                    return
                sent_at = loop.time()
                self._held_until = held_after_send(self._held_until, sent_at, self._ttl_s)
                try:
                    async with asyncio.timeout(max(self._next_change(sent_at), retry)):
                        ttl = await self._etcd.refresh_lease(self._id)
                except LeaseLost as error:
                    self.mark_lost(str(error))
                    return
                except (MetadataError, TimeoutError) as error:
                    retries.failed(error)
                    delay = retry
                    continue
                retries.succeeded()
                self._renewed(sent_at, ttl, loop.time())
                delay = interval
        except Exception:
            log.exception("session lease %x keepalive crashed", self._id)
            self.mark_lost("keepalive crashed")

    def _next_change(self, now: float) -> float:
        """Seconds until the phase changes by the clock (valid → suspended → lost)."""
        if now < self._valid_until:
            return self._valid_until - now
        return self._valid_until + self._ttl_s - now

    def _renewed(self, sent_at: float, ttl_s: int, now: float) -> None:
        """etcd renewed the lease: a suspended session resumes (nothing bound to it went) if
        that renewal still runs now. An answer that came after the renewal it reports ran out
        (the loop stalled past the TTL) proves the lease lived then, not now: the session stays
        suspended until an answer in time (before, it was told "resumed", then at once
        "suspended" again)."""
        self._valid_until = max(self._valid_until, sent_at + ttl_s)
        self._held_until = max(self._held_until, self._valid_until)
        if not self._suspended or self.lost.is_set():
            return
        if session_phase(now, self._valid_until, self._ttl_s) is Phase.VALID:
            self._suspended = False
            self._resumed_at = now
            self.counts.resumptions += 1
            log.warning(
                "session lease %x resumed: etcd still holds it, nothing bound to it was taken",
                self._id,
            )

    def mark_lost(self, reason: str) -> None:
        """etcd ended the session (or stopped answering for two TTLs): the one way a session
        becomes lost, whoever learns it first, the keepalive or the cluster view's watch
        (``registration_loss``). It wakes the keepalive task, which ends."""
        if self.lost.is_set():
            return  # told once
        log.error("session lease %x lost: %s", self._id, reason)
        self.lost.set()
