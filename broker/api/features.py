"""Feature flags ApiVersions reports (KIP-584): what this broker supports and what the cluster
runs with. Every broker of a cluster (and the proxy) runs the same code, so the finalized levels
are this code's, at a fixed epoch. UpdateFeatures (``kafka-features.sh``) accepts only the levels
they have (``api/feature_updates.py``).

``transaction.version`` 2 is transaction protocol v2 (KIP-890 part 2): clients that know it
(the Java client from 4.0) then send EndTxn v5 (the epoch is bumped with every commit or abort),
Produce v12 and TxnOffsetCommit v5 without AddPartitionsToTxn/AddOffsetsToTxn (the partition's
owner and the group's coordinator add them to the transaction). The finalized level is a
setting (``transactions.protocol_version``) so that a rolling upgrade can hold clients on v1
until every broker and proxy serves v2, as ``kafka-features.sh`` does for Kafka.

``share.version`` 1 says share groups (KIP-932) are served: brokers serve them (ShareGroupHeartbeat,
ShareGroupDescribe, ShareFetch, ShareAcknowledge), and so does the proxy, which maps a client's
share session onto one per owning broker (``broker/proxy/share_sessions.py``).
"""

from __future__ import annotations

from typing import Any

TRANSACTION_VERSION = 2
FEATURES_EPOCH = 1
"""Valid epochs are >= 0 (-1: unknown); clients take the features of the highest epoch seen."""

SHARE_VERSION = 1
SHARE_CONSUMER_KEYS = frozenset({76, 78, 79})
"""ShareGroupHeartbeat, ShareFetch, ShareAcknowledge: what a share consumer sends (the proxy
sends the heartbeat to the group's coordinator and splits the other two by partition owner)."""

SUPPORTED: dict[str, tuple[int, int]] = {
    "transaction.version": (0, TRANSACTION_VERSION),
    "share.version": (0, SHARE_VERSION),
}


def finalized_levels(
    transaction_version: int, share_version: int = SHARE_VERSION
) -> dict[str, int]:
    """Kafka lists no finalized entry for a feature at level 0 (off)."""
    levels = {"transaction.version": transaction_version, "share.version": share_version}
    return {name: level for name, level in levels.items() if level > 0}


def features_body(
    transaction_version: int = TRANSACTION_VERSION, share_version: int = SHARE_VERSION
) -> dict[str, Any]:
    """The feature fields of an ApiVersions response (v3+; older versions drop them)."""
    supported = (
        SUPPORTED if share_version else {k: v for k, v in SUPPORTED.items() if k != "share.version"}
    )
    return {
        "supported_features": [
            {"name": name, "min_version": low, "max_version": high}
            for name, (low, high) in supported.items()
        ],
        "finalized_features_epoch": FEATURES_EPOCH,
        "finalized_features": [
            {"name": name, "max_version_level": level, "min_version_level": level}
            for name, level in finalized_levels(transaction_version, share_version).items()
        ],
    }
