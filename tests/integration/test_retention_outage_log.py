"""An offset retention check that etcd does not answer reports one error, not one per group.

While etcd is away each coordinated group's retention check fails alike; the check used to log
a WARNING per group per check (500 groups: 500 lines per check for the whole outage). Now the
check goes on with every group and reports what etcd left unanswered as one error, which the
check's loop logs once, then summarises (``retry_log``). The coordinator runs in this process
against its own real etcd, which the test pauses; the check is run by hand.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid

import pytest
from harness.children import freeze
from harness.coordinator_host import hand_checked_retention, running_coordinator

from kafscale.broker.groups.model import GroupRecord
from kafscale.broker.groups.retention_outage import RetentionNotChecked
from kafscale.broker.groups.retention_runtime import wall_clock_ms
from kafscale.broker.groups.store import CommittedOffset, encode_group, encode_offset
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUPS = 5
RETENTION_MS = 60_000
# the groups stay coordinated here through the test
CONFIG = hand_checked_retention(RETENTION_MS, vacant_release_ms=3_600_000)


async def test_a_check_etcd_leaves_unanswered_is_one_error_naming_the_groups(
    etcd_server_private: EmbeddedEtcd, cluster_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="kafscale.broker.groups")
    etcd_pid = etcd_server_private.pid
    assert etcd_pid is not None
    async with running_coordinator(
        etcd_server_private.client_url, cluster_name, CONFIG, etcd_timeout_s=0.5
    ) as (host, coordinator):
        long_ago = wall_clock_ms() - 2 * RETENTION_MS
        group_ids = [f"outage-{uuid.uuid4().hex[:6]}-{n}" for n in range(GROUPS)]
        for group_id in group_ids:
            # Empty for two retentions, one offset committed then: due to expire
            record = GroupRecord("consumer", 3, None, None, empty_since_ms=long_ago)
            await host.etcd.put(
                keys.group_metadata_key(host.cluster, group_id), encode_group(record)
            )
            offset = encode_offset(CommittedOffset(7, commit_timestamp_ms=long_ago))
            await host.etcd.put(keys.group_offset_key(host.cluster, group_id, "t", 0), offset)
            await coordinator.runtime(group_id)
        freeze(etcd_pid)
        try:
            with pytest.raises(RetentionNotChecked) as raised:
                await coordinator.expire_offsets()
        finally:
            os.kill(etcd_pid, signal.SIGCONT)
        await coordinator.expire_offsets()  # etcd answers again: the next check does it all
        for group_id in group_ids:
            stored = await host.etcd.get_prefix(keys.group_prefix(host.cluster, group_id))
            assert stored == [], group_id
    message = str(raised.value)
    assert f"{GROUPS} of {GROUPS} groups not checked" in message, message
    assert group_ids[0] in message and f"and {GROUPS - 3} more" in message, message
    assert "stored groups not listed" in message, message
    per_group = [r for r in caplog.records if "offset retention of group" in r.getMessage()]
    assert not [r for r in per_group if r.levelno >= logging.WARNING], per_group
