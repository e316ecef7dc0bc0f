"""Writing the desired assignment from inside the cluster (``kafscale local``, plain processes).

Outside Kubernetes nobody else writes the assignment, so the brokers elect one of themselves
(an ``assigner`` lease key bound to the holder's session) to recompute it whenever the set of
live, non-draining brokers or the set of partitions changes. The decision itself is the pure
``decide_assignment``; the write is a compare-and-swap on the assignment key, so it never
overwrites a concurrent writer such as the operator, which computes the same deterministic
function over the same inputs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kafscale.broker.metadata import keys
from kafscale.broker.metadata.assignment import Assignment, decide_assignment
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.etcd_txn import create_revision_is, mod_revision_is, put_op
from kafscale.broker.metadata.session_lease import SessionLease
from kafscale.broker.observability.retry_log import RetryLog

log = logging.getLogger(__name__)


def assigner_key(cluster: str) -> str:
    return f"{keys.cluster_prefix(cluster)}leases/assigner"


def desired_assignment(view: ClusterView) -> dict[tuple[str, int], int]:
    """The assignment the view's live, non-draining brokers should follow (pure on the view)."""
    brokers = [b for b in view.live_broker_ids() if b not in view.draining]
    return decide_assignment(sorted(view.partitions()), brokers, view.assignment.owners)


class Rebalancer:
    def __init__(self, etcd: Etcd, view: ClusterView, cluster: str, broker_id: int) -> None:
        self._etcd = etcd
        self._view = view
        self._cluster = cluster
        self._broker_id = broker_id

    async def run(self, session_of: object, stopped: Callable[[], bool] = lambda: False) -> None:
        """Campaign for the assigner role and keep the assignment current while holding it.
        etcd failures are retried every second, logged once per run (``retry_log``). Ends
        once ``stopped()``: the whole cluster is stopping (``kafscale local``), so no broker is
        left to follow a new assignment, and writing one (or campaigning for the role its
        stopped holder let go) would only be etcd writes for nothing."""
        retries = RetryLog(log, "rebalancer: etcd")
        while not stopped():
            changed = self._view.changed
            try:
                session = session_of() if callable(session_of) else session_of
                assert isinstance(session, SessionLease)
                if await self._hold_role(session):
                    await self.write_if_changed()
            except MetadataError as exc:
                # LeaseLost too (our session ended under the campaign): before, it ended this
                # task for good, and the broker never wrote the assignment again.
                retries.failed(exc)
                await asyncio.sleep(1)
                continue
            retries.succeeded()
            await changed.wait()

    async def _hold_role(self, session: SessionLease) -> bool:
        key = assigner_key(self._cluster)
        me = str(self._broker_id).encode()
        current = await self._etcd.get(key)
        if current is not None:
            return current.value == me
        return await self._etcd.create_if_absent(key, me, lease=session.id)

    async def write_if_changed(self) -> bool:
        """One CAS write of the new assignment if it differs from the stored one."""
        key = keys.assignment_key(self._cluster)
        current = await self._etcd.get(key)
        previous = Assignment.from_json(current.value) if current else Assignment(0, {})
        brokers = [b for b in self._view.live_broker_ids() if b not in self._view.draining]
        owners = decide_assignment(sorted(self._view.partitions()), brokers, previous.owners)
        if owners == previous.owners:
            return False
        updated = Assignment(previous.generation + 1, owners)
        guard = (
            mod_revision_is(key, current.mod_revision) if current else create_revision_is(key, 0)
        )
        result = await self._etcd.txn([guard], [put_op(key, updated.to_json())])
        if result.succeeded:
            self._view.assignment = updated
            log.info("assignment generation %d over brokers %s", updated.generation, brokers)
        return result.succeeded
