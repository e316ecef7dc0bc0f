"""Keeps one client connection's produce requests for a partition in the order the client sent
them, across route changes and retries.

An idempotent producer numbers its batches per partition, and a broker refuses a batch whose
sequence number is not the next one it expects (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal for the
producer). Requests written to one upstream connection reach the broker in order, and the broker
answers them in order, so pipelining on one connection keeps the order. What does not: a request
written to a *different* connection (another broker, after the route moved, or a reconnect) while
an earlier request for the same partition is still unanswered or waiting to be retried. In a
planned drain the old owner answers request n NOT_LEADER_OR_FOLLOWER only after flushing the
requests before it, and deletes its lease right after: the proxy can see the lease move (and send
request n+1 to the new owner) before it reads that answer; n, retried, then arrives second.

So each produce request takes a ``Ticket`` when it arrives, queued per partition in arrival
order. A part may be written to a connection only if every earlier ticket of its partitions is
finished or was itself written to that same connection (``in_order``); otherwise it waits
until an earlier ticket changes (answered, refused and waiting to retry, or sent again). Earlier
tickets never wait for later ones, so this cannot deadlock; in the common case (one owner, one
connection) nothing waits and pipelining stays as it is.

Pipelining on one connection has a hazard of its own, too: the new owner may refuse request n
NOT_LEADER_OR_FOLLOWER (its view of the lease lags a moment) and then take the partition for
request n+1, which it refuses OUT_OF_ORDER_SEQUENCE_NUMBER, n being missing. Talking to the
broker directly, the client sees n refused first and recovers. Through the proxy it would see n
succeed (retried) and n+1 refused: librdkafka calls that desynchronization, a fatal error. So
an OUT_OF_ORDER_SEQUENCE_NUMBER answer to a part sent behind earlier unanswered ones
(``Ticket.behind``) is retried, in line, like a routing error (``retry_out_of_order``); the
broker stored nothing of it. Only a part sent at the head of the line gets that answer as is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from kafscale.broker.protocol.errors import ErrorCode

TopicPartition = tuple[str, int]


def in_order(earlier: Iterable[object | None], connection: object | None) -> bool:
    """May a part go out on ``connection``, given where the earlier unfinished tickets of its
    partition went (None: not sent, waiting to be retried)? Only if all of them went there."""
    return all(sent_on is not None and sent_on is connection for sent_on in earlier)


def retry_out_of_order(code: int, behind: bool) -> bool:
    """Retry a part answered ``code``? OUT_OF_ORDER_SEQUENCE_NUMBER is retried only when the
    part was sent behind earlier unanswered ones, which may have been refused."""
    return code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and behind


class Ticket:
    """One produce request's place in line: per partition, the connection its part was last
    written to (None while not sent)."""

    __slots__ = ("behind", "sent_on")

    def __init__(self, partitions: Iterable[TopicPartition]) -> None:
        self.sent_on: dict[TopicPartition, object | None] = dict.fromkeys(partitions)
        # Partitions whose part was last sent pipelined behind earlier unanswered ones.
        self.behind: set[TopicPartition] = set()


class ProduceOrder:
    def __init__(self) -> None:
        self._queues: dict[TopicPartition, list[Ticket]] = {}
        self._changed = asyncio.Event()

    def enter(self, partitions: Iterable[TopicPartition]) -> Ticket:
        """Queue a request behind every earlier one of its partitions (call on arrival, before
        any await: arrival order is the client's order)."""
        ticket = Ticket(partitions)
        for tp in ticket.sent_on:
            self._queues.setdefault(tp, []).append(ticket)
        return ticket

    def may_send(self, ticket: Ticket, targets: Mapping[TopicPartition, object | None]) -> bool:
        """Whether every part (partition -> the connection it would be written to) is in order
        behind the earlier tickets of its partition."""
        return all(in_order(self._earlier(ticket, tp), target) for tp, target in targets.items())

    def sent(self, ticket: Ticket, on: Mapping[TopicPartition, object]) -> None:
        for tp, connection in on.items():
            ticket.sent_on[tp] = connection
            if self._earlier(ticket, tp):
                ticket.behind.add(tp)
            else:
                ticket.behind.discard(tp)
        self._signal()

    def unsent(self, ticket: Ticket, partitions: Iterable[TopicPartition]) -> None:
        """These parts were refused (or their connection failed): they wait to be retried."""
        for tp in partitions:
            if tp in ticket.sent_on:
                ticket.sent_on[tp] = None
        self._signal()

    def finish(self, ticket: Ticket, partitions: Iterable[TopicPartition]) -> None:
        """These parts have their final answer: later tickets no longer wait for them."""
        for tp in partitions:
            if ticket.sent_on.pop(tp, _ABSENT) is not _ABSENT:
                queue = self._queues[tp]
                queue.remove(ticket)
                if not queue:
                    del self._queues[tp]
        self._signal()

    def leave(self, ticket: Ticket) -> None:
        self.finish(ticket, list(ticket.sent_on))

    def next_change(self) -> asyncio.Event:
        """Set when some ticket next moves on (take it before deciding to wait)."""
        return self._changed

    def _earlier(self, ticket: Ticket, tp: TopicPartition) -> list[object | None]:
        earlier = []
        for other in self._queues.get(tp, ()):
            if other is ticket:
                break
            earlier.append(other.sent_on.get(tp))
        return earlier

    def _signal(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


_ABSENT = object()
