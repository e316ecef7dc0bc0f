"""Fixtures of the operator tests (defined in ``tests/harness``)."""

from harness.k8s_operator import namespace, running_operator
from harness.kmock_k8s import kube_api

__all__ = ["kube_api", "namespace", "running_operator"]
