"""Which etcd versions a broker warns about at start: those known to lose acknowledged writes
when a member crashes (etcd-io/etcd#14370, #13766)."""

from __future__ import annotations

import pytest

from kafscale.broker.metadata.etcd_versions import durability_warning, parse_version

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("3.5.1", (3, 5, 1)),
        ("v3.5.17", (3, 5, 17)),
        ("3.6.0-rc.1", (3, 6, 0)),
        (" 3.4.23\n", (3, 4, 23)),
        ("", None),
        ("unknown", None),
        ("3.5", None),
    ],
)
def test_parse_version(text: str, parsed: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == parsed


@pytest.mark.parametrize("version", ["3.5.0", "3.5.1", "3.5.2"])
def test_3_5_0_to_3_5_2_have_both_bugs(version: str) -> None:
    warning = durability_warning(version)
    assert warning is not None
    assert f"etcd {version} " in warning
    assert "etcd-io/etcd#13766" in warning and "etcd-io/etcd#14370" in warning
    assert ">= 3.5.5" in warning
    assert "\n" not in warning  # one log line


@pytest.mark.parametrize("version", ["3.5.3", "3.5.4", "3.4.20", "3.4.0", "3.3.27", "v3.4.13"])
def test_releases_before_the_single_member_fix_have_14370_only(version: str) -> None:
    warning = durability_warning(version)
    assert warning is not None
    assert "etcd-io/etcd#14370" in warning and "#13766" not in warning


@pytest.mark.parametrize("version", ["3.5.5", "3.5.17", "3.4.21", "3.4.23", "3.6.0", "4.0.0"])
def test_fixed_releases_get_no_warning(version: str) -> None:
    assert durability_warning(version) is None


def test_an_unreadable_version_gets_no_warning() -> None:
    assert durability_warning("not-a-version") is None
