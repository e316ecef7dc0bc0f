"""The broker's table of implemented APIs: each served API (``api/served.py``: key, name,
version range) with its handler and error shape.

The ranges live apart from the handlers so that the proxy can answer ApiVersions exactly as a
broker does without importing a handler. Every served API has an entry here and nothing else
has (``tests/unit/test_api_version_tables.py``).
"""

from __future__ import annotations

from kafscale.broker.api import (
    acls,
    admin,
    client_quotas,
    config_resources,
    consumer_groups,
    coordinators,
    delegation_tokens,
    feature_updates,
    fetch,
    group_offsets,
    groups,
    log_dirs,
    metadata,
    offset_delete,
    offsets,
    produce,
    replicas,
    sasl,
    scram_users,
    share_fetch,
    share_groups,
    share_offsets,
    topic_partitions,
    transactions,
    txn_partitions,
    versions,
)
from kafscale.broker.api.dispatch import ApiSpec, ErrorBody, Handler, no_results, top_level_error
from kafscale.broker.api.served import SERVED_APIS


def _spec(key: int, handler: Handler, error_body: ErrorBody = top_level_error) -> ApiSpec:
    return ApiSpec(SERVED_APIS[key], handler, error_body)


_SPECS = [
    _spec(0, produce.handle_produce, produce.produce_error_body),  # Produce
    _spec(1, fetch.handle_fetch, fetch.fetch_error_body),  # Fetch
    _spec(2, offsets.handle_list_offsets, no_results("topics")),  # ListOffsets
    _spec(3, metadata.handle_metadata, lambda _r, _c: {"brokers": [], "topics": []}),  # Metadata
    # OffsetCommit
    _spec(8, group_offsets.handle_offset_commit, group_offsets.offset_commit_error_body),
    # OffsetFetch
    _spec(9, group_offsets.handle_offset_fetch, group_offsets.offset_fetch_error_body),
    # FindCoordinator
    _spec(10, coordinators.handle_find_coordinator, coordinators.find_coordinator_error_body),
    _spec(11, groups.handle_join_group, groups.join_group_error_body),  # JoinGroup
    _spec(12, groups.handle_heartbeat),  # Heartbeat
    _spec(13, groups.handle_leave_group),  # LeaveGroup
    _spec(14, groups.handle_sync_group, groups.sync_group_error_body),  # SyncGroup
    _spec(15, groups.handle_describe_groups, groups.describe_groups_error_body),  # DescribeGroups
    _spec(16, groups.handle_list_groups),  # ListGroups
    _spec(18, versions.handle_api_versions),  # ApiVersions
    _spec(19, admin.handle_create_topics, no_results("topics")),  # CreateTopics
    _spec(20, admin.handle_delete_topics, no_results("responses")),  # DeleteTopics
    _spec(21, offsets.handle_delete_records, no_results("topics")),  # DeleteRecords
    _spec(22, offsets.handle_init_producer_id),  # InitProducerId
    _spec(23, offsets.handle_offset_for_leader_epoch, no_results("topics")),  # OffsetForLeaderEpoch
    # Transactions, with transaction protocol v2 (KIP-890 part 2, ``api/features.py``):
    # EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit v5 add implicitly.
    # AddPartitionsToTxn
    _spec(24, transactions.handle_add_partitions_to_txn, transactions.add_partitions_error_body),
    _spec(25, transactions.handle_add_offsets_to_txn),  # AddOffsetsToTxn
    _spec(26, transactions.handle_end_txn),  # EndTxn
    # TxnOffsetCommit
    _spec(28, transactions.handle_txn_offset_commit, transactions.txn_offset_commit_error_body),
    # DescribeTransactions
    _spec(
        65, transactions.handle_describe_transactions, transactions.describe_transactions_error_body
    ),
    _spec(66, transactions.handle_list_transactions),  # ListTransactions
    _spec(29, acls.handle_describe_acls, acls.describe_acls_error_body),  # DescribeAcls
    _spec(30, acls.handle_create_acls, acls.create_acls_error_body),  # CreateAcls
    _spec(31, acls.handle_delete_acls, acls.delete_acls_error_body),  # DeleteAcls
    _spec(32, admin.handle_describe_configs, no_results("results")),  # DescribeConfigs
    _spec(33, admin.handle_alter_configs, no_results("responses")),  # AlterConfigs
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-2.
    # AlterReplicaLogDirs
    _spec(34, log_dirs.handle_alter_replica_log_dirs, log_dirs.alter_replica_log_dirs_error_body),
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-4.
    # DescribeLogDirs
    _spec(35, log_dirs.handle_describe_log_dirs, log_dirs.describe_log_dirs_error_body),
    _spec(37, admin.handle_create_partitions, no_results("results")),  # CreatePartitions
    # IncrementalAlterConfigs
    _spec(44, admin.handle_incremental_alter_configs, no_results("responses")),
    _spec(42, groups.handle_delete_groups, groups.delete_groups_error_body),  # DeleteGroups
    # Replicas are the lease owner (``api/replicas.py``): elections are never needed while a
    # broker can lead, reassignments complete when accepted.
    _spec(43, replicas.handle_elect_leaders, replicas.elect_leaders_error_body),  # ElectLeaders
    # AlterPartitionReassignments
    _spec(
        45, replicas.handle_alter_partition_reassignments, replicas.alter_reassignments_error_body
    ),
    _spec(46, replicas.handle_list_partition_reassignments),  # ListPartitionReassignments
    # OffsetDelete
    _spec(47, offset_delete.handle_offset_delete, offset_delete.offset_delete_error_body),
    _spec(60, metadata.handle_describe_cluster),  # DescribeCluster
    # Finalized features are fixed (``api/feature_updates.py``): the level they have succeeds.
    # UpdateFeatures
    _spec(57, feature_updates.handle_update_features, feature_updates.update_features_error_body),
    _spec(74, config_resources.handle_list_config_resources),  # ListConfigResources
    # DescribeTopicPartitions
    _spec(75, metadata.handle_describe_topic_partitions, topic_partitions.describe_error_body),
    # Sent by transaction coordinators (brokers) and kafka-transactions.sh abort.
    # WriteTxnMarkers
    _spec(27, txn_partitions.handle_write_txn_markers, txn_partitions.write_txn_markers_error_body),
    _spec(61, txn_partitions.handle_describe_producers, no_results("topics")),  # DescribeProducers
    # ConsumerGroupHeartbeat
    _spec(
        68,
        consumer_groups.handle_consumer_group_heartbeat,
        consumer_groups.consumer_group_heartbeat_error_body,
    ),
    # ConsumerGroupDescribe
    _spec(
        69,
        consumer_groups.handle_consumer_group_describe,
        consumer_groups.consumer_group_describe_error_body,
    ),
    # Share groups (KIP-932, ``docs/share-groups.md``).
    # ShareGroupHeartbeat
    _spec(
        76, share_groups.handle_share_group_heartbeat, share_groups.share_group_heartbeat_error_body
    ),
    # ShareGroupDescribe
    _spec(
        77, share_groups.handle_share_group_describe, share_groups.share_group_describe_error_body
    ),
    _spec(78, share_fetch.handle_share_fetch, share_fetch.share_fetch_error_body),  # ShareFetch
    # ShareAcknowledge
    _spec(79, share_fetch.handle_share_acknowledge, share_fetch.share_acknowledge_error_body),
    # DescribeShareGroupOffsets
    _spec(
        90,
        share_offsets.handle_describe_share_group_offsets,
        share_offsets.describe_share_group_offsets_error_body,
    ),
    # AlterShareGroupOffsets
    _spec(
        91,
        share_offsets.handle_alter_share_group_offsets,
        share_offsets.alter_share_group_offsets_error_body,
    ),
    # DeleteShareGroupOffsets
    _spec(
        92,
        share_offsets.handle_delete_share_group_offsets,
        share_offsets.delete_share_group_offsets_error_body,
    ),
    # SaslHandshake v0 sent the SASL tokens as bare frames; every client in use sends v1. It
    # is advertised from v0 all the same: librdkafka (kcat) decides that the broker supports
    # SASL handshakes at all from a range that includes v0, before it picks v1.
    _spec(17, sasl.handle_sasl_handshake),  # SaslHandshake
    _spec(36, sasl.handle_sasl_authenticate),  # SaslAuthenticate
    # Client quotas (``api/client_quotas.py``), enforced per broker (``quotas/enforcement.py``).
    # DescribeClientQuotas
    _spec(48, client_quotas.handle_describe_client_quotas, client_quotas.describe_error_body),
    # AlterClientQuotas
    _spec(49, client_quotas.handle_alter_client_quotas, client_quotas.alter_error_body),
    # Delegation tokens (KIP-48, ``api/delegation_tokens.py``). v0 is gone from kio (Kafka 4
    # dropped it, KIP-896); v1 has v0's layout.
    _spec(38, delegation_tokens.handle_create_delegation_token),  # CreateDelegationToken
    _spec(39, delegation_tokens.handle_renew_delegation_token),  # RenewDelegationToken
    _spec(40, delegation_tokens.handle_expire_delegation_token),  # ExpireDelegationToken
    _spec(41, delegation_tokens.handle_describe_delegation_token),  # DescribeDelegationToken
    # DescribeUserScramCredentials
    _spec(50, scram_users.handle_describe_user_scram_credentials, scram_users.describe_error_body),
    # AlterUserScramCredentials
    _spec(51, scram_users.handle_alter_user_scram_credentials, scram_users.alter_error_body),
]

API_TABLE: dict[int, ApiSpec] = {spec.key: spec for spec in _SPECS}
