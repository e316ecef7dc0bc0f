"""Key builders: group ids with ``/`` stay one key segment and parse back unchanged; etcd's range
end of a prefix covers exactly the keys that start with it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafscale.broker.groups.store import parse_group_key
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.etcd_txn import prefix_range_end

pytestmark = pytest.mark.unit


@given(
    group=st.text(min_size=1, max_size=40),
    topic=st.from_regex(r"[a-z0-9._-]{1,20}", fullmatch=True),
)
def test_group_keys_round_trip(group: str, topic: str) -> None:
    assert parse_group_key("c", keys.group_metadata_key("c", group)) == (group, None)
    assert parse_group_key("c", keys.group_offset_key("c", group, topic, 3)) == (group, (topic, 3))


def test_a_group_is_never_inside_another_groups_prefix() -> None:
    assert not keys.group_offset_key("c", "a/offsets/t", "x", 0).startswith(
        keys.group_prefix("c", "a")
    )
    assert keys.group_lease_key("c", "a/b") != keys.group_lease_key("c", "a") + "/b"


@given(prefix=st.binary(max_size=6), key=st.binary(max_size=8))
def test_a_prefix_range_holds_exactly_the_keys_starting_with_it(prefix: bytes, key: bytes) -> None:
    end = prefix_range_end(prefix)
    in_range = prefix <= key and (end == b"\0" or key < end)
    assert in_range == key.startswith(prefix)
