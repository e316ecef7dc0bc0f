"""The proxy keeps a client's produce requests for a partition in the client's order
(``broker/proxy/ordering.py``): a request may follow earlier ones onto the connection they were
written to, never overtake one that went elsewhere or waits to be retried."""

from __future__ import annotations

import pytest

from kafscale.broker.proxy.ordering import ProduceOrder, in_order

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
