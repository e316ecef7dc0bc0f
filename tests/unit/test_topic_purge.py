"""Which etcd keys are deleted topics' tombstones, and which broker purges them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.metadata import keys
from kafscale.broker.storage.topic_purge import is_purger, parse_tombstone

pytestmark = pytest.mark.unit


@given(
    topic=st.from_regex(r"[a-zA-Z0-9._-]{1,40}", fullmatch=True),
    topic_id=st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
)
def test_a_deleted_topics_tombstone_parses_back(topic: str, topic_id: str) -> None:
    assert parse_tombstone("c", keys.deleted_topic_key("c", topic, topic_id)) == (topic, topic_id)


def test_keys_beside_tombstones_are_not_taken_for_one() -> None:
    assert parse_tombstone("c", keys.topic_key("c", "deleted-topics")) is None
    assert parse_tombstone("c", keys.deleted_topics_prefix("c") + "only-a-name") is None
    assert parse_tombstone("c", keys.deleted_topics_prefix("c") + "t/id/extra") is None
    assert parse_tombstone("other", keys.deleted_topic_key("c", "t", "id")) is None


def test_the_lowest_numbered_live_broker_purges_deleted_topics() -> None:
    assert is_purger(2, [5, 2, 9])
    assert not is_purger(5, [5, 2, 9])
    assert not is_purger(1, [])
