"""The chart's monitoring objects: rendered only when asked for and their CRDs exist, rules that
Prometheus's own ``promtool`` accepts, and a dashboard and rules whose PromQL names only
metrics that a running broker, proxy and operator expose."""

from __future__ import annotations

import json
import re
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from harness import children
from harness.brokers import BrokerCluster
from harness.k8s_tools import run_helm
from harness.proxy import start_proxy
from prometheus_client.parser import text_string_to_metric_families

from kafscale.operator import naming
from kafscale.operator.main import start_metrics_server
from kafscale.operator.metrics import OperatorMetrics

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "charts" / "kafscale"
CRDS = (
    "--api-versions=monitoring.coreos.com/v1/PodMonitor",
    "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
)
ALL_ON = (
    "monitoring.podMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.grafanaDashboard.enabled=true",
)


def render(values: tuple[str, ...] = (), flags: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    sets = [arg for value in values for arg in ("--set", value)]
    result = run_helm("template", "kafscale", str(CHART), "--namespace", "ops", *sets, *flags)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kinds(docs: list[dict[str, Any]]) -> set[str]:
    return {doc["kind"] for doc in docs}


def test_monitoring_objects_only_when_enabled_and_their_crds_exist() -> None:
    assert {"PodMonitor", "PrometheusRule"} & kinds(render()) == set()
    assert "ConfigMap" not in kinds(render())
    assert {"PodMonitor", "PrometheusRule"} & kinds(render(ALL_ON)) == set()  # no CRDs
    assert {"PodMonitor", "PrometheusRule", "ConfigMap"} <= kinds(render(ALL_ON, CRDS))
    lint = run_helm("lint", "--strict", str(CHART), *[f"--set={v}" for v in ALL_ON])
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_pod_monitor_selects_brokers_proxies_and_the_operator() -> None:
    docs = render((*ALL_ON, "watchNamespaces={team-a}"), CRDS)
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "ops"]}
    selector = spec["selector"]
    operator_pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]
    pods = {
        "broker": naming.labels("prod", naming.BROKER),
        "proxy": naming.labels("prod", naming.PROXY),
        "operator": operator_pod["metadata"]["labels"],
        "etcd": naming.labels("prod", naming.ETCD),
    }
    selected = {
        name
        for name, labels in pods.items()
        if all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        and all(labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"])
    }
    assert selected == {"broker", "proxy", "operator"}
    ports = {e["port"] for e in spec["podMetricsEndpoints"]}
    operator_ports = {p["name"] for p in operator_pod["spec"]["containers"][0]["ports"]}
    assert ports == {"admin", "metrics"} and "metrics" in operator_ports
    assert all(e["path"] == "/metrics" for e in spec["podMetricsEndpoints"])
    # The operator's cluster gauges carry their cluster's namespace: it must win.
    honored = {e["port"] for e in spec["podMetricsEndpoints"] if e.get("honorLabels")}
    assert honored == {"metrics"}


def test_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("Debian's prometheus (promtool) is not installed (make system-deps)")
    rule = next(d for d in render(ALL_ON, CRDS) if d["kind"] == "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = children.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {r.get("alert") for r in rule["spec"]["groups"][0]["rules"]}
    assert {
        "KafScalePartitionsWithoutOwner",
        "KafScaleEtcdErrors",
        "KafScaleObjectStoreErrors",
        "KafScaleFlushSlow",
        "KafScaleConsumerLagGrowing",
        "KafScaleClusterDegraded",
        "KafScaleBrokersNotReady",
        "KafScaleOperatorErrors",
    } <= alerts


def test_repeated_session_suspensions_alert_and_one_does_not(tmp_path: Path) -> None:
    """``KafScaleSessionSuspensions``: a broker whose etcd session was suspended three times in
    15 min (it refused its partitions' produces each time) pages a warning; a single suspension,
    which resolves itself, does not. promtool's rule tests: fixed series, no waiting."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("Debian's prometheus (promtool) is not installed (make system-deps)")
    rule = next(d for d in render(ALL_ON, CRDS) if d["kind"] == "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))

    def series(pod: str) -> str:
        labels = f'namespace="prod", kafscale_cluster="c", pod="{pod}"'
        return "kafscale_session_lease_suspensions_total{" + labels + "}"

    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series("broker-a"), "values": "0 1 1 2 3 3 3 3"},
                    {"series": series("broker-b"), "values": "0 1 1 1 1 1 1 1"},
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "KafScaleSessionSuspensions",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "prod",
                                    "kafscale_cluster": "c",
                                    "pod": "broker-a",
                                },
                                "exp_annotations": {
                                    "summary": "broker broker-a's etcd session keeps being "
                                    "suspended",
                                    "description": "3 suspensions in 15 min: keepalives went "
                                    "unanswered for a TTL each time, and the broker refused its "
                                    "partitions' produces until etcd answered. Check etcd's "
                                    "leader changes and latency, and the broker's CPU throttling.",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = children.run(
        [promtool, "test", "rules", "tests.yaml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_configmap_carries_the_sidecar_label() -> None:
    docs = render(ALL_ON, CRDS)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["kafscale.json"])
    assert dashboard["uid"] == "kafscale-overview" and dashboard["panels"]


# --- PromQL names only metrics that exist ----------------------------------------------------

_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NUMBERS = re.compile(r"\b\d+(\.\d+)?([eE][+-]?\d+)?(ms|[smhdwy])?\b")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords and labels removed)."""
    text = _GROUPING.sub(" ", _RANGES.sub(" ", _MATCHERS.sub(" ", _STRINGS.sub(" ", expr))))
    text = _NUMBERS.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue
        names.add(match.group())
    return names


_SERIES_SUFFIXES = ("_bucket", "_count", "_sum", "_created")
SCRAPE_SERIES = {"up"}
"""Series Prometheus writes itself for every target (1 scraped, 0 failed; gone with the target)."""


def grafana_query(query: str) -> str:
    """The PromQL inside a Grafana variable query (``label_values(<expr>, <label>)``)."""
    match = re.fullmatch(r"label_values\((.*),\s*\w+\)", query.strip())
    return match.group(1) if match else query


def exposed(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    names: set[str] = set()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def test_dashboard_and_rules_name_only_exposed_metrics(broker_cluster: BrokerCluster) -> None:
    broker = broker_cluster.start()
    proxy = start_proxy(broker_cluster)
    producer = Producer({"bootstrap.servers": proxy.bootstrap})
    producer.produce("watched", value=b"v")
    assert producer.flush(30) == 0
    operator = start_metrics_server(0, OperatorMetrics(), "127.0.0.1")
    try:
        names = (
            exposed(f"{broker.admin_url}/metrics")
            | exposed(f"{proxy.admin_url}/metrics")
            | exposed(f"http://127.0.0.1:{operator.server_port}/metrics")
        )
    finally:
        operator.shutdown()
        operator.server_close()
    docs = render(ALL_ON, CRDS)
    rules = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]["groups"][0]["rules"]
    dashboard = json.loads(
        next(d for d in docs if d["kind"] == "ConfigMap")["data"]["kafscale.json"]
    )
    expressions = [r["expr"] for r in rules]
    expressions += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    expressions += [
        grafana_query(v["query"]["query"])
        for v in dashboard["templating"]["list"]
        if isinstance(v.get("query"), dict)
    ]
    documented = (CHART.parents[1] / "docs" / "monitoring.md").read_text()
    expressions += useful_queries(documented)  # a recording rule may exist for them alone
    used = set().union(*(metric_names(e) for e in expressions))
    recorded = {r["record"] for r in rules if "record" in r}
    assert len(used) > 20 and recorded <= used
    assert used - names - recorded - SCRAPE_SERIES == set()
    ours = {n for n in names if n.startswith("kafscale_") and not n.endswith(_SERIES_SUFFIXES)}
    assert {n for n in ours if n not in documented} == set()


def useful_queries(documented: str) -> list[str]:
    """The PromQL of docs/monitoring.md's "Useful queries" (one a line, comments left out)."""
    block = documented.split("### Useful queries", 1)[1].split("```promql", 1)[1]
    lines = block.split("```", 1)[0].splitlines()
    queries = [line for line in lines if line.strip() and not line.startswith("#")]
    assert len(queries) > 5, queries
    return queries


def test_metric_names_parser() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (api, le) (rate(kafscale_x_bucket{a="b"}[5m]))) > 1 '
        "and on (pod) kafscale_y offset 5m"
    )
    assert metric_names(expr) == {"kafscale_x_bucket", "kafscale_y"}
    assert metric_names(grafana_query('label_values(kafscale_z{n=~"$n"}, pod)')) == {"kafscale_z"}


def test_monitoring_page_lists_every_alert_with_its_severity() -> None:
    """docs/monitoring.md's alert table names each alert of the chart's PrometheusRule with
    its severity, and no other: a person paged by one looks it up there."""
    docs = render(ALL_ON, CRDS)
    rules = next(d for d in docs if d["kind"] == "PrometheusRule")["spec"]["groups"][0]["rules"]
    alerts = {r["alert"]: r["labels"]["severity"] for r in rules if "alert" in r}
    documented = (CHART.parents[1] / "docs" / "monitoring.md").read_text()
    listed = dict(re.findall(r"^\s*\| `(KafScale\w+)` \((\w+)\) \|", documented, re.MULTILINE))
    assert len(alerts) > 5
    assert listed == alerts
