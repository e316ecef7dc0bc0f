"""The APIs and version ranges the cluster serves: what ApiVersions answers, on a broker and on
the proxy alike. No request handler here, nothing that does I/O: the broker's dispatcher
(``api/table.py`` pairs each entry with its handler) and the proxy (``broker/proxy``, which
forwards most of them) both import this module, so the two answers cannot drift apart and the
proxy does not load the broker's handlers to learn what the cluster serves.

Ranges are those a Kafka 3.9 broker offers. kio follows Kafka 4, which dropped the oldest
versions (KIP-896); the layouts of those are in ``protocol/legacy_schemas.py``, and Produce v0-v2
and Fetch v0-v3 carry message format v0/v1, converted to and from the stored v2 batches by
``protocol/legacy_messages.py``. Anything not here is answered with UNSUPPORTED_VERSION, or,
where no response layout exists for the version, by closing the connection. Not served on
purpose: DescribeQuorum (55), which describes a KRaft controller quorum; KafScale's metadata
quorum is etcd (``docs/replicas.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafscale.broker.api.features import SHARE_VERSION, TRANSACTION_VERSION, features_body
from kafscale.broker.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class ServedApi:
    key: int
    name: str
    min_version: int
    max_version: int
    # The lowest version ApiVersions names, when that is below the lowest one served. Only for
    # clients that decide a feature from the advertised floor (see SaslHandshake below).
    advertised_min_version: int | None = None

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    @property
    def advertised_range(self) -> tuple[int, int]:
        if self.advertised_min_version is None:
            return self.min_version, self.max_version
        return self.advertised_min_version, self.max_version


SERVED: tuple[ServedApi, ...] = (
    ServedApi(0, "Produce", 0, 12),
    ServedApi(1, "Fetch", 0, 16),
    ServedApi(2, "ListOffsets", 0, 8),
    ServedApi(3, "Metadata", 0, 12),
    ServedApi(8, "OffsetCommit", 0, 9),
    ServedApi(9, "OffsetFetch", 0, 9),
    ServedApi(10, "FindCoordinator", 0, 4),
    ServedApi(11, "JoinGroup", 0, 9),
    ServedApi(12, "Heartbeat", 0, 4),
    ServedApi(13, "LeaveGroup", 0, 5),
    ServedApi(14, "SyncGroup", 0, 5),
    ServedApi(15, "DescribeGroups", 0, 5),
    ServedApi(16, "ListGroups", 0, 5),
    ServedApi(18, "ApiVersions", 0, 3),
    ServedApi(19, "CreateTopics", 2, 7),
    ServedApi(20, "DeleteTopics", 1, 6),
    ServedApi(21, "DeleteRecords", 0, 2),
    ServedApi(22, "InitProducerId", 0, 5),
    ServedApi(23, "OffsetForLeaderEpoch", 2, 4),
    # Transactions, with transaction protocol v2 (KIP-890 part 2, ``api/features.py``):
    # EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit v5 add implicitly.
    ServedApi(24, "AddPartitionsToTxn", 0, 5),
    ServedApi(25, "AddOffsetsToTxn", 0, 4),
    ServedApi(26, "EndTxn", 0, 5),
    ServedApi(28, "TxnOffsetCommit", 0, 5),
    ServedApi(65, "DescribeTransactions", 0, 0),
    ServedApi(66, "ListTransactions", 0, 1),
    ServedApi(29, "DescribeAcls", 1, 3),
    ServedApi(30, "CreateAcls", 1, 3),
    ServedApi(31, "DeleteAcls", 1, 3),
    ServedApi(32, "DescribeConfigs", 1, 4),
    ServedApi(33, "AlterConfigs", 0, 2),
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-2.
    ServedApi(34, "AlterReplicaLogDirs", 1, 2),
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-4.
    ServedApi(35, "DescribeLogDirs", 1, 4),
    ServedApi(37, "CreatePartitions", 0, 3),
    ServedApi(44, "IncrementalAlterConfigs", 0, 1),
    ServedApi(42, "DeleteGroups", 0, 2),
    # Replicas are the lease owner (``api/replicas.py``): elections are never needed while a
    # broker can lead, reassignments complete when accepted.
    ServedApi(43, "ElectLeaders", 0, 2),
    ServedApi(45, "AlterPartitionReassignments", 0, 1),
    ServedApi(46, "ListPartitionReassignments", 0, 0),
    ServedApi(47, "OffsetDelete", 0, 0),
    ServedApi(60, "DescribeCluster", 0, 1),
    # Finalized features are fixed (``api/feature_updates.py``): the level they have succeeds.
    ServedApi(57, "UpdateFeatures", 0, 2),
    ServedApi(74, "ListConfigResources", 0, 1),
    ServedApi(75, "DescribeTopicPartitions", 0, 0),
    # Sent by transaction coordinators (brokers) and kafka-transactions.sh abort.
    ServedApi(27, "WriteTxnMarkers", 0, 1),
    ServedApi(61, "DescribeProducers", 0, 0),
    ServedApi(68, "ConsumerGroupHeartbeat", 0, 1),
    ServedApi(69, "ConsumerGroupDescribe", 0, 1),
    # Share groups (KIP-932, ``docs/share-groups.md``).
    ServedApi(76, "ShareGroupHeartbeat", 1, 1),
    ServedApi(77, "ShareGroupDescribe", 1, 1),
    ServedApi(78, "ShareFetch", 1, 2),
    ServedApi(79, "ShareAcknowledge", 1, 2),
    ServedApi(90, "DescribeShareGroupOffsets", 0, 1),
    ServedApi(91, "AlterShareGroupOffsets", 0, 0),
    ServedApi(92, "DeleteShareGroupOffsets", 0, 0),
    # SaslHandshake v0 sent the SASL tokens as bare frames; every client in use sends v1. It
    # is advertised from v0 all the same: librdkafka (kcat) decides that the broker supports
    # SASL handshakes at all from a range that includes v0, before it picks v1.
    ServedApi(17, "SaslHandshake", 1, 1, advertised_min_version=0),
    ServedApi(36, "SaslAuthenticate", 0, 2),
    # Client quotas (``api/client_quotas.py``), enforced per broker (``quotas/enforcement.py``).
    ServedApi(48, "DescribeClientQuotas", 0, 1),
    ServedApi(49, "AlterClientQuotas", 0, 1),
    # Delegation tokens (KIP-48, ``api/delegation_tokens.py``). v0 is gone from kio (Kafka 4
    # dropped it, KIP-896); v1 has v0's layout.
    ServedApi(38, "CreateDelegationToken", 1, 3),
    ServedApi(39, "RenewDelegationToken", 1, 2),
    ServedApi(40, "ExpireDelegationToken", 1, 2),
    ServedApi(41, "DescribeDelegationToken", 1, 3),
    ServedApi(50, "DescribeUserScramCredentials", 0, 0),
    ServedApi(51, "AlterUserScramCredentials", 0, 0),
)

SERVED_APIS: dict[int, ServedApi] = {api.key: api for api in SERVED}
"""The exact APIs and version ranges this cluster implements, by API key."""


def api_versions_body(
    apis: Mapping[int, ServedApi] = SERVED_APIS,
    code: ErrorCode = ErrorCode.NONE,
    transaction_version: int = TRANSACTION_VERSION,
    share_version: int = SHARE_VERSION,
) -> dict[str, Any]:
    """An ApiVersions response body: every API's advertised range, and the feature levels."""
    keys = [
        {
            "api_key": api.key,
            "min_version": api.advertised_range[0],
            "max_version": api.advertised_range[1],
        }
        for api in sorted(apis.values(), key=lambda a: a.key)
    ]
    return {
        "error_code": code,
        "api_keys": keys,
        "throttle_time": 0,
        **features_body(transaction_version, share_version),
    }
