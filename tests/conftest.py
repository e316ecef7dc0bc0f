"""Shared fixtures live in ``tests/harness`` (on the path via pytest's ``pythonpath``).

Hypothesis runs without its per-example deadline: the suite shares two cores with brokers,
etcd and Spark, and a slow example there is load, not a bug (speeds belong in ``bench/``).
"""

from hypothesis import settings

settings.register_profile("kafscale", deadline=None)
settings.load_profile("kafscale")

pytest_plugins = [
    "harness.etcd",
    "harness.s3",
    "harness.brokers",
    "harness.prometheus",
    "harness.postgres",
    "harness.workers",
    "harness.tls_etcd",
]
