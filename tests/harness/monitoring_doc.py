"""The metrics docs/monitoring.md documents, read from its tables and its proxy paragraph.

Dashboards and alerts are written from that page, so tests compare it with what the processes
serve: the broker's and the operator's tables (``{name: type}``), and the names of the paragraph
on the proxy's metrics.
"""

from __future__ import annotations

import re
from pathlib import Path

MONITORING = Path(__file__).resolve().parents[2] / "docs" / "monitoring.md"
METRIC_NAME = re.compile(r"`(kafscale_\w+)")
# ``# TYPE <name> <type>`` lines name every family, with or without samples.
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)


def metrics_table(after: str) -> dict[str, str]:
    """``{name: type}`` from the first table after the line starting with ``after`` (a row's
    first cell may name several metrics of one type)."""
    lines = MONITORING.read_text().split(f"\n{after}", 1)[1].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    documented: dict[str, str] = {}
    for row in lines[start:]:
        if not row.startswith("|"):
            break
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        documented |= dict.fromkeys(METRIC_NAME.findall(cells[0]), cells[1])
    return documented


def proxy_metric_names() -> set[str]:
    """The names of the paragraph on the proxy's metrics (``Proxy: ...``)."""
    text = MONITORING.read_text()
    return set(METRIC_NAME.findall(text.split("\nProxy:", 1)[1].split("\n\n", 1)[0]))


def served_families(
    exposition: str, skip_prefixes: tuple[str, ...] = ("process_",)
) -> dict[str, str]:
    """``{name: type}`` of the families of a ``/metrics`` page, but the process's own."""
    return {
        name: kind
        for name, kind in TYPE_LINE.findall(exposition)
        if not name.startswith(skip_prefixes)
    }
