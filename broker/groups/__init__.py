"""Group coordination: classic (JoinGroup/SyncGroup), KIP-848 consumer and KIP-932 share
groups, their committed offsets in etcd and the leases that say which broker coordinates each
(``runtime`` maps the parts; ``docs/architecture.md#consumer-groups``)."""
