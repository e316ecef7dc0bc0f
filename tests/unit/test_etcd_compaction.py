"""The compaction decision: keep one interval of etcd history, compact once per revision."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata.compaction import compaction_target, is_compactor

pytestmark = pytest.mark.unit


def test_nothing_to_compact_on_the_first_tick() -> None:
    assert compaction_target(None, 0) is None


def test_compacts_to_the_revision_seen_an_interval_ago() -> None:
    assert compaction_target(120, 0) == 120
    assert compaction_target(120, 100) == 120


def test_never_compacts_twice_to_the_same_revision() -> None:
    assert compaction_target(120, 120) is None


def test_only_the_lowest_live_broker_compacts() -> None:
    assert is_compactor(1, [1, 2, 3])
    assert not is_compactor(2, [1, 2, 3])
    assert not is_compactor(2, [])
