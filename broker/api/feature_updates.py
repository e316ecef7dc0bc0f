"""UpdateFeatures (API 57): ``kafka-features.sh upgrade|downgrade|disable`` (and ``--dry-run``),
the Java Admin's ``updateFeatures``.

KafScale's finalized features (``api/features.py``) are fixed by code and configuration, not
records a controller writes: ``share.version`` is 1 on every broker and the proxy,
``transaction.version`` is the ``transactions.protocol_version`` setting. So a cluster answers
as a Kafka cluster answers a request that cannot change a level: asking for the level a feature
already has succeeds (Kafka writes an identical record, nothing changes), anything else fails
with INVALID_UPDATE_VERSION. Kafka's checks run first and in its order
(``FeatureControlManager.updateFeature``): the upgrade type, a negative level, the supported
range (an unknown feature supports level 0 only), the direction against the upgrade type. Then
the one KafScale adds: a level other than the finalized one. One failing feature fails the
request, with Kafka's top-level message (``QuorumController.updateFeatures``); ``validate_only``
(``--dry-run``) answers the same. ALTER on CLUSTER, as Kafka asks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafscale.broker.api import access
from kafscale.broker.api.dispatch import Body, RequestContext
from kafscale.broker.api.error_bodies import update_features_failure
from kafscale.broker.api.features import SHARE_VERSION, SUPPORTED
from kafscale.broker.authz.model import Operation
from kafscale.broker.protocol.errors import ErrorCode

UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3
FAILED_PREFIX = "The update failed for all features since the following feature had an error: "
FIXED_BY = {
    "transaction.version": "the brokers' and proxy's transactions.protocol_version setting",
    "share.version": "the broker release (share groups are always served)",
}

Refusal = tuple[ErrorCode, str]


def decide_update(
    feature: str,
    level: int,
    upgrade_type: int,
    finalized: Mapping[str, int],
    node_id: int,
) -> Refusal | None:
    """Why one feature update is refused (None: it is the level the feature has)."""
    reason = _refusal(feature, level, upgrade_type, finalized, node_id)
    if reason is None:
        return None
    return (
        ErrorCode.INVALID_UPDATE_VERSION,
        f"Invalid update version {level} for feature {feature}. {reason}",
    )


def _refusal(
    feature: str, level: int, upgrade_type: int, finalized: Mapping[str, int], node_id: int
) -> str | None:
    if upgrade_type not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        return "The controller does not support the given upgrade type."
    if level < 0:
        return "A feature version cannot be less than 0."
    low, high = SUPPORTED.get(feature, (0, 0))
    if not low <= level <= high:
        if high == 0:
            return f"Local controller {node_id} does not support this feature."
        return f"Local controller {node_id} only supports versions {low}-{high}"
    current = finalized.get(feature, 0)
    if level < current and upgrade_type == UPGRADE:
        return (
            "Can't downgrade the version of this feature without setting the upgrade type to "
            "either safe or unsafe downgrade."
        )
    if level > current and upgrade_type != UPGRADE:
        return "Can't downgrade to a newer version."
    if level != current:
        return (
            f"KafScale finalizes {feature} at level {current}, set by {FIXED_BY[feature]}; "
            "it cannot be changed at run time."
        )
    return None


def first_refusal(
    updates: list[tuple[str, int, int]], finalized: Mapping[str, int], node_id: int
) -> Refusal | None:
    """The first update refused, in request order: it fails them all, as in Kafka."""
    for feature, level, upgrade_type in updates:
        refusal = decide_update(feature, level, upgrade_type, finalized, node_id)
        if refusal is not None:
            return refusal
    return None


def upgrade_type_of(update: Any) -> int:
    """v0 says ``allow_downgrade`` (a safe downgrade when set), v1+ the upgrade type."""
    if hasattr(update, "upgrade_type"):
        return int(update.upgrade_type)
    return SAFE_DOWNGRADE if update.allow_downgrade else UPGRADE


def finalized_now(ctx: RequestContext) -> dict[str, int]:
    """The levels ApiVersions reports on this broker."""
    return {
        "transaction.version": ctx.broker.settings.transactions.protocol_version,
        "share.version": SHARE_VERSION,
    }


async def handle_update_features(request: Any, ctx: RequestContext) -> Body:
    updates = [
        (str(u.feature), int(u.max_version_level), upgrade_type_of(u))
        for u in request.feature_updates
    ]
    if not access.allowed_on_cluster(ctx, Operation.ALTER):
        return update_features_failure(
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Cluster authorization failed."
        )
    refusal = first_refusal(updates, finalized_now(ctx), ctx.broker.node_id)
    if refusal is not None:
        code, message = refusal
        return update_features_failure(code, FAILED_PREFIX + message)
    body: Body = {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None}
    if ctx.api_version < 2:  # v2 dropped the per-feature results
        body["results"] = [
            {"feature": feature, "error_code": ErrorCode.NONE, "error_message": None}
            for feature, _, _ in updates
        ]
    return body
