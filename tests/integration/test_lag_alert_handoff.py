"""``KafScaleConsumerLagGrowing`` survives a group's lag series moving between brokers.

A group's ``kafscale_consumer_group_lag`` series are on one broker at a time (its coordinator,
or FindCoordinator's pick), so a coordinator change moves them to another Prometheus target
(another ``pod`` and ``instance``), and a hand-off can leave a scrape or two where no broker,
or two brokers, report them (docs/monitoring.md, "Consumer lag of every group"). Two real
HTTP /metrics endpoints stand in for two brokers and hand three groups' series over: A → B
through a gap, then B → A through an overlap. A real Prometheus scrapes both and evaluates the
chart's rules (rendered by helm, with a short window); the alert's expression, evaluated at
every second of the run through the HTTP API, must be true throughout for a lag that grows
above the threshold, and never for a flat lag or a growing one below the threshold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from harness.prometheus import Prometheus, chart_rule_groups, serve_metrics

pytestmark = pytest.mark.integration

WINDOW_S = 10  # lagWindow: lag must have grown over this long (10 one-second scrapes)
LOOKBACK_S = 10  # lagHandoffLookback: carries a series across a hand-off's gap
HANDOFF_S = 3  # seconds of gap (no broker reports) and of overlap (two do), once seen
THRESHOLD = 1000
# group -> (lag of each of its two partitions at the start, growth per second): the alert sums
# them per topic; "below" stays under the threshold (< 2 x 400) unless a broker is counted twice
GROUPS = {"growing": (2000.0, 10.0), "flat": (1500.0, 0.0), "below": (300.0, 1.0)}


@dataclass
class Handoff:
    """Which brokers report the groups' lag now; the lag itself follows the wall clock."""

    started_s: float = field(default_factory=time.time)
    reporters: set[str] = field(default_factory=lambda: {"a"})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def page(self, broker: str) -> bytes:
        with self.lock:
            reporting = broker in self.reporters
        lines = ["# TYPE kafscale_consumer_group_lag gauge"]
        elapsed_s = time.time() - self.started_s
        for group, (base, per_s) in GROUPS.items():
            for partition in (0, 1):
                if reporting:
                    labels = f'group="{group}",topic="orders",partition="{partition}"'
                    lines.append(
                        f"kafscale_consumer_group_lag{{{labels}}} {base + per_s * elapsed_s}"
                    )
        return ("\n".join(lines) + "\n").encode()

    def report_from(self, *brokers: str) -> None:
        with self.lock:
            self.reporters = set(brokers)


@pytest.fixture
def brokers() -> Iterator[tuple[Handoff, dict[str, ThreadingHTTPServer]]]:
    handoff = Handoff()
    servers = {name: serve_metrics(lambda n=name: handoff.page(n)) for name in ("a", "b")}
    try:
        yield handoff, servers
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def lag_rules() -> tuple[list[dict[str, Any]], str]:
    """The chart's rule groups (window shortened for the test) and the lag alert's expression."""
    groups = chart_rule_groups(
        f"monitoring.prometheusRule.lagThreshold={THRESHOLD}",
        f"monitoring.prometheusRule.lagWindow={WINDOW_S}s",
        f"monitoring.prometheusRule.lagHandoffLookback={LOOKBACK_S}s",
    )
    rules = [rule for group in groups for rule in group["rules"]]
    alert = next(r for r in rules if r.get("alert") == "KafScaleConsumerLagGrowing")
    return groups, str(alert["expr"])


def steps_true(prometheus: Prometheus, expr: str, group: str, start_s: float, end_s: float) -> int:
    """At how many one-second steps from ``start_s`` to ``end_s`` ``expr`` holds for ``group``."""
    result = prometheus.query_range(expr, start_s, end_s, 1)
    return sum(len(s["values"]) for s in result if s["metric"].get("group") == group)


def test_lag_alert_holds_across_a_handoff_and_stays_off_for_flat_lag(
    brokers: tuple[Handoff, dict[str, ThreadingHTTPServer]],
    prometheus_server: Callable[..., Prometheus],
) -> None:
    handoff, servers = brokers
    groups, expr = lag_rules()
    targets = {f"127.0.0.1:{server.server_port}": name for name, server in servers.items()}
    prometheus = prometheus_server(
        list(targets),
        {"namespace": "ops", "kafscale_cluster": "prod"},
        per_target={target: {"pod": f"prod-broker-{name}"} for target, name in targets.items()},
        rule_groups=groups,
    )
    prometheus.wait_scraping()
    on_a = time.time()
    time.sleep(WINDOW_S + 5)  # the window fills with broker a's samples
    growing = 'kafscale_consumer_group_lag{group="growing",partition="0"}'
    handoff.report_from()  # a lets the groups go; b has not picked them up yet
    prometheus.wait_value(f"absent({growing})", lambda value: value == 1)
    time.sleep(HANDOFF_S)  # a gap of a few scrapes, as Prometheus saw it
    handoff.report_from("b")
    time.sleep(WINDOW_S / 2)
    handoff.report_from("a", "b")  # a took them back; b still reports its old pick
    prometheus.wait_value(f"count({growing})", lambda value: value == 2)
    time.sleep(HANDOFF_S)  # an overlap of a few scrapes
    handoff.report_from("a")
    time.sleep(WINDOW_S / 2)
    start_s, end_s = on_a + WINDOW_S + 3, time.time() - 2
    steps = int(end_s - start_s) + 1

    # The run did what it is for: the series moved, with steps where none and two reported.
    counts = [
        int(v[1])
        for s in prometheus.query_range(f"count({growing})", start_s, end_s, 1)
        for v in s["values"]
    ]
    assert 2 in counts and len(counts) < steps, counts
    seen = 'count by (pod) (last_over_time(kafscale_consumer_group_lag{group="growing"}[5m]))'
    assert len(prometheus.query(seen)) == 2

    # Growing above the threshold: true at every step; flat, or below it: at none.
    held = {group: steps_true(prometheus, expr, group, start_s, end_s) for group in GROUPS}
    assert held == {"growing": steps, "flat": 0, "below": 0}, expr
