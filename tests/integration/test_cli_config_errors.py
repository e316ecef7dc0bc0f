"""A misspelt or invalid setting stops every command at once with one line on stderr that names
the variable or flag typed and, for a misspelling, the one meant; exit status 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import children
from harness.children import child_env

from kafscale.broker.child_process import KAFSCALE

pytestmark = pytest.mark.integration


def run_kafscale(args: list[str], variables: dict[str, str], home: Path) -> list[str]:
    """``kafscale ARGS`` with only ``variables`` of the KAFSCALE_* kind; its stderr lines."""
    env = child_env(
        {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "KAFSCALE_"))}
    )
    env |= {"HOME": str(home), **variables}
    done = children.run(
        [KAFSCALE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2, done.stderr
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_a_variable_with_one_underscore_for_two_is_refused_not_ignored(tmp_path: Path) -> None:
    """Ignored, the broker went on to the default etcd and object store and failed on those."""
    lines = run_kafscale(
        ["broker", "--storage-kind", "local", "--storage-local-dir", str(tmp_path)],
        {"KAFSCALE_ETCD_ENDPOINTS": '["http://etcd.example:2379"]'},
        tmp_path,
    )
    assert lines == [
        "kafscale: invalid configuration: KAFSCALE_ETCD_ENDPOINTS is not a setting; "
        "did you mean KAFSCALE_ETCD__ENDPOINTS?"
    ]


def test_a_misspelt_setting_of_a_section_is_one_line(tmp_path: Path) -> None:
    lines = run_kafscale(
        ["local", "--data-dir", str(tmp_path / "data")], {"KAFSCALE_STORAGE__BUCKT": "b"}, tmp_path
    )
    assert lines == [
        "kafscale: invalid configuration: storage.buckt (KAFSCALE_STORAGE__BUCKT or "
        "--storage-buckt) is not a setting; did you mean KAFSCALE_STORAGE__BUCKET?"
    ]


@pytest.mark.parametrize("command", ["broker", "proxy", "status"])
def test_a_bad_value_is_one_line_naming_the_flag(command: str, tmp_path: Path) -> None:
    lines = run_kafscale([command, "--listener-port", "abc"], {}, tmp_path)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "kafscale: invalid configuration: listener.port (KAFSCALE_LISTENER__PORT or "
        "--listener-port): "
    )
    assert lines[0].endswith("(given 'abc')")
