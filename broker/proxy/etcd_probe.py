"""Whether etcd answers the proxy: one cheap read a second, its outcome in the view's health.

The proxy learns of ownership changes only through its cluster view's watch streams, and a
watch stream says nothing when etcd stops answering without closing the connection (frozen,
its host paused, a network that drops packets). gRPC's keepalive ended such a stream only about
70 s later here (a watch on an etcd under SIGSTOP: "Stream removed (ping timeout)" after 69 s,
whatever the channel's keepalive settings), and the proxy stayed ready all that time, routing by
owners it could no longer check while the brokers' sessions expired behind it.

So the proxy reads etcd's revision every ``PROBE_INTERVAL_S`` under the etcd call timeout
(``etcd.timeout_s``); a read that fails marks the view's part ``PART`` as not following
(``FollowHealth``: ``/readyz`` 503, ``kafscale_cluster_view_following`` 0, a limited WARNING),
and the next read that answers clears it. A proxy therefore turns not-ready within about
``etcd.timeout_s`` + ``PROBE_INTERVAL_S`` of etcd going silent, and ready again within a second
of it answering (once the watches, which resume on their own, are created again too).
"""

from __future__ import annotations

from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.metadata.etcd_errors import MetadataError
from kafscale.broker.metadata.view_health import FollowHealth

PROBE_INTERVAL_S = 1.0
"""Between two reads: one small range request a second per proxy costs etcd nothing."""

PART = "etcd reads"
"""The part of the view the probe stands for (``/status``'s ``cluster_view_stopped``)."""


async def probe_etcd(
    etcd: Etcd, health: FollowHealth, interval_s: float = PROBE_INTERVAL_S
) -> None:
    """Read etcd's revision every ``interval_s`` until the client is closed, telling ``health``
    whether it answered."""
    while not etcd.closed:
        try:
            await etcd.revision()
        except MetadataError as error:
            if etcd.closed:
                return
            health.failed(PART, error)
        else:
            health.recovered(PART)
        await etcd.pause(interval_s)
