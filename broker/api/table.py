"""The one table of implemented APIs: key, version range, handler, error shape.

Ranges are those a Kafka 3.9 broker offers. kio follows Kafka 4, which dropped the oldest
versions (KIP-896); the layouts of those are in ``protocol/legacy_schemas.py``, and Produce v0-v2
and Fetch v0-v3 carry message format v0/v1, converted to and from the stored v2 batches by
``protocol/legacy_messages.py``. ApiVersions advertises exactly this table; anything else is
answered with UNSUPPORTED_VERSION, or, where no response layout exists for the version, by
closing the connection.
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
from kafscale.broker.api.dispatch import ApiSpec, no_results

_SPECS = [
    ApiSpec(0, "Produce", 0, 12, produce.handle_produce, produce.produce_error_body),
    ApiSpec(1, "Fetch", 0, 16, fetch.handle_fetch, fetch.fetch_error_body),
    ApiSpec(2, "ListOffsets", 0, 8, offsets.handle_list_offsets, no_results("topics")),
    ApiSpec(
        3, "Metadata", 0, 12, metadata.handle_metadata, lambda _r, _c: {"brokers": [], "topics": []}
    ),
    ApiSpec(
        8,
        "OffsetCommit",
        0,
        9,
        group_offsets.handle_offset_commit,
        group_offsets.offset_commit_error_body,
    ),
    ApiSpec(
        9,
        "OffsetFetch",
        0,
        9,
        group_offsets.handle_offset_fetch,
        group_offsets.offset_fetch_error_body,
    ),
    ApiSpec(
        10,
        "FindCoordinator",
        0,
        4,
        coordinators.handle_find_coordinator,
        coordinators.find_coordinator_error_body,
    ),
    ApiSpec(11, "JoinGroup", 0, 9, groups.handle_join_group, groups.join_group_error_body),
    ApiSpec(12, "Heartbeat", 0, 4, groups.handle_heartbeat),
    ApiSpec(13, "LeaveGroup", 0, 5, groups.handle_leave_group),
    ApiSpec(14, "SyncGroup", 0, 5, groups.handle_sync_group, groups.sync_group_error_body),
    ApiSpec(
        15,
        "DescribeGroups",
        0,
        5,
        groups.handle_describe_groups,
        groups.describe_groups_error_body,
    ),
    ApiSpec(16, "ListGroups", 0, 5, groups.handle_list_groups),
    ApiSpec(18, "ApiVersions", 0, 3, versions.handle_api_versions),
    ApiSpec(
        19,
        "CreateTopics",
        2,
        7,
        admin.handle_create_topics,
        no_results("topics"),
    ),
    ApiSpec(
        20,
        "DeleteTopics",
        1,
        6,
        admin.handle_delete_topics,
        no_results("responses"),
    ),
    ApiSpec(
        21,
        "DeleteRecords",
        0,
        2,
        offsets.handle_delete_records,
        no_results("topics"),
    ),
    ApiSpec(22, "InitProducerId", 0, 5, offsets.handle_init_producer_id),
    ApiSpec(
        23,
        "OffsetForLeaderEpoch",
        2,
        4,
        offsets.handle_offset_for_leader_epoch,
        no_results("topics"),
    ),
    # Transactions, with transaction protocol v2 (KIP-890 part 2, ``api/features.py``):
    # EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit v5 add implicitly.
    ApiSpec(
        24,
        "AddPartitionsToTxn",
        0,
        5,
        transactions.handle_add_partitions_to_txn,
        transactions.add_partitions_error_body,
    ),
    ApiSpec(25, "AddOffsetsToTxn", 0, 4, transactions.handle_add_offsets_to_txn),
    ApiSpec(26, "EndTxn", 0, 5, transactions.handle_end_txn),
    ApiSpec(
        28,
        "TxnOffsetCommit",
        0,
        5,
        transactions.handle_txn_offset_commit,
        transactions.txn_offset_commit_error_body,
    ),
    ApiSpec(
        65,
        "DescribeTransactions",
        0,
        0,
        transactions.handle_describe_transactions,
        transactions.describe_transactions_error_body,
    ),
    ApiSpec(66, "ListTransactions", 0, 1, transactions.handle_list_transactions),
    ApiSpec(29, "DescribeAcls", 1, 3, acls.handle_describe_acls, acls.describe_acls_error_body),
    ApiSpec(30, "CreateAcls", 1, 3, acls.handle_create_acls, acls.create_acls_error_body),
    ApiSpec(31, "DeleteAcls", 1, 3, acls.handle_delete_acls, acls.delete_acls_error_body),
    ApiSpec(
        32,
        "DescribeConfigs",
        1,
        4,
        admin.handle_describe_configs,
        no_results("results"),
    ),
    ApiSpec(
        33,
        "AlterConfigs",
        0,
        2,
        admin.handle_alter_configs,
        no_results("responses"),
    ),
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-2.
    ApiSpec(
        34,
        "AlterReplicaLogDirs",
        1,
        2,
        log_dirs.handle_alter_replica_log_dirs,
        log_dirs.alter_replica_log_dirs_error_body,
    ),
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-4.
    ApiSpec(
        35,
        "DescribeLogDirs",
        1,
        4,
        log_dirs.handle_describe_log_dirs,
        log_dirs.describe_log_dirs_error_body,
    ),
    ApiSpec(
        37,
        "CreatePartitions",
        0,
        3,
        admin.handle_create_partitions,
        no_results("results"),
    ),
    ApiSpec(
        44,
        "IncrementalAlterConfigs",
        0,
        1,
        admin.handle_incremental_alter_configs,
        no_results("responses"),
    ),
    ApiSpec(42, "DeleteGroups", 0, 2, groups.handle_delete_groups, groups.delete_groups_error_body),
    # Replicas are the lease owner (``api/replicas.py``): elections are never needed while a
    # broker can lead, reassignments complete when accepted.
    ApiSpec(
        43,
        "ElectLeaders",
        0,
        2,
        replicas.handle_elect_leaders,
        replicas.elect_leaders_error_body,
    ),
    ApiSpec(
        45,
        "AlterPartitionReassignments",
        0,
        1,
        replicas.handle_alter_partition_reassignments,
        replicas.alter_reassignments_error_body,
    ),
    ApiSpec(46, "ListPartitionReassignments", 0, 0, replicas.handle_list_partition_reassignments),
    ApiSpec(
        47,
        "OffsetDelete",
        0,
        0,
        offset_delete.handle_offset_delete,
        offset_delete.offset_delete_error_body,
    ),
    ApiSpec(60, "DescribeCluster", 0, 1, metadata.handle_describe_cluster),
    # Finalized features are fixed (``api/feature_updates.py``): the level they have succeeds.
    ApiSpec(
        57,
        "UpdateFeatures",
        0,
        2,
        feature_updates.handle_update_features,
        feature_updates.update_features_error_body,
    ),
    ApiSpec(74, "ListConfigResources", 0, 1, config_resources.handle_list_config_resources),
    ApiSpec(
        75,
        "DescribeTopicPartitions",
        0,
        0,
        metadata.handle_describe_topic_partitions,
        topic_partitions.describe_error_body,
    ),
    # Sent by transaction coordinators (brokers) and kafka-transactions.sh abort.
    ApiSpec(
        27,
        "WriteTxnMarkers",
        0,
        1,
        txn_partitions.handle_write_txn_markers,
        txn_partitions.write_txn_markers_error_body,
    ),
    ApiSpec(
        61,
        "DescribeProducers",
        0,
        0,
        txn_partitions.handle_describe_producers,
        no_results("topics"),
    ),
    ApiSpec(
        68,
        "ConsumerGroupHeartbeat",
        0,
        1,
        consumer_groups.handle_consumer_group_heartbeat,
        consumer_groups.consumer_group_heartbeat_error_body,
    ),
    ApiSpec(
        69,
        "ConsumerGroupDescribe",
        0,
        1,
        consumer_groups.handle_consumer_group_describe,
        consumer_groups.consumer_group_describe_error_body,
    ),
    # Share groups (KIP-932, ``docs/share-groups.md``).
    ApiSpec(
        76,
        "ShareGroupHeartbeat",
        1,
        1,
        share_groups.handle_share_group_heartbeat,
        share_groups.share_group_heartbeat_error_body,
    ),
    ApiSpec(
        77,
        "ShareGroupDescribe",
        1,
        1,
        share_groups.handle_share_group_describe,
        share_groups.share_group_describe_error_body,
    ),
    ApiSpec(
        78, "ShareFetch", 1, 2, share_fetch.handle_share_fetch, share_fetch.share_fetch_error_body
    ),
    ApiSpec(
        79,
        "ShareAcknowledge",
        1,
        2,
        share_fetch.handle_share_acknowledge,
        share_fetch.share_acknowledge_error_body,
    ),
    ApiSpec(
        90,
        "DescribeShareGroupOffsets",
        0,
        1,
        share_offsets.handle_describe_share_group_offsets,
        share_offsets.describe_share_group_offsets_error_body,
    ),
    ApiSpec(
        91,
        "AlterShareGroupOffsets",
        0,
        0,
        share_offsets.handle_alter_share_group_offsets,
        share_offsets.alter_share_group_offsets_error_body,
    ),
    ApiSpec(
        92,
        "DeleteShareGroupOffsets",
        0,
        0,
        share_offsets.handle_delete_share_group_offsets,
        share_offsets.delete_share_group_offsets_error_body,
    ),
    # SaslHandshake v0 sent the SASL tokens as bare frames; every client in use sends v1. It
    # is advertised from v0 all the same: librdkafka (kcat) decides that the broker supports
    # SASL handshakes at all from a range that includes v0, before it picks v1.
    ApiSpec(17, "SaslHandshake", 1, 1, sasl.handle_sasl_handshake, advertised_min_version=0),
    ApiSpec(36, "SaslAuthenticate", 0, 2, sasl.handle_sasl_authenticate),
    # Client quotas (``api/client_quotas.py``), enforced per broker (``quotas/enforcement.py``).
    ApiSpec(
        48,
        "DescribeClientQuotas",
        0,
        1,
        client_quotas.handle_describe_client_quotas,
        client_quotas.describe_error_body,
    ),
    ApiSpec(
        49,
        "AlterClientQuotas",
        0,
        1,
        client_quotas.handle_alter_client_quotas,
        client_quotas.alter_error_body,
    ),
    # Delegation tokens (KIP-48, ``api/delegation_tokens.py``). v0 is gone from kio (Kafka 4
    # dropped it, KIP-896); v1 has v0's layout.
    ApiSpec(38, "CreateDelegationToken", 1, 3, delegation_tokens.handle_create_delegation_token),
    ApiSpec(39, "RenewDelegationToken", 1, 2, delegation_tokens.handle_renew_delegation_token),
    ApiSpec(40, "ExpireDelegationToken", 1, 2, delegation_tokens.handle_expire_delegation_token),
    ApiSpec(
        41, "DescribeDelegationToken", 1, 3, delegation_tokens.handle_describe_delegation_token
    ),
    ApiSpec(
        50,
        "DescribeUserScramCredentials",
        0,
        0,
        scram_users.handle_describe_user_scram_credentials,
        scram_users.describe_error_body,
    ),
    ApiSpec(
        51,
        "AlterUserScramCredentials",
        0,
        0,
        scram_users.handle_alter_user_scram_credentials,
        scram_users.alter_error_body,
    ),
]

API_TABLE: dict[int, ApiSpec] = {spec.key: spec for spec in _SPECS}
