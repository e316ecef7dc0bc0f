"""The chart's alerts and the documented rebalance queries survive restarts and coordinator
moves (docs/monitoring.md, "Alerts across hand-offs" and "Alerts across restarts and failed
scrapes"), and still end on a real recovery, a deleted pod or a deleted cluster.

Real HTTP /metrics endpoints stand in for three brokers and three operator pods: operator 1
and its replacement operator 2 (a restart brings up a new pod: another ``pod`` label), and
operator x, another operator (of other namespaces) that stays up. One real Prometheus scrapes
them every second and evaluates the chart's rules (rendered by helm, ``scrapeGapLookback``
short); the run goes through, in order:

1. both brokers a and b report 2 partitions without owner, and failing etcd calls; b and c a
   lost session lease; operator 1 a Degraded cluster short of one ready broker (and a healthy
   one), operator x another such cluster; broker a coordinates two groups, one rebalancing
   every second, one not at all;
2. a gap: brokers a's and b's scrapes fail (their pods restarting); meanwhile broker c's pod
   is deleted (Prometheus stops scraping it) and operator x deletes its cluster;
3. brokers a and b are back as new processes (counters from 0), b coordinating the groups now
   (their generations go on from etcd); operator 1's scrapes fail from here on (its pod is
   replaced), and operator 2 reports the same clusters a few seconds later;
4. a real recovery: no partition without owner, b's session alive, the cluster ready and not
   Degraded, reported while operator 1's last samples are still within the lookback.

Each changed alert's expression, evaluated at every second through the HTTP API (as the rule
manager evaluates it), must hold at every step through the gaps (else its ``for:`` starts
over), end once the deleted pod or cluster is gone (not a lookback later), and hold at no step
once the recovery is scraped; the etcd-errors alert, unchanged, must hold throughout. The
rebalance queries of docs/monitoring.md must count the moving group's rebalances across both
coordinators, and none for the steady group, which moved too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from harness.prometheus import Prometheus, chart_rule_groups, serve_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LOOKBACK_S = 20  # scrapeGapLookback
GAP_S = 4  # seconds every failing target is down, once Prometheus saw it
OPERATOR_GAP_S = 3  # further seconds before operator 2 reports (its first status round)
SETTLE_S = 3  # scrapes (1 s) and evaluations a recovery may take to show
# Each changed alert: the series (cluster/pod) that must hold through the gaps until the
# recovery, and the one that must end when its pod or cluster is deleted.
EXPECTED: dict[str, tuple[str, str | None]] = {
    "KafScalePartitionsWithoutOwner": ("prod/", None),
    "KafScaleSessionLeaseLost": ("prod/broker-b", "prod/broker-c"),
    "KafScaleClusterDegraded": ("prod/", "gone/"),
    "KafScaleBrokersNotReady": ("prod/", "gone/"),
}
CHANGED_ALERTS = tuple(EXPECTED)
# An unchanged alert whose rate() window already bridges a scrape gap: it must stay so.
BRIDGED_ALERTS = ("KafScaleEtcdErrors",)


@dataclass
class Targets:
    """What each endpoint reports now; generations and error counts follow the wall clock."""

    started_s: float = field(default_factory=time.time)
    down: set[str] = field(default_factory=set)
    coordinator: str = "broker-a"
    operator: str = "operator-1"
    recovered: bool = False
    deleted: bool = False
    """Operator x deleted its cluster."""
    restarted_s: float | None = None
    """When the brokers came back: their counters start again from 0 (new processes)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, **changes: Any) -> None:
        with self.lock:
            for name, value in changes.items():
                setattr(self, name, value)

    def page(self, target: str) -> bytes | None:
        """The /metrics text of ``target``, or None while its scrapes fail."""
        with self.lock:
            if target in self.down:
                return None
            broker = target.startswith("broker")
            lines = self._broker(target) if broker else self._operator(target)
        return ("\n".join(lines) + "\n").encode()

    def _broker(self, target: str) -> list[str]:
        alive = 1 if target == "broker-a" or (target == "broker-b" and self.recovered) else 0
        lines = [
            "# TYPE kafscale_partitions_without_owner gauge",
            f"kafscale_partitions_without_owner {0 if self.recovered else 2}",
            "# TYPE kafscale_session_lease_alive gauge",
            f"kafscale_session_lease_alive {alive}",
            "# TYPE kafscale_consumer_group_generation gauge",
        ]
        if target == self.coordinator:
            moving = self.generation(time.time())
            lines.append(f'kafscale_consumer_group_generation{{group="moving"}} {moving}')
            lines.append('kafscale_consumer_group_generation{group="steady"} 7')
        if target != "broker-c":
            lines.append("# TYPE kafscale_etcd_errors_total counter")
            lines.append(f'kafscale_etcd_errors_total{{operation="txn"}} {self._errors()}')
        return lines

    def generation(self, at_s: float) -> int:
        """The moving group's generation: one rebalance a second, stored in etcd, so whichever
        broker coordinates it reports the same value."""
        return int(at_s - self.started_s) + 1

    def _errors(self) -> int:
        """A failing etcd call every third of a second since the broker process started."""
        return int((time.time() - (self.restarted_s or self.started_s)) * 3)

    def _operator(self, target: str) -> list[str]:
        if target == "operator-x":
            return [] if self.deleted else cluster_gauges("gone", degraded=1, ready=1)
        if target != self.operator:
            return []  # not started yet, or the pod that went away
        degraded, ready = (0, 3) if self.recovered else (1, 2)
        prod = cluster_gauges("prod", degraded=degraded, ready=ready)
        return prod + cluster_gauges("fine", degraded=0, ready=3)


