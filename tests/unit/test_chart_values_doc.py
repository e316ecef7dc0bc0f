"""Every value of the Helm chart is documented, with its default, and no other.

docs/operations-kubernetes.md has the chart's values table and docs/monitoring.md the
``monitoring.*`` ones. A value added to ``values.yaml`` without a line there is a setting
nobody finds; a documented one that was renamed or dropped fails ``helm install`` (the values
schema refuses unknown keys); a default that moved misleads. Each table's first column names
values (``a.b`` / ``.c`` is ``a.c``; a header ``value (`prefix.*`)`` makes names relative to
``prefix``; ``x.*`` only points elsewhere); the second gives defaults, checked where they are
literal (backticked, or a number or duration).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "charts" / "kafscale" / "values.yaml"
PAGES = [REPO / "docs" / "operations-kubernetes.md", REPO / "docs" / "monitoring.md"]
HEADER = re.compile(r"^\s*\| value(?: \(`([\w.]+)\.\*`\))? \| default \|")
SEPARATOR = re.compile(r" / |, ")


def leaves(values: dict[str, Any], parent: str = "") -> dict[str, Any]:
    """``{dotted path: default}`` of every value a user sets (a non-empty map is not one)."""
    found: dict[str, Any] = {}
    for key, value in values.items():
        path = f"{parent}{key}"
        if isinstance(value, dict) and value:
            found |= leaves(value, f"{path}.")
        else:
            found[path] = value
    return found


def value_names(cell: str, prefix: str) -> list[str]:
    """The values a table row's first cell names (``x.*`` pointers left out)."""
    names: list[str] = []
    for token in re.findall(r"`([\w.*]+)`", cell):
        if token.startswith(".") and names:
            token = names[-1].rsplit(".", 1)[0] + token
        elif prefix and not token.startswith(f"{prefix}."):
            token = f"{prefix}.{token}"
        names.append(token)
    return [name for name in names if not name.endswith(".*")]


def literal(item: str) -> tuple[bool, Any]:
    """``(True, value)`` for a default written as a literal, else ``(False, None)``."""
    quoted = re.match(r"^`([^`]*)`", item.strip())
    if quoted:
        return True, yaml.safe_load(quoted.group(1))
    if re.fullmatch(r"\d[\w.]*", item.strip()):
        return True, yaml.safe_load(item.strip())
    return False, None


def documented(text: str) -> dict[str, tuple[bool, Any]]:
    """``{value: (literal?, default)}`` from every value table of a page."""
    found: dict[str, tuple[bool, Any]] = {}
    prefix: str | None = None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            prefix = header.group(1) or ""
            continue
        if prefix is None or not line.strip().startswith("|"):
            prefix = None
            continue
        cells = [cell.strip() for cell in line.strip().split("|")[1:-1]]
        names = value_names(cells[0], prefix)
        defaults = SEPARATOR.split(cells[1])
        defaults = defaults * len(names) if len(defaults) == 1 else defaults
        if len(defaults) != len(names):
            defaults = ["(in words)"] * len(names)
        found |= {name: literal(default) for name, default in zip(names, defaults, strict=True)}
    return found


def all_documented() -> dict[str, tuple[bool, Any]]:
    found: dict[str, tuple[bool, Any]] = {}
    for page in PAGES:
        found |= documented(page.read_text())
    return found


def covered(path: str, names: set[str]) -> bool:
    parts = path.split(".")
    return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1))


def test_value_names_expand_relative_names_and_prefixes() -> None:
    cell = "`serviceAccount.create` / `.name` / `.annotations`"
    assert value_names(cell, "") == [
        "serviceAccount.create",
        "serviceAccount.name",
        "serviceAccount.annotations",
    ]
    assert value_names("`lagWindow`", "monitoring.prometheusRule") == [
        "monitoring.prometheusRule.lagWindow"
    ]
    assert value_names("`monitoring.podMonitor.*`", "") == []


def test_documented_reads_defaults_where_they_are_literal() -> None:
    text = (
        "| value | default | meaning |\n|---|---|---|\n"
        "| `a` / `b` | `x` / in words | m |\n| `c`, `d` | `{}` | m |\n| `e` | 15m | m |\n\nafter\n"
        "| `f` | `1` | not a value table |\n"
    )
    assert documented(text) == {
        "a": (True, "x"),
        "b": (False, None),
        "c": (True, {}),
        "d": (True, {}),
        "e": (True, "15m"),
    }


def test_every_chart_value_is_documented() -> None:
    names = set(all_documented())
    missing = [
        path for path in leaves(yaml.safe_load(VALUES.read_text())) if not covered(path, names)
    ]
    assert missing == []


def test_every_documented_chart_value_exists_with_its_default() -> None:
    values = yaml.safe_load(VALUES.read_text())
    chart_paths = leaves(values)
    wrong = []
    for name, (is_literal, default) in all_documented().items():
        node: Any = values
        for part in name.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            wrong.append(f"{name}: not a value of the chart")
        elif is_literal and name in chart_paths and chart_paths[name] != default:
            wrong.append(f"{name}: documented {default!r}, values.yaml {chart_paths[name]!r}")
    assert wrong == []
