"""The data plane: wire protocol, storage, metadata and leases, groups, server, proxy, CLI."""