def cluster_gauges(cluster: str, degraded: int, ready: int) -> list[str]:
    """The operator's gauges of one KafScaleCluster (in namespace ops) that wants 3 brokers."""
    labels = f'namespace="ops",kafscale_cluster="{cluster}"'
    return [
        f"kafscale_operator_cluster_degraded{{{labels}}} {degraded}",
        f"kafscale_operator_brokers_desired{{{labels}}} 3",
        f"kafscale_operator_brokers_ready{{{labels}}} {ready}",
    ]


NAMES = ("broker-a", "broker-b", "broker-c", "operator-1", "operator-2", "operator-x")


@pytest.fixture
def endpoints() -> Iterator[tuple[Targets, dict[str, ThreadingHTTPServer]]]:
    targets = Targets()
    servers = {name: serve_metrics(lambda n=name: targets.page(n)) for name in NAMES}
    try:
        yield targets, servers
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def chart_rules() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The chart's rule groups (lookback shortened for the test) and each alert's expression."""
    groups = chart_rule_groups(f"monitoring.prometheusRule.scrapeGapLookback={LOOKBACK_S}s")
    alerts = {r["alert"]: str(r["expr"]) for g in groups for r in g["rules"] if "alert" in r}
    return groups, alerts


def documented_rebalance_queries(window_s: int) -> list[str]:
    """docs/monitoring.md's queries for rebalances per group, over ``window_s`` not 1 h."""
    text = (ROOT / "docs" / "monitoring.md").read_text()
    block = text.split("# rebalances per group", 1)[1].split("\n# clusters", 1)[0]
    queries = [line for line in block.splitlines()[1:] if line and not line.startswith("#")]
    assert queries, block
    return [
        q.replace("[1h]", f"[{window_s}s]").replace("[1h:1m]", f"[{window_s}s:1s]") for q in queries
    ]


def steps(prometheus: Prometheus, expr: str, start_s: float, end_s: float) -> dict[str, int]:
    """At how many one-second steps from ``start_s`` to ``end_s`` ``expr`` holds, per series
    (named by its cluster and pod labels)."""
    held: dict[str, int] = {}
    for series in prometheus.query_range(expr, start_s, end_s, 1):
        name = "/".join(series["metric"].get(k, "") for k in ("kafscale_cluster", "pod"))
        held[name] = len(series["values"])
    return held


