"""The broker's table of implemented APIs: each served API (``api/served.py``: key, name,
version range) with its handler. What each answers on a failure is ``api/error_bodies.py``.

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
    transactions,
    txn_partitions,
    versions,
)
from kafscale.broker.api.dispatch import ApiSpec
from kafscale.broker.api.served import SERVED_APIS

_SPECS = [
    ApiSpec(SERVED_APIS[0], produce.handle_produce),  # Produce
    ApiSpec(SERVED_APIS[1], fetch.handle_fetch),  # Fetch
    ApiSpec(SERVED_APIS[2], offsets.handle_list_offsets),  # ListOffsets
    ApiSpec(SERVED_APIS[3], metadata.handle_metadata),  # Metadata
    ApiSpec(SERVED_APIS[8], group_offsets.handle_offset_commit),  # OffsetCommit
    ApiSpec(SERVED_APIS[9], group_offsets.handle_offset_fetch),  # OffsetFetch
    ApiSpec(SERVED_APIS[10], coordinators.handle_find_coordinator),  # FindCoordinator
    ApiSpec(SERVED_APIS[11], groups.handle_join_group),  # JoinGroup
    ApiSpec(SERVED_APIS[12], groups.handle_heartbeat),  # Heartbeat
    ApiSpec(SERVED_APIS[13], groups.handle_leave_group),  # LeaveGroup
    ApiSpec(SERVED_APIS[14], groups.handle_sync_group),  # SyncGroup
    ApiSpec(SERVED_APIS[15], groups.handle_describe_groups),  # DescribeGroups
    ApiSpec(SERVED_APIS[16], groups.handle_list_groups),  # ListGroups
    ApiSpec(SERVED_APIS[18], versions.handle_api_versions),  # ApiVersions
    ApiSpec(SERVED_APIS[19], admin.handle_create_topics),  # CreateTopics
    ApiSpec(SERVED_APIS[20], admin.handle_delete_topics),  # DeleteTopics
    ApiSpec(SERVED_APIS[21], offsets.handle_delete_records),  # DeleteRecords
    ApiSpec(SERVED_APIS[22], offsets.handle_init_producer_id),  # InitProducerId
    ApiSpec(SERVED_APIS[23], offsets.handle_offset_for_leader_epoch),  # OffsetForLeaderEpoch
    # Transactions, with transaction protocol v2 (KIP-890 part 2, ``api/features.py``):
    # EndTxn v5 bumps the epoch, Produce v12 and TxnOffsetCommit v5 add implicitly.
    ApiSpec(SERVED_APIS[24], transactions.handle_add_partitions_to_txn),  # AddPartitionsToTxn
    ApiSpec(SERVED_APIS[25], transactions.handle_add_offsets_to_txn),  # AddOffsetsToTxn
    ApiSpec(SERVED_APIS[26], transactions.handle_end_txn),  # EndTxn
    ApiSpec(SERVED_APIS[28], transactions.handle_txn_offset_commit),  # TxnOffsetCommit
    ApiSpec(SERVED_APIS[65], transactions.handle_describe_transactions),  # DescribeTransactions
    ApiSpec(SERVED_APIS[66], transactions.handle_list_transactions),  # ListTransactions
    ApiSpec(SERVED_APIS[29], acls.handle_describe_acls),  # DescribeAcls
    ApiSpec(SERVED_APIS[30], acls.handle_create_acls),  # CreateAcls
    ApiSpec(SERVED_APIS[31], acls.handle_delete_acls),  # DeleteAcls
    ApiSpec(SERVED_APIS[32], admin.handle_describe_configs),  # DescribeConfigs
    ApiSpec(SERVED_APIS[33], admin.handle_alter_configs),  # AlterConfigs
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-2.
    ApiSpec(SERVED_APIS[34], log_dirs.handle_alter_replica_log_dirs),  # AlterReplicaLogDirs
    # v0 is gone from kio (Kafka 4 dropped it, KIP-896); Kafka 3.9 offers 0-4.
    ApiSpec(SERVED_APIS[35], log_dirs.handle_describe_log_dirs),  # DescribeLogDirs
    ApiSpec(SERVED_APIS[37], admin.handle_create_partitions),  # CreatePartitions
    ApiSpec(SERVED_APIS[44], admin.handle_incremental_alter_configs),  # IncrementalAlterConfigs
    ApiSpec(SERVED_APIS[42], groups.handle_delete_groups),  # DeleteGroups
    # Replicas are the lease owner (``api/replicas.py``): elections are never needed while a
    # broker can lead, reassignments complete when accepted.
    ApiSpec(SERVED_APIS[43], replicas.handle_elect_leaders),  # ElectLeaders
    ApiSpec(
        SERVED_APIS[45], replicas.handle_alter_partition_reassignments
    ),  # AlterPartitionReassignments
    ApiSpec(
        SERVED_APIS[46], replicas.handle_list_partition_reassignments
    ),  # ListPartitionReassignments
    ApiSpec(SERVED_APIS[47], offset_delete.handle_offset_delete),  # OffsetDelete
    ApiSpec(SERVED_APIS[60], metadata.handle_describe_cluster),  # DescribeCluster
    # Finalized features are fixed (``api/feature_updates.py``): the level they have succeeds.
    ApiSpec(SERVED_APIS[57], feature_updates.handle_update_features),  # UpdateFeatures
    ApiSpec(SERVED_APIS[74], config_resources.handle_list_config_resources),  # ListConfigResources
    ApiSpec(SERVED_APIS[75], metadata.handle_describe_topic_partitions),  # DescribeTopicPartitions
    # Sent by transaction coordinators (brokers) and kafka-transactions.sh abort.
    ApiSpec(SERVED_APIS[27], txn_partitions.handle_write_txn_markers),  # WriteTxnMarkers
    ApiSpec(SERVED_APIS[61], txn_partitions.handle_describe_producers),  # DescribeProducers
    ApiSpec(
        SERVED_APIS[68], consumer_groups.handle_consumer_group_heartbeat
    ),  # ConsumerGroupHeartbeat
    ApiSpec(
        SERVED_APIS[69], consumer_groups.handle_consumer_group_describe
    ),  # ConsumerGroupDescribe
    # Share groups (KIP-932, ``docs/share-groups.md``).
    ApiSpec(SERVED_APIS[76], share_groups.handle_share_group_heartbeat),  # ShareGroupHeartbeat
    ApiSpec(SERVED_APIS[77], share_groups.handle_share_group_describe),  # ShareGroupDescribe
    ApiSpec(SERVED_APIS[78], share_fetch.handle_share_fetch),  # ShareFetch
    ApiSpec(SERVED_APIS[79], share_fetch.handle_share_acknowledge),  # ShareAcknowledge
    ApiSpec(
        SERVED_APIS[90], share_offsets.handle_describe_share_group_offsets
    ),  # DescribeShareGroupOffsets
    ApiSpec(
        SERVED_APIS[91], share_offsets.handle_alter_share_group_offsets
    ),  # AlterShareGroupOffsets
    ApiSpec(
        SERVED_APIS[92], share_offsets.handle_delete_share_group_offsets
    ),  # DeleteShareGroupOffsets
    # SaslHandshake v0 sent the SASL tokens as bare frames; every client in use sends v1. It
    # is advertised from v0 all the same: librdkafka (kcat) decides that the broker supports
    # SASL handshakes at all from a range that includes v0, before it picks v1.
    ApiSpec(SERVED_APIS[17], sasl.handle_sasl_handshake),  # SaslHandshake
    ApiSpec(SERVED_APIS[36], sasl.handle_sasl_authenticate),  # SaslAuthenticate
    # Client quotas (``api/client_quotas.py``), enforced per broker (``quotas/enforcement.py``).
    ApiSpec(SERVED_APIS[48], client_quotas.handle_describe_client_quotas),  # DescribeClientQuotas
    ApiSpec(SERVED_APIS[49], client_quotas.handle_alter_client_quotas),  # AlterClientQuotas
    # Delegation tokens (KIP-48, ``api/delegation_tokens.py``). v0 is gone from kio (Kafka 4
    # dropped it, KIP-896); v1 has v0's layout.
    ApiSpec(
        SERVED_APIS[38], delegation_tokens.handle_create_delegation_token
    ),  # CreateDelegationToken
    ApiSpec(
        SERVED_APIS[39], delegation_tokens.handle_renew_delegation_token
    ),  # RenewDelegationToken
    ApiSpec(
        SERVED_APIS[40], delegation_tokens.handle_expire_delegation_token
    ),  # ExpireDelegationToken
    ApiSpec(
        SERVED_APIS[41], delegation_tokens.handle_describe_delegation_token
    ),  # DescribeDelegationToken
    ApiSpec(
        SERVED_APIS[50], scram_users.handle_describe_user_scram_credentials
    ),  # DescribeUserScramCredentials
    ApiSpec(
        SERVED_APIS[51], scram_users.handle_alter_user_scram_credentials
    ),  # AlterUserScramCredentials
]

API_TABLE: dict[int, ApiSpec] = {spec.key: spec for spec in _SPECS}
