"""Fixtures of the operator tests (defined in ``tests/harness``)."""

from harness.k8s_real import kafscale_chart, kube_namespace, real_operator
from harness.kube_apiserver import kube_cluster

__all__ = ["kafscale_chart", "kube_cluster", "kube_namespace", "real_operator"]
