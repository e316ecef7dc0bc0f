"""The one error a retention check reports for what etcd left unanswered."""

from __future__ import annotations

import pytest

from kafscale.broker.groups.retention_outage import unanswered_part
from kafscale.broker.metadata.etcd_errors import MetadataUnavailable

pytestmark = pytest.mark.unit

TIMED_OUT = MetadataUnavailable("etcd txn timed out after 2 s")


def test_a_check_etcd_answered_in_full_reports_nothing() -> None:
    assert unanswered_part(None, [], 12) is None


def test_unchecked_groups_are_counted_and_the_first_named() -> None:
    unchecked = [(f"g{n}", TIMED_OUT) for n in range(5)]
    error = unanswered_part(None, unchecked, 40)
    assert str(error) == (
        "5 of 40 groups not checked (g0, g1, g2 and 2 more): etcd txn timed out after 2 s"
    )


def test_a_listing_etcd_did_not_answer_is_said_with_the_groups() -> None:
    error = unanswered_part(TIMED_OUT, [("orders", TIMED_OUT)], 1)
    assert str(error) == (
        "stored groups not listed: etcd txn timed out after 2 s; "
        "1 of 1 groups not checked (orders): etcd txn timed out after 2 s"
    )
    assert isinstance(error, MetadataUnavailable)
