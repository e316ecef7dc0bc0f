"""The Kafka API tables in README.md and docs/kafka-api.md give every API of
``broker/api/served.py`` with exactly its versions.

Clients pin versions, so a reader checking whether theirs is served must find each API with
the range the broker has. README gives the versions served; docs/kafka-api.md the versions
ApiVersions advertises (one API advertises a wider range than it serves: SaslHandshake).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from harness import children

from kafscale.broker.api.envelope import ENVELOPE_VERSION
from kafscale.broker.api.served import SERVED, SERVED_APIS
from kafscale.broker.api.table import API_TABLE

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
# Not in the table: the proxy's Envelope (never advertised), DescribeQuorum (not served).
DASH = "\u2013"  # ranges are written with an en dash: 0\u201312 reads as 0-12
OUTSIDE = {"Envelope": (ENVELOPE_VERSION, ENVELOPE_VERSION)}
NAMES_AND_VERSIONS = re.compile(r"([A-Z][A-Za-z]+(?: / [A-Z][A-Za-z]+)*) (\d+(?:\u2013\d+)?)\b")


def _range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}{DASH}{high}"


def _served() -> dict[str, str]:
    found = {s.name: _range(s.min_version, s.max_version) for s in SERVED}
    return found | {name: _range(*pair) for name, pair in OUTSIDE.items()}


def _advertised() -> dict[str, str]:
    found = {s.name: _range(*s.advertised_range) for s in SERVED}
    return found | {name: _range(*pair) for name, pair in OUTSIDE.items()}


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


def test_readme_lists_every_api_with_the_versions_served() -> None:
    section = _section((REPO / "README.md").read_text(), "## Kafka API support")
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    listed: dict[str, str] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if cells[0] == "Not served":
            continue
        for match in NAMES_AND_VERSIONS.finditer(cells[1]):
            for name in match.group(1).split(" / "):
                listed[name] = match.group(2)
    assert listed == _served()


def test_kafka_api_page_lists_every_api_with_the_versions_advertised() -> None:
    text = (REPO / "docs" / "kafka-api.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    listed: dict[str, str] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[1:-1]]
        if cells[1] == "—":
            continue  # not served
        names = [name.strip() for name in cells[0].split(" / ")]
        versions = [version.strip() for version in cells[1].split(" / ")]
        versions = versions * len(names) if len(versions) == 1 else versions
        assert len(versions) == len(names), row
        listed |= dict(zip(names, versions, strict=True))
    assert listed == _advertised()


def test_the_broker_has_a_handler_for_exactly_the_apis_served() -> None:
    """``api/served.py`` is what ApiVersions advertises, on brokers and the proxy; the broker's
    table pairs each of those with its handler, and nothing else."""
    assert len(SERVED_APIS) == len(SERVED)  # no key twice
    assert set(API_TABLE) == set(SERVED_APIS)
    assert all(spec.api is SERVED_APIS[key] for key, spec in API_TABLE.items())


def test_the_served_ranges_load_no_request_handler() -> None:
    """The module both the brokers and the proxy take the served ranges from imports no
    handler module (it is what lets the proxy answer ApiVersions without the broker's
    handlers): checked in a fresh interpreter, whose ``sys.modules`` nothing else filled."""
    code = (
        "import sys, kafscale.broker.api.served; "
        "print(' '.join(m for m in sys.modules if m.startswith('kafscale.broker.api.')))"
    )
    loaded = children.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()
    assert sorted(loaded) == ["kafscale.broker.api.features", "kafscale.broker.api.served"]
