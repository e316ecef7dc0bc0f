"""A cluster whose first broker reaches etcd through a ``TcpRelay``: etcd's answers to it can be
held back (``relay.holding_replies()``) while its requests, keepalives included, still reach
etcd and are applied. Held for a moment, a commit etcd applied is answered late
(``test_durability.py``); held past the TTL, the broker's session is suspended though etcd
still holds its lease (``broker/metadata/session_lease.py``); let go in time, it resumes
(``test_session_lapse.py``, ``test_rebalance_resume.py``).

The broker's etcd calls time out after 1 s (``KAFSCALE_ETCD__TIMEOUT_S``, 5 s by default), so
a call whose answer is held fails within a second of it and the broker tries again. Other
brokers a test starts on ``cluster`` reach etcd through the relay too, unless the test gives
them etcd's own endpoint (``KAFSCALE_ETCD__ENDPOINTS``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.brokers import BrokerCluster, new_cluster
from harness.s3 import S3Endpoint
from harness.tcp_relay import TcpRelay
from kafscale.broker.child_process import BrokerProcess
from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd

ETCD_TIMEOUT_S = "1"
"""The relayed broker's etcd call timeout (``KAFSCALE_ETCD__TIMEOUT_S``)."""
RESUMED = "resumed: etcd still holds it"
"""The broker's log line when its suspended session resumes (``session_lease``). The whole
phrase: a bare "resumed" also matched a group named "resumed" in the log from the start."""
LOST = "etcd session lost"
"""The broker's log line when it gives its lost session up for a new one."""


@dataclass
class RelayedCluster:
    """The relay, the cluster and its first broker (the one behind the relay)."""

    relay: TcpRelay
    cluster: BrokerCluster
    broker: BrokerProcess

    def log_says(self, text: str) -> bool:
        """Whether the relayed broker's log has ``text`` (e.g. "suspended", ``RESUMED``)."""
        return text in self.broker.log_path.read_text(errors="replace")

    def said_lost(self) -> bool:
        """Whether the relayed broker logged its session lost: the session lease's line
        (``session lease <id> lost: …``) or the broker's (``LOST``). Not a bare "lost": a
        refused Produce's line says the session is "suspended or lost"."""
        text = self.broker.log_path.read_text(errors="replace")
        return LOST in text or re.search(r"session lease [0-9a-f]+ lost: ", text) is not None

    def resumed_or_lost(self) -> bool:
        """Whether the broker's session has resumed or was lost (what to wait for once etcd's
        answers flow again; the caller then asserts which)."""
        return self.log_says(RESUMED) or self.log_says(LOST)


@contextmanager
def relayed_cluster(
    etcd: EmbeddedEtcd,
    s3: S3Endpoint,
    workdir: Path,
    name: str,
    label: str = "held",
    **overrides: str,
) -> Iterator[RelayedCluster]:
    """A cluster named ``name`` (its bucket starting with ``label``) with one broker started,
    whose etcd is ``etcd`` through a relay; ``overrides`` are the broker's other settings
    (e.g. ``KAFSCALE_ETCD__SESSION_TTL_S``). Its brokers are stopped and the relay closed at
    the end."""
    relay = TcpRelay("127.0.0.1", int(etcd.client_url.rsplit(":", 1)[1]))
    try:
        cluster = new_cluster(relay.url, s3, workdir, label, name=name)
        try:
            broker = cluster.start(KAFSCALE_ETCD__TIMEOUT_S=ETCD_TIMEOUT_S, **overrides)
            yield RelayedCluster(relay, cluster, broker)
        finally:
            cluster.stop_all()
    finally:
        relay.close()
