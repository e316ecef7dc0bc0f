"""The one-off copy of share groups to ``share-groups/`` while etcd refuses it.

etcd refusing the copy (permission denied after a change of roles or users) ended it with a
traceback ("background task share-index ended"), and the copy was not tried again until the
broker restarted: an older version's share groups stayed invisible to this version's share
partitions. Now a refusal is retried like an outage, logged once (``retry_log``). The copy
itself runs against a real etcd in tests/integration/test_cluster_view_ranges.py.
"""

from __future__ import annotations

import logging

import pytest

from kafscale.broker import upkeep
from kafscale.broker.metadata.etcd_errors import MetadataError

REFUSALS = 3


async def test_a_copy_etcd_refuses_is_retried_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[str] = []

    async def index_share_groups(_etcd: object, cluster: str) -> int:
        attempts.append(cluster)
        if len(attempts) <= REFUSALS:
            raise MetadataError("etcd get_prefix failed: etcdserver: permission denied")
        return 1

    monkeypatch.setattr(upkeep, "index_share_groups", index_share_groups)
    monkeypatch.setattr(upkeep, "SHARE_INDEX_RETRY_S", 0.0)
    caplog.set_level(logging.INFO, logger="kafscale.broker.upkeep")

    await upkeep.copy_share_groups(None, "c")  # type: ignore[arg-type]

    assert attempts == ["c"] * (REFUSALS + 1)
    lines = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert [(level, exc_info) for level, _, exc_info in lines] == [
        ("WARNING", None),
        ("INFO", None),
    ], lines
    assert "permission denied" in lines[0][1]
