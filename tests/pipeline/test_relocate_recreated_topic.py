"""A task of a compacted topic whose planned objects are gone because the topic was deleted,
and whose name now belongs to a topic created again and already compacted: the task must not
re-locate into the new topic's state. Partition states are keyed by topic name, not id, so the
new topic's cleaned range would count the old topic's missing offsets as "removed by the
cleaner" and the task would return nothing with ``failOnDataLoss=true``. The old topic's
offsets are gone: that is data loss, as the docs say of a topic deleted meanwhile.

Real etcd (the partition state and the topic record as brokers write them) and a real local
object store; the task runs as an executor runs it (``fetch.read_task``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from harness.etcd import EmbeddedEtcd

from kafscale.broker.config import EtcdSettings, StorageSettings
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import TopicInfo
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.partition_state import Cleaned, PartitionState
from kafscale.pipeline.fetch import read_task
from kafscale.pipeline.options import TaskReading
from kafscale.pipeline.planning import DataLoss, ReadTask, SegmentObject

pytestmark = pytest.mark.pipeline

CLUSTER = "recreated"


async def _recreate_compacted(url: str) -> None:
    """The topic ``t`` again, with a new id, whose partition a pass cleaned up to offset 8."""
    etcd = await Etcd.connect([url], timeout_s=10)
    try:
        info = TopicInfo("t", "new-id", 1, {"cleanup.policy": "compact"})
        await etcd.put(keys.topic_key(CLUSTER, "t"), info.to_json())
        state = PartitionState(high_watermark=10, cleaned=Cleaned(upto=8, generation=0, epoch=1))
        await etcd.put(keys.partition_state_key(CLUSTER, "t", 0), state.to_json())
    finally:
        await etcd.close()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_a_task_of_a_deleted_topic_does_not_relocate_into_its_successor(
    tmp_path: Path, etcd_server: EmbeddedEtcd, fail_on_data_loss: bool
) -> None:
    asyncio.run(_recreate_compacted(etcd_server.client_url))
    # Planned on the old topic (id "old-id"): one cleaned object of generation 0, now deleted
    # with the rest of the old topic's objects.
    planned = (SegmentObject(0, 1, 100, 0),)
    task = ReadTask("t", "old-id", 0, 0, 4, planned, (), 4, 0, True)
    reading = TaskReading(
        CLUSTER, StorageSettings(kind="local", local_dir=tmp_path), False, fail_on_data_loss
    )
    etcd = EtcdSettings(endpoints=[etcd_server.client_url])

    if fail_on_data_loss:
        with pytest.raises(DataLoss, match=r"t-0: offsets 0\.\.3"):
            list(read_task(reading, task, etcd))
    else:
        assert list(read_task(reading, task, etcd)) == []
