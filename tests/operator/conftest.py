"""Fixtures of the operator tests (defined in ``tests/harness``)."""

from harness.k8s_operator import namespace, running_operator
from harness.k8s_real import kafscale_chart, kube_namespace, real_operator
from harness.kmock_k8s import kube_api
from harness.kube_apiserver import kube_cluster

__all__ = [
    "kafscale_chart",
    "kube_api",
    "kube_cluster",
    "kube_namespace",
    "namespace",
    "real_operator",
    "running_operator",
]
