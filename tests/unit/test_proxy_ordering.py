"""The proxy keeps a client's produce requests for a partition in the client's order
(``broker/proxy/ordering.py``): a request may follow earlier ones onto the connection they were
written to, never overtake one that went elsewhere or waits to be retried."""

from __future__ import annotations

import pytest

from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.proxy.ordering import ProduceOrder, in_order, retry_out_of_order

pytestmark = pytest.mark.unit

P0, P1 = ("t", 0), ("t", 1)
OLD_OWNER, NEW_OWNER = object(), object()


def test_nothing_earlier_means_go() -> None:
    assert in_order([], OLD_OWNER)
    assert in_order([], None)


def test_pipelining_on_the_same_connection_is_in_order() -> None:
    assert in_order([OLD_OWNER, OLD_OWNER], OLD_OWNER)


def test_a_request_never_overtakes_one_still_unanswered_elsewhere() -> None:
    # The drain race: request n is at the old owner (about to be refused), the route moved.
    assert not in_order([OLD_OWNER], NEW_OWNER)


def test_a_request_never_overtakes_one_waiting_to_be_retried() -> None:
    assert not in_order([None], NEW_OWNER)
    assert not in_order([NEW_OWNER, None], NEW_OWNER)


def test_a_later_request_waits_until_the_earlier_one_is_answered() -> None:
    line = ProduceOrder()
    first = line.enter([P0])
    second = line.enter([P0])
    line.sent(first, {P0: OLD_OWNER})
    assert line.may_send(second, {P0: OLD_OWNER})  # pipelined behind it
    assert not line.may_send(second, {P0: NEW_OWNER})  # the route moved: wait
    changed = line.next_change()
    line.finish(first, [P0])
    assert changed.is_set()
    assert line.may_send(second, {P0: NEW_OWNER})


def test_a_refused_request_is_retried_before_the_later_ones() -> None:
    line = ProduceOrder()
    first, second = line.enter([P0]), line.enter([P0])
    line.sent(first, {P0: OLD_OWNER})
    line.sent(second, {P0: OLD_OWNER})
    line.unsent(first, [P0])  # refused: waits to be retried
    line.unsent(second, [P0])
    assert not line.may_send(second, {P0: NEW_OWNER})
    assert line.may_send(first, {P0: NEW_OWNER})  # earlier ones never wait for later ones
    line.sent(first, {P0: NEW_OWNER})
    assert line.may_send(second, {P0: NEW_OWNER})
    assert not line.may_send(second, {P0: OLD_OWNER})


def test_partitions_are_ordered_independently() -> None:
    line = ProduceOrder()
    first = line.enter([P0])
    second = line.enter([P1])
    both = line.enter([P0, P1])
    line.sent(first, {P0: OLD_OWNER})
    assert line.may_send(second, {P1: NEW_OWNER})
    assert not line.may_send(both, {P0: NEW_OWNER, P1: NEW_OWNER})  # P0 is behind `first`
    line.sent(second, {P1: NEW_OWNER})
    line.leave(first)
    assert line.may_send(both, {P0: NEW_OWNER, P1: NEW_OWNER})


def test_leaving_forgets_the_request() -> None:
    line = ProduceOrder()
    ticket = line.enter([P0, P1])
    line.finish(ticket, [P0])
    line.leave(ticket)
    line.leave(ticket)  # twice is harmless
    later = line.enter([P0, P1])
    assert line.may_send(later, {P0: None, P1: None})


def test_a_part_sent_behind_unanswered_ones_is_marked_behind() -> None:
    line = ProduceOrder()
    first, second = line.enter([P0]), line.enter([P0])
    line.sent(first, {P0: NEW_OWNER})
    line.sent(second, {P0: NEW_OWNER})
    assert P0 not in first.behind
    assert P0 in second.behind
    line.finish(first, [P0])
    line.unsent(second, [P0])
    line.sent(second, {P0: NEW_OWNER})  # retried at the head of the line
    assert P0 not in second.behind


def test_only_a_gap_behind_unanswered_requests_is_retried() -> None:
    gap = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert retry_out_of_order(gap, behind=True)
    assert not retry_out_of_order(gap, behind=False)  # a real gap: the client's to handle
    assert not retry_out_of_order(ErrorCode.INVALID_PRODUCER_EPOCH, behind=True)
