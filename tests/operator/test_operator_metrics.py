"""The operator's GET /metrics against a real Kubernetes API server: handler runs counted and
timed per outcome, the cluster's phase, conditions and brokers desired against ready, and a
deleted cluster's series gone. The operator runs in-process as the chart's ServiceAccount."""

from __future__ import annotations

import urllib.request

import pytest
from harness.k8s_operator import operator_thread
from harness.k8s_real import (
    CLUSTERS,
    InstalledChart,
    cluster_manifest,
    create_s3_secret,
    external_spec,
    live_pods,
    mark_ready,
    operator_settings,
    settle,
)
from harness.kube_apiserver import KubeCluster
from harness.ports import free_port_run
from harness.s3 import S3Endpoint
from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.metadata.embedded_etcd import EmbeddedEtcd
from kafscale.operator.naming import label_selector

pytestmark = [pytest.mark.operator, pytest.mark.kubeapi]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def counted(samples: Samples, **labels: str) -> bool:
    """At least one run of the handler counted and timed on this page (the wrapper increments
    the counter and then the histogram: a scrape between the two sees them differ)."""
    runs = value(samples, "kafscale_operator_reconciles_total", **labels)
    timed = value(samples, "kafscale_operator_reconcile_duration_seconds_count", **labels)
    return runs is not None and runs >= 1 and timed == runs


async def test_operator_metrics_count_reconciles_and_report_cluster_state(
    kube_cluster: KubeCluster,
    kafscale_chart: InstalledChart,
    kube_namespace: str,
    etcd_server: EmbeddedEtcd,
    s3_server: S3Endpoint,
) -> None:
    ns, kube = kube_namespace, kube_cluster
    port = free_port_run()
    store = await s3_server.open_store()
    settings = operator_settings(kafscale_chart, metrics_port=port)
    cluster = {"namespace": ns, "kafscale_cluster": "shop"}
    async with operator_thread(settings):
        # The operator watches every namespace: earlier tests' clusters, in namespaces still
        # being deleted, count in the per-phase totals; this test's own series are its proof.
        before = scrape(port)
        assert value(before, "kafscale_operator_clusters", phase="Running") is not None
        assert "process_cpu_seconds_total" in {name for name, _ in before}

        create_s3_secret(kube, ns, s3_server)
        spec = external_spec(etcd_server, s3_server, store.bucket, brokers={"replicas": 2})
        kube.create(CLUSTERS.format(ns=ns), cluster_manifest("shop", ns, spec))

        # Applied, no pod ready yet: desired 2, ready 0, not Ready. A handler sets the gauges
        # while it runs and is counted (counter, then histogram) after it returns: wait for a
        # page that shows both, not just the gauges.
        runs = {"handler": "reconcile_cluster", "outcome": "success"}
        created = await settle(
            lambda: (
                (s := scrape(port))
                and value(s, "kafscale_operator_brokers_desired", **cluster) == 2
                and counted(s, **runs)
                and s
            ),
            what="the cluster's gauges and its reconcile counted",
        )
        assert value(created, "kafscale_operator_brokers_ready", **cluster) == 0
        assert value(created, "kafscale_operator_cluster_ready", **cluster) == 0
        assert value(created, "kafscale_operator_cluster_degraded", **cluster) == 0
        reconciles = value(created, "kafscale_operator_reconciles_total", **runs)
        assert reconciles is not None and reconciles >= 1
        assert value(created, "kafscale_operator_reconcile_duration_seconds_count", **runs) == (
            reconciles
        )
        assert (value(created, "kafscale_operator_reconcile_duration_seconds_sum", **runs) or 0) > 0

        # The pods come up (we play their kubelet): the status timer sees them ready.
        selector = label_selector("shop", "broker")
        pods = await settle(
            lambda: len(live_pods(kube, ns, selector)) == 2 and live_pods(kube, ns, selector),
            what="two broker pods",
        )
        for pod in pods:
            mark_ready(kube, ns, pod)
        status_runs = {"handler": "refresh_cluster_status", "outcome": "success"}
        running = await settle(
            lambda: (
                (s := scrape(port))
                and value(s, "kafscale_operator_brokers_ready", **cluster) == 2
                and counted(s, **status_runs)
                and s
            ),
            what="the cluster's brokers ready in the metrics and a status round counted",
        )
        assert value(running, "kafscale_operator_cluster_ready", **cluster) == 1
        assert (value(running, "kafscale_operator_clusters", phase="Running") or 0) >= 1
        refreshes = value(running, "kafscale_operator_reconciles_total", **status_runs)
        assert refreshes is not None and refreshes >= 1

        # Deleted: its series leave the page, the finalizer's run is counted.
        kube.kubectl("delete", "kafscalecluster", "shop", "-n", ns, "--wait=false")
        # At least once: kopf may run a delete handler again before the finalizer's removal lands.
        deletes = {"handler": "delete_cluster", "outcome": "success"}
        gone = await settle(
            lambda: (
                (s := scrape(port))
                and value(s, "kafscale_operator_brokers_desired", **cluster) is None
                and counted(s, **deletes)
                and s
            ),
            what="the deleted cluster's series gone and its delete counted",
        )
        assert value(gone, "kafscale_operator_cluster_ready", **cluster) is None
    assert (value(gone, "kafscale_operator_reconciles_total", **deletes) or 0) >= 1
    await store.close()
