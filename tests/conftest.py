"""Shared fixtures live in ``tests/harness`` (on the path via pytest's ``pythonpath``)."""

pytest_plugins = [
    "harness.etcd",
    "harness.s3",
    "harness.brokers",
    "harness.prometheus",
]
