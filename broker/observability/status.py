"""``kafscale status``: the cluster at a glance (like ``rpk cluster info``).

Brokers, partition owners and high watermarks, and every consumer group's committed offsets
and lag are read from etcd in one range read (a consistent snapshot); each broker's readiness,
draining, owned partitions and connections come from its admin port's ``/metrics`` (open on
every broker, unlike ``/status``). A broker whose admin port does not answer is shown as
unreachable, not left out. Reading and rendering are apart: ``render`` is a pure function of a
``ClusterStatus``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kafscale.broker.groups.store import decode_offset, parse_group_key
from kafscale.broker.metadata import keys
from kafscale.broker.metadata.cluster import ClusterView
from kafscale.broker.metadata.etcd import Etcd
from kafscale.broker.observability.lag import consumer_lag
from kafscale.broker.protocol.errors import UnreadableRecord

Scrape = Callable[[str], dict[str, float]]


@dataclass(frozen=True, slots=True)
class BrokerRow:
    node_id: int
    address: str
    rack: str | None
    admin: str | None
    state: str  # ready, starting, draining, unreachable, unknown (no admin port registered)
    owned_partitions: int | None
    connections: int | None


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    owner: int | None
    leader_epoch: int
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class LagRow:
    group: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int
    lag: int


@dataclass
class ClusterStatus:
    cluster: str
    brokers: list[BrokerRow] = field(default_factory=list)
    partitions: list[PartitionRow] = field(default_factory=list)
    lag: list[LagRow] = field(default_factory=list)

    @property
    def without_owner(self) -> int:
        return sum(1 for p in self.partitions if p.owner is None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


async def read_status(etcd: Etcd, cluster: str, scrape: Scrape) -> ClusterStatus:
    entries = await etcd.get_prefix(keys.cluster_prefix(cluster))
    view = ClusterView(etcd, cluster)
    for entry in entries:
        view.apply_put(entry.key, entry.value)
    status = ClusterStatus(cluster)
    status.brokers = [
        _broker_row(info.node_id, info.host, info.port, info.rack, info.admin_port, view, scrape)
        for info in sorted(view.brokers.values(), key=lambda b: b.node_id)
    ]
    for topic, partition in sorted(view.partitions()):
        state = view.states.get((topic, partition))
        status.partitions.append(
            PartitionRow(
                topic,
                partition,
                view.owners.get((topic, partition)),
                state.leader_epoch if state else 0,
                state.high_watermark if state else 0,
                state.log_start_offset if state else 0,
            )
        )
    committed: dict[str, dict[tuple[str, int], int]] = {}
    for entry in entries:
        if not entry.key.startswith(keys.groups_prefix(cluster)):
            continue
        parsed = parse_group_key(cluster, entry.key)
        if parsed is None or parsed[1] is None:
            continue
        group, tp = parsed[0], parsed[1]
        try:
            offset = decode_offset(entry.value, entry.key)
        except UnreadableRecord:
            continue  # one corrupt value: no lag row for it, the status of the rest
        info = view.topics.get(tp[0])
        if info is not None and offset.still_valid(info.topic_id):
            committed.setdefault(group, {})[tp] = offset.offset
    watermarks = {(p.topic, p.partition): p.high_watermark for p in status.partitions}
    status.lag = [
        LagRow(e.group, e.topic, e.partition, e.committed_offset, e.high_watermark, e.lag)
        for e in consumer_lag(sorted(committed.items()), watermarks)
    ]
    return status


def _broker_row(
    node_id: int,
    host: str,
    port: int,
    rack: str | None,
    admin_port: int | None,
    view: ClusterView,
    scrape: Scrape,
) -> BrokerRow:
    if admin_port is None:
        return BrokerRow(node_id, f"{host}:{port}", rack, None, "unknown", None, None)
    admin = f"{host}:{admin_port}"
    try:
        metrics = scrape(f"http://{admin}/metrics")
    except OSError:
        return BrokerRow(node_id, f"{host}:{port}", rack, admin, "unreachable", None, None)
    return BrokerRow(
        node_id,
        f"{host}:{port}",
        rack,
        admin,
        broker_state(metrics, node_id in view.draining),
        int(metrics.get("kafscale_owned_partitions", 0)),
        int(metrics.get("kafscale_connections", 0)),
    )


def broker_state(metrics: dict[str, float], marked_draining: bool) -> str:
    if marked_draining or metrics.get("kafscale_broker_draining", 0) == 1:
        return "draining"
    return "ready" if metrics.get("kafscale_broker_ready", 0) == 1 else "starting"


def scrape_metrics(url: str, timeout_s: float = 3.0) -> dict[str, float]:
    """The unlabelled samples of a ``/metrics`` page (raises OSError when it cannot be read)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def render(status: ClusterStatus) -> str:
    """The human-readable report: cluster summary, brokers, partitions, groups and lag."""
    topics = {p.topic for p in status.partitions}
    lines = [
        "CLUSTER",
        "=======",
        f"{status.cluster}: {len(status.brokers)} brokers, {len(topics)} topics, "
        f"{len(status.partitions)} partitions ({status.without_owner} without owner)",
        "",
        "BROKERS",
        "=======",
    ]
    lines += _table(
        ("ID", "ADDRESS", "RACK", "ADMIN", "STATE", "OWNED", "CONNECTIONS"),
        [
            (b.node_id, b.address, b.rack, b.admin, b.state, b.owned_partitions, b.connections)
            for b in status.brokers
        ],
    )
    lines += ["", "PARTITIONS", "=========="]
    lines += _table(
        ("TOPIC", "PARTITION", "OWNER", "EPOCH", "LOG-START", "HIGH-WATERMARK"),
        [
            (p.topic, p.partition, p.owner, p.leader_epoch, p.log_start_offset, p.high_watermark)
            for p in status.partitions
        ],
    )
    lines += ["", "GROUPS", "======"]
    totals: dict[str, int] = {}
    for row in status.lag:
        totals[row.group] = totals.get(row.group, 0) + row.lag
    lines += _table(("GROUP", "TOTAL-LAG"), sorted(totals.items()))
    lines += [""]
    lines += _table(
        ("GROUP", "TOPIC", "PARTITION", "COMMITTED", "HIGH-WATERMARK", "LAG"),
        [
            (r.group, r.topic, r.partition, r.committed_offset, r.high_watermark, r.lag)
            for r in status.lag
        ],
    )
    return "\n".join(lines) + "\n"


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    cells = [header] + [tuple("-" if v is None else str(v) for v in row) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
