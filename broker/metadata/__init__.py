"""etcd access, key layout, leases, broker registry and partition assignment."""