def test_alerts_hold_across_scrape_gaps_and_restarts_and_end_on_recovery(
    endpoints: tuple[Targets, dict[str, ThreadingHTTPServer]],
    prometheus_server: Callable[..., Prometheus],
) -> None:
    targets, servers = endpoints
    groups, alerts = chart_rules()
    addresses = {name: f"127.0.0.1:{server.server_port}" for name, server in servers.items()}
    broker = {"namespace": "ops", "kafscale_cluster": "prod"}  # the PodMonitor's labels
    prometheus = prometheus_server(
        list(addresses.values()),
        # The operator's gauges name their cluster themselves (honorLabels in the chart).
        per_target={
            address: {"pod": name, **(broker if name.startswith("broker") else {})}
            for name, address in addresses.items()
        },
        rule_groups=groups,
    )
    # 1. Every target answers, operator 2 with an empty page (not started yet).
    prometheus.wait_scraping()
    prometheus.wait_value('count(kafscale_consumer_group_generation{group="moving"})', one)
    prometheus.wait_value('count(kafscale_operator_cluster_degraded{pod="operator-x"})', one)
    coordinated_s = time.time()
    time.sleep(SETTLE_S)
    first_s = time.time()

    # 2. Brokers a and b stop answering; the groups move to broker b meanwhile. Broker c's
    # pod is deleted, and operator x deletes its cluster.
    changed_s = time.time()
    targets.set(down={"broker-a", "broker-b"}, coordinator="broker-b", deleted=True)
    prometheus.drop_target(addresses["broker-c"])
    prometheus.wait_value('sum(up{pod=~"broker-[ab]"})', lambda v: v == 0)
    prometheus.wait_value('absent(up{pod="broker-c"})', one)
    prometheus.wait_value('absent(kafscale_operator_cluster_degraded{pod="operator-x"})', one)
    removed_s = time.time()
    time.sleep(GAP_S)
    # 3. The brokers are back (b coordinates now), operator 1 goes; operator 2 reports later.
    targets.set(down={"operator-1"}, restarted_s=time.time())
    operator_gone_s = time.time()
    prometheus.wait_value('sum(up{pod=~"broker-[ab]"})', lambda v: v == 2)
    time.sleep(OPERATOR_GAP_S)
    targets.set(operator="operator-2")
    prometheus.wait_value('count(kafscale_operator_cluster_degraded{pod="operator-2"})', two)
    time.sleep(SETTLE_S)
    # 4. A real recovery, within the lookback of operator 1's last samples.
    recovered_s = time.time()
    targets.set(recovered=True)
    for healed in (
        'max(kafscale_operator_cluster_degraded{pod="operator-2"}) == 0',
        'min(kafscale_operator_brokers_ready{pod="operator-2"}) == 3',
        "max(kafscale_partitions_without_owner) == 0",
        "min(kafscale_session_lease_alive) == 1",
    ):
        prometheus.wait_value(f"count({healed})", one)
    seen_s = time.time()
    time.sleep(2 * SETTLE_S)
    end_s = time.time() - 1
    assert end_s < operator_gone_s + LOOKBACK_S  # operator 1's last samples still count

    # The run did what it is for: steps where no broker reported, and steps where no operator
    # reported the cluster.
    brokers_up = prometheus.query_range('sum(up{pod=~"broker-[ab]"})', first_s, recovered_s, 1)
    assert 0 in {float(v[1]) for s in brokers_up for v in s["values"]}, brokers_up
    steps_before = int(recovered_s - first_s) + 1
    prod = 'count(kafscale_operator_cluster_degraded{kafscale_cluster="prod"})'
    assert steps(prometheus, prod, first_s, recovered_s)["/"] < steps_before

    wrong: dict[str, Any] = {}  # every rule or query that is wrong, to see them all at once
    for alert in CHANGED_ALERTS:
        firing, removed = EXPECTED[alert]
        # True at every second through the gaps, never for the healthy cluster or broker...
        held = steps(prometheus, alerts[alert], first_s, recovered_s)
        if held.get(firing) != steps_before or set(held) - {firing, removed}:
            wrong[alert] = ("through the gaps", alerts[alert], held)
        # ...off once the deleted pod or cluster is gone, not held for the lookback...
        if removed is not None:
            was = steps(prometheus, alerts[alert], first_s, changed_s)
            held = steps(prometheus, alerts[alert], removed_s, end_s)
            if removed not in was or removed in held:
                wrong[f"{alert} after {removed} went"] = (alerts[alert], was, held)
        # ...and off once the recovery is scraped.
        held = steps(prometheus, alerts[alert], seen_s, end_s)
        if held:
            wrong[f"{alert} after the recovery"] = (alerts[alert], held)
    for alert in BRIDGED_ALERTS:
        all_steps = int(end_s - first_s) + 1
        held = steps(prometheus, alerts[alert], first_s, end_s)
        if held != {"prod/broker-a": all_steps, "prod/broker-b": all_steps}:
            wrong[alert] = (alerts[alert], held)

    # Rebalances over the run: the moving group's, counted across both coordinators; none
    # for the steady group, which moved too.
    window_s = int(end_s - coordinated_s)
    truth = targets.generation(end_s) - targets.generation(end_s - window_s)
    for query in documented_rebalance_queries(window_s):
        result = prometheus.query_range(query, end_s, end_s, 1)
        counted = {s["metric"]["group"]: float(s["values"][-1][1]) for s in result}
        if abs(counted.get("moving", 0) - truth) > 2 or counted.get("steady") != 0:
            wrong[query] = (counted, f"{truth} rebalances")
    assert not wrong, f"{steps_before} steps before the recovery:\n" + "\n".join(
        f"{name}: {what}" for name, what in wrong.items()
    )


def one(value: float) -> bool:
    return value == 1


def two(value: float) -> bool:
    return value == 2
