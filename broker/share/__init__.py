"""Share-partitions (KIP-932) on the partition owner: record states, sessions, persistence."""
