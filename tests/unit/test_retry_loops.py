"""Retry loops log a run of failures once, then a summary, and the recovery (``retry_log``):
the deleting broker's purge of a deleted topic's objects (``storage.topic_purge``) and a
transaction's markers (``transactions.markers``) wrote a line per attempt (a WARNING a second
per transaction while an owner was unreachable). Real loops against in-memory fakes of their
ports, failing a set number of times; the lines counted."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from kafscale.broker.metadata.cluster import BrokerInfo
from kafscale.broker.protocol.errors import ErrorCode
from kafscale.broker.storage.object_store import ObjectStoreError
from kafscale.broker.storage.topic_purge import TopicPurger
from kafscale.broker.transactions.markers import Marker, MarkerWriter

PURGE_LOGGER = "kafscale.broker.storage.topic_purge"
MARKERS_LOGGER = "kafscale.broker.transactions.markers"


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger]


class RefusingStore:
    """An object store port whose listing fails ``refusals`` times, then holds one object."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.deleted: list[str] = []

    async def list(self, prefix: str) -> list[Any]:
        if self.refusals:
            self.refusals -= 1
            raise ObjectStoreError("connection refused")
        return [SimpleNamespace(key=prefix + "00000000000000000000.kfs")]

    async def delete_many(self, object_keys: list[str]) -> None:
        self.deleted.extend(object_keys)


class Tombstones:
    """The etcd port's delete, all the purge needs of it."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete(self, key: str) -> None:
        self.deleted.append(key)


class NoCache:
    def discard_prefix(self, prefix: str) -> None:
        pass


def purger(store: RefusingStore, etcd: Tombstones) -> TopicPurger:
    return TopicPurger("c", etcd, store, NoCache())  # type: ignore[arg-type]


def test_a_purge_retried_five_times_logs_one_warning_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, etcd = RefusingStore(5), Tombstones()
    with caplog.at_level(logging.DEBUG, logger=PURGE_LOGGER):
        asyncio.run(purger(store, etcd).purge_with_retries("t", "abc", delays_s=(0.0,) * 6))
    assert store.deleted and etcd.deleted  # done in the end
    logged = lines(caplog, PURGE_LOGGER)
    assert logged[:2] == [
        (
            logging.WARNING,
            "deleting the objects of topic t: connection refused (again in 0 s); retrying",
        ),
        (logging.INFO, "deleted 1 objects of deleted topic t (id abc)"),
    ]
    assert len(logged) == 3 and logged[2][0] == logging.INFO
    assert logged[2][1].startswith(
        "deleting the objects of topic t: recovered after 5 failed attempts / "
    )


def test_a_purge_that_gives_up_logs_one_warning_and_the_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, etcd = RefusingStore(100), Tombstones()
    with caplog.at_level(logging.DEBUG, logger=PURGE_LOGGER):
        asyncio.run(purger(store, etcd).purge_with_retries("t", "abc", delays_s=(0.0,) * 6))
    assert not store.deleted and not etcd.deleted  # the tombstone stays for the periodic purge
    assert [level for level, _ in lines(caplog, PURGE_LOGGER)] == [logging.WARNING, logging.ERROR]


class OneOwner:
    """Routing: every partition is broker 2's."""

    def leader_for(self, tp: tuple[str, int]) -> int:
        return 2

    def broker(self, node_id: int) -> BrokerInfo | None:
        return BrokerInfo(node_id, "127.0.0.1", 9) if node_id == 2 else None

    def topic_exists(self, topic: str) -> bool:
        return True


class FailingOwner:
    """The inter-broker client: ``unreachable`` calls raise, the next ``refusals`` answer
    ``refusal``, then every partition is answered NONE."""

    timeout_s = 5.0

    def __init__(self, unreachable: int = 0, refusals: int = 0) -> None:
        self.unreachable = unreachable
        self.refusals = refusals
        self.calls = 0

    async def call(self, broker: BrokerInfo, api_key: int, version: int, body: Any) -> Any:
        self.calls += 1
        if self.unreachable:
            self.unreachable -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        code = ErrorCode.NONE
        if self.refusals:
            self.refusals -= 1
            code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        topics = [
            SimpleNamespace(
                name=t["name"],
                partitions=[
                    SimpleNamespace(partition_index=p, error_code=code)
                    for p in t["partition_indexes"]
                ],
            )
            for t in body["markers"][0]["topics"]
        ]
        return SimpleNamespace(markers=[SimpleNamespace(topics=topics)])


MARKER = Marker(producer_id=5, producer_epoch=0, commit=True, coordinator_epoch=0)


def write_markers(client: FailingOwner) -> None:
    writer = MarkerWriter(OneOwner(), client, node_id=1)  # type: ignore[arg-type]
    asyncio.run(writer.write(MARKER, [("t", 0), ("t", 1)]))


def test_markers_at_an_unreachable_owner_log_one_warning_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FailingOwner(unreachable=6)
    with caplog.at_level(logging.DEBUG, logger=MARKERS_LOGGER):
        write_markers(client)
    assert client.calls == 7
    logged = lines(caplog, MARKERS_LOGGER)
    assert [level for level, _ in logged] == [logging.WARNING, logging.INFO]
    assert logged[0][1] == (
        "cannot write txn markers of producer 5 epoch 0: at broker 2: "
        "ConnectionRefusedError(111, 'Connection refused'); retrying"
    )
    assert logged[1][1].startswith(  # then the time it took, whatever the machine's load
        "cannot write txn markers of producer 5 epoch 0: recovered after 6 failed attempts / "
    )


def test_markers_a_moving_owner_refuses_log_one_info_and_the_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FailingOwner(refusals=4)
    with caplog.at_level(logging.DEBUG, logger=MARKERS_LOGGER):
        write_markers(client)
    assert client.calls == 5
    logged = lines(caplog, MARKERS_LOGGER)
    assert [level for level, _ in logged] == [logging.INFO, logging.INFO]
    assert logged[0][1] == (
        "txn markers of producer 5 epoch 0 to retry: at broker 2: "
        "{('t', 0): 'NOT_LEADER_OR_FOLLOWER', ('t', 1): 'NOT_LEADER_OR_FOLLOWER'}; retrying"
    )
    assert "recovered after 4 failed attempts" in logged[1][1]
