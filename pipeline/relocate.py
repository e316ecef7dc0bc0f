"""Executor side: where a task's offsets are now, once a compaction pass superseded the objects
the driver planned and deleted them (``log.cleaner_delete_delay_s`` after its commit).

Spark retries a task on the same plan, so re-planning on the driver cannot help a running job.
The task reads its partition's current committed state instead (two etcd reads: the state,
then the topic's id, to tell a topic created again under the name), then the same
listings the driver's planning makes (``Catalog.segments``). Only tasks of compacted topics
carry the etcd settings this needs (``source.TaskPartition``), and only such a task that found
an object gone connects to etcd at all. Imported only then: it brings the etcd client along.
"""

from __future__ import annotations

from kafscale.broker.storage.object_store import ObjectStore
from kafscale.pipeline.catalog import Catalog, PartitionEntry, SourceUnavailable, view_of
from kafscale.pipeline.options import Connection
from kafscale.pipeline.planning import PartitionView, ReadTask, SegmentObject


class CannotRelocate(RuntimeError):
    """The partition's current state or objects cannot be read (etcd or the store did not
    answer, or refused this executor)."""


async def current_objects(
    connection: Connection, store: ObjectStore, task: ReadTask, resume: int
) -> tuple[PartitionView, list[SegmentObject]] | None:
    """The partition's committed state as a view, and its committed objects that may hold
    ``resume`` or later (or from the log start, if that moved past it); None when the planned
    topic is gone (deleted, its name perhaps taken by a topic created again since)."""
    try:
        async with Catalog(connection, store) as catalog:
            state = await catalog.partition_state(task.topic, task.partition)
            # States are keyed by name: after the state, the name must still be the planned
            # topic's (ids never repeat), or the state may be a topic created again since.
            if state is None or await catalog.topic_id(task.topic) != task.topic_id:
                return None
            view = view_of(task.topic, task.topic_id, task.partition, state, task.compacted)
            entry = PartitionEntry(view, state)
            segments = await catalog.segments(entry, max(resume, view.log_start))
            return view, segments
    except SourceUnavailable as exc:
        raise CannotRelocate(str(exc)) from exc
