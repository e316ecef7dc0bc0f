"""Feature flags ApiVersions reports (KIP-584): what this broker supports and what the cluster
runs with. Every broker of a cluster (and the proxy) runs the same code, so the finalized levels
are this code's, at a fixed epoch.

``transaction.version`` 2 is transaction protocol v2 (KIP-890 part 2): clients that know it
(the Java client from 4.0) then send EndTxn v5 (the epoch is bumped with every commit or abort),
Produce v12 and TxnOffsetCommit v5 without AddPartitionsToTxn/AddOffsetsToTxn (the partition's
owner and the group's coordinator add them to the transaction). The finalized level is a
setting (``transactions.protocol_version``) so that a rolling upgrade can hold clients on v1
until every broker and proxy serves v2, as ``kafka-features.sh`` does for Kafka.
"""

from __future__ import annotations

from typing import Any

TRANSACTION_VERSION = 2
FEATURES_EPOCH = 1
"""Valid epochs are >= 0 (-1: unknown); clients take the features of the highest epoch seen."""

SUPPORTED: dict[str, tuple[int, int]] = {"transaction.version": (0, TRANSACTION_VERSION)}


def finalized_levels(transaction_version: int) -> dict[str, int]:
    """Kafka lists no finalized entry for a feature at level 0 (off)."""
    return {"transaction.version": transaction_version} if transaction_version > 0 else {}


def features_body(transaction_version: int = TRANSACTION_VERSION) -> dict[str, Any]:
    """The feature fields of an ApiVersions response (v3+; older versions drop them)."""
    return {
        "supported_features": [
            {"name": name, "min_version": low, "max_version": high}
            for name, (low, high) in SUPPORTED.items()
        ],
        "finalized_features_epoch": FEATURES_EPOCH,
        "finalized_features": [
            {"name": name, "max_version_level": level, "min_version_level": level}
            for name, level in finalized_levels(transaction_version).items()
        ],
    }
