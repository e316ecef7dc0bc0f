"""The key ranges a cluster view follows hold every key it keeps and none written per request
for one broker's own use (``metadata/view_ranges.py``; share-partition states and the producer
id counter lie inside, written per flush round and per InitProducerId)."""

from __future__ import annotations

import itertools

import pytest

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.rebalancer import assigner_key
from kafscale.broker.metadata.view_ranges import in_view, view_ranges

pytestmark = pytest.mark.unit

C = "c"

KEPT = [
    keys.topic_key(C, "t"),
    keys.broker_key(C, 3),
    keys.partition_state_key(C, "t", 0),
    keys.partition_lease_key(C, "t", 0),
    keys.assignment_key(C),
    keys.draining_key(C, 3),
    keys.group_config_key(C, "g/1"),
    keys.acl_key(C, "TOPIC", "LITERAL", "t", "User:a", "*", "READ", "ALLOW"),
    keys.quota_key(C, [("user", "u"), ("client-id", None)]),
    keys.share_group_key(C, "g/1"),
    assigner_key(C),  # its deletion wakes the brokers to campaign for the role
]

NOT_KEPT = [
    keys.group_offset_key(C, "g", "t", 0),
    keys.group_metadata_key(C, "g"),
    keys.group_txn_offset_key(C, "g", 7, "t", 0),
    keys.group_lease_key(C, "g"),
    keys.transaction_key(C, "tx"),
    keys.scram_credential_key(C, "u", "SCRAM-SHA-256"),
    keys.share_groups_indexed_key(C),
    keys.topic_key("c2", "t"),  # another cluster whose name extends this one's
    "/kafscale/c-other/topics/t",
]


@pytest.mark.parametrize("key", KEPT)
def test_kept_keys_are_followed(key: str) -> None:
    assert in_view(C, key)


@pytest.mark.parametrize("key", NOT_KEPT)
def test_per_request_keys_are_not(key: str) -> None:
    assert not in_view(C, key)


def test_ranges_are_ordered_and_apart() -> None:
    ranges = view_ranges(C)
    for start, end in ranges:
        assert start < end
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start
