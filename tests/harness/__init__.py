"""Test harness: fixtures that start real etcd, S3 servers and broker processes on loopback."""
